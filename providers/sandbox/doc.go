// Package sandbox is a local imitation of the delivery providers' HTTP APIs, so that the real vendor SDKs
// (twilio-go, sendgrid-go) and the FCM and webhook clients run end to end against loopback in tests,
// demos and load runs.
//
// Twilio is described below. SendGrid's Mail Send and its signed Event Webhook are described on
// sendgridRoutes (sendgrid.go), FCM HTTP v1 with its OAuth2 token endpoint in fcm.go, the HMAC-checking
// webhook receiver in webhook.go, and Twilio's signed status callbacks (with the magic numbers
// +905550030001/30003/30005/30006/30007 that end undelivered or failed) in receipts.go.
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
// # Control API
//
//	GET  /_sandbox/messages[?to=+90...]  accepted messages, in order (JSON array)
//	GET  /_sandbox/stats                 Stats as JSON
//	GET  /_sandbox/faults                the current Faults
//	POST /_sandbox/faults                replace the Faults (JSON body)
//	POST /_sandbox/reset                 clear the message log, the stats and the rate buckets
//	GET  /_sandbox/receipts/stats        ReceiptStats as JSON (the status callbacks sent, failed, ...)
//	GET  /_sandbox/receipts              the current ReceiptSettings
//	POST /_sandbox/receipts              change them: {"delay_ms":50} or {"off":true}, for what is accepted next
//
// The sandbox never logs credentials or bodies, and masks phone numbers in its logs with
// providers.MaskAddress (+905*****4567).
package sandbox
