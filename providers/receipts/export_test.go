package receipts

import "time"

// In-flight room of each handler, in maximum-size bodies.
const (
	TwilioInFlight   = twilioInFlight
	SendGridInFlight = sendgridInFlight
)

// SetTimings sets how long h waits for room for a body, and the grace a body gets before its pace counts.
func SetTimings(h *Handler, busyWait, bodyGrace time.Duration) {
	h.limits.busyWait = busyWait
	h.limits.bodyGrace = bodyGrace
}
