// Package sandbox is a local imitation of the delivery providers' HTTP APIs, so that the real vendor SDKs
// (twilio-go, sendgrid-go) and the FCM and webhook clients run end to end against loopback in tests,
// demos and load runs.
//
// Twilio is described below. SendGrid's Mail Send and its signed Event Webhook are described on
// sendgridRoutes (sendgrid.go), FCM HTTP v1 with its OAuth2 token endpoint in fcm.go, the HMAC-checking
// webhook receiver in webhook.go, an unsigned JSON postback receiver for another sender run against
// the same stand-in in postback.go, and Twilio's signed status callbacks (with the magic numbers
// +905550030001/30003/30005/30006/30007 that end undelivered or failed) in receipts.go, Netgsm's report API
// (with the magic report numbers +9055501SSNNN, whose status is SS) in netgsm_report.go. The recipients'
// refusals that come back through the providers are made up on demand: SendGrid's unsubscribe,
// group_unsubscribe and spamreport events in sendgrid_refusals.go, and Twilio's incoming SMS (an answer
// of RET or IPTAL), posted to Options.TwilioInboundURL, in twilio_inbound.go.
//
// A *Server is an http.Handler. Mount it with httptest.NewServer in tests or serve it with
// ListenAndServe. Each vendor lives in its own file and registers its own routes; the control and
// inspection API under /_sandbox/ is shared.
//
// # Twilio
//
// POST /2010-04-01/Accounts/{AccountSid}/Messages.json answers like Twilio's Messages API: HTTP Basic
// auth whose username equals the path SID (401, code 20003, otherwise), form fields To, From or
// MessagingServiceSid, and Body, and on success a 201 with Twilio's JSON message resource, status
// "queued" and num_segments as a string computed with providers.SMSSegments. Validation errors use
// Twilio's codes: 21604 To missing, 21211 To not E.164, 21603 neither From nor MessagingServiceSid, 21602
// Body missing, 21617 Body over 1600 characters. Every error is a JSON body
// {"code","message","more_info","status"}, except the injected raw 503.
//
// Magic recipients produce Twilio's permanent errors: a To of the form +9055500NNNNN, where NNNNN is one
// of the codes below, is answered with HTTP 400 and that code (the message names the number, as
// Twilio's does):
//
//	+905550021211  21211  invalid 'To' number
//	+905550021408  21408  region not enabled (geo permissions)
//	+905550021606  21606  'From' cannot send to this destination
//	+905550021608  21608  unverified number on a trial account
//	+905550021610  21610  recipient opted out (replied STOP)
//	+905550021614  21614  not a mobile number
//	+905550021635  21635  landline
//
// Any other +9055500NNNNN number is accepted like a normal one.
//
// # Faults and limits
//
// Options.Faults (or POST /_sandbox/faults) injects, per request and with the given probability, a 429
// (code 20429, Retry-After: 1), a JSON 500 or 503, an HTML 503 that twilio-go cannot decode, a timeout
// (the message is accepted and recorded, then the connection hangs until the client gives up: the
// ambiguous case), or a reset (the request is read, then the TCP connection is closed without an answer
// and nothing is recorded). Options.TwilioRate caps each account's requests per second on the server
// side and answers the excess with real 429s. Options.Latency delays every provider request.
//
// A request is checked in Twilio's order: authentication, the account's rate, then injected faults, then
// validation and the magic numbers. So faults hit only authenticated, in-rate traffic, and the timeout
// fault hangs only messages that would have been accepted (an invalid one gets its 400).
//
// # Pushback: hidden limits, outages and the timeline
//
// For testing how a sender keeps going when a provider pushes back, every API (twilio, netgsm, sendgrid,
// fcm, webhook) can have, from Options or at runtime:
//
//   - A hidden rate limit (Limit.Rate, --limit twilio=800): at most R requests in any one second, a
//     sliding window on the sandbox's clock over all connections and credentials together. A request over
//     it gets the provider's own 429 and no Retry-After, and is not recorded: Twilio's
//     {"code":20429,"message":"Too Many Requests",...}; SendGrid's documented 429 with X-RateLimit-Limit,
//     X-RateLimit-Remaining 0 and X-RateLimit-Reset (the Unix second a place frees) and the body
//     {"errors":[{"field":null,"message":"too many requests"}]}; FCM's 429 RESOURCE_EXHAUSTED with
//     QUOTA_EXCEEDED; the webhook receiver's 429 {"error":"too many requests"}; Netgsm's code 80 in a
//     200, as Netgsm says it. Refused requests do not count; each one that passes does, whatever comes
//     next (an injected fault, a 400).
//   - A hidden concurrency limit (Limit.Concurrency, --limit-concurrency twilio=100): at most N requests
//     in flight, counted from arrival to answer (the latency and the timeout fault's hang included); the
//     excess is refused at once, the same way. Twilio's 20429 is this limit.
//   - Twilio only, a segment limit (Limit.Segments, --limit-segments twilio=1000): at most S SMS
//     segments in any one second, counting each valid message's Body as num_segments does (Twilio's MPS
//     counts segments). A message longer than S passes only into an empty second.
//   - Outage windows (OutagePlan, --outage twilio=20s@10s/503): from a time, or a delay after now, for a
//     duration (or until stopped), every request to the API fails as the mode says: 503 (the
//     provider's JSON 503, no Retry-After), raw_503 (an HTML 503), reset (a TCP reset once the request is
//     read) or hang (no answer until the client gives up); nothing is recorded, then the API recovers
//     by itself. The windows, with what each refused, are in Stats.Outages and GET /_sandbox/outages. A
//     refused connection cannot be imitated for one API of a shared listener: reset is the nearest, and
//     a client sees its request written.
//
// The checks of a request run in this order: an outage and the concurrency limit at the door (before
// the latency, and the outage again after it), authentication, the per-account cap (TwilioRate,
// SendGridRate, FCMRate), the hidden rate limit, the body, injected faults, validation and the magic
// recipients, Twilio's segment limit, acceptance. So injected faults combine with the limits: they hit
// what the limits let through.
//
// GET /_sandbox/timeline (Timeline) counts per second of the sandbox's clock what became of the
// requests of each API: accepted, hung, refused by reason (limit, concurrency, segments, outage, rate,
// fault_429, fault_500, fault_503, fault_raw_503, fault_reset, request) and gone (the client left during
// the latency), with the messages and segments recorded. Each request counts once, in the second it
// was stamped: when it passed the hidden rate limit if its API has one, so that no second shows more
// accepted than the limit. The seconds add up to the totals, and the totals to Stats.Requests.
//
// # Control API
//
//	GET  /_sandbox/messages[?to=+90...]  accepted messages, in order (JSON array)
//	GET  /_sandbox/stats                 Stats as JSON
//	GET  /_sandbox/faults                the current Faults
//	POST /_sandbox/faults                replace the Faults (JSON body)
//	POST /_sandbox/reset                 clear the message log, the stats, the timeline and the rate buckets
//	GET  /_sandbox/limits                every API's Limit: {"twilio":{"rate":800,"concurrency":0,"segments":0},...}
//	POST /_sandbox/limits                {"only":"twilio","rate":800,"concurrency":50,"segments":0}: replace the
//	                                     named APIs' limits (only: comma-separated, empty for all; 0: none)
//	GET  /_sandbox/outages               the outage windows, scheduled, active and over ([]OutageWindow)
//	POST /_sandbox/outages               {"only":"twilio","mode":"503","start":"2026-03-02T10:00:00Z","after_ms":0,
//	                                     "duration_ms":20000}: open a window per API (no start: after_ms from now;
//	                                     no duration: until stopped); answers the windows made
//	POST /_sandbox/outages/stop          {"only":"twilio"}, or no body for all: end the active windows now and
//	                                     cancel those not begun
//	GET  /_sandbox/timeline              Timeline; ?api=twilio,sendgrid sums those APIs only, ?since= (Unix
//	                                     seconds or RFC 3339) leaves out the seconds before
//	GET  /_sandbox/receipts/stats        ReceiptStats as JSON (the status callbacks sent, failed, ...)
//	GET  /_sandbox/receipts              the current ReceiptSettings
//	POST /_sandbox/receipts              change them: {"delay_ms":50} or {"off":true}, for what is accepted next
//	POST /_sandbox/sendgrid/events       {"event":"unsubscribe","email":"a@example.com","campaign_id":"1","user_id":"u1"}:
//	                                     post now, signed, to Options.SendGridEventURL a recipient's unsubscribe,
//	                                     group_unsubscribe or spamreport event (without campaign_id and user_id, the
//	                                     custom args of the last message to that address); answers SendGridEventResult
//	POST /_sandbox/twilio/inbound        {"from":"+905321234567","to":"+908501234567","body":"RET"}: post now, signed
//	                                     with Options.TwilioAuthToken, to Options.TwilioInboundURL the incoming SMS
//	                                     (no "to": the sender of the last SMS to "from"); answers TwilioInboundResult
//
// The last two post once, at once, and answer 200 with the receiver's status inside whenever it
// answered, 502 when it did not, 400 for a request that cannot be posted and 409 when the URL (or, for
// Twilio, the auth token) is missing.
//
// # İYS
//
// The İYS consent registry's API, with its own token, rate, faults and stats (IYSStats, not Stats),
// is described in iys.go and, for adding consents, iys_add.go:
//
//	POST /oauth2/token                                         password and refresh_token grants
//	POST /sps/{iysCode}/brands/{brandCode}/consents/status     one consent
//	POST /sps/{iysCode}/brands/{brandCode}/consents/{recipientType}/status/{type}   which are ONAY
//	GET  /sps/{iysCode}/brands/{brandCode}/consents/changes    the consent-changes pull
//	POST /v2/sps/{iysCode}/brands/{brandCode}/consents         add one consent (V2: idempotent)
//	POST /v2/sps/{iysCode}/brands/{brandCode}/consents/request asynchronous batch add, up to 1000
//	GET  /v2/sps/{iysCode}/brands/{brandCode}/consents/request/{requestId}   the batch's result
//	                                                           (the three adds also without /v2: V1)
//	POST /_sandbox/iys/consents, GET /_sandbox/iys/consents    act as a citizen; the current consents
//	GET  /_sandbox/iys/stats                                   IYSStats (adds received, accepted, refused...)
//	GET  /_sandbox/iys/faults, POST /_sandbox/iys/faults       injected İYS faults
//	GET  /_sandbox/iys/settings, POST /_sandbox/iys/settings   IYSSettings: {"batch_delay_ms":200,
//	                                                           "batch_enqueue_ms":0}, how long a batch's
//	                                                           result stays empty, then half "enqueue"
//	POST /_sandbox/iys/tokens/expire, /_sandbox/iys/tokens/revoke, /_sandbox/iys/reset
//
// The sandbox never logs credentials or bodies, and masks phone numbers in its logs with
// providers.MaskAddress (+905*****4567).
package sandbox
