package sandbox

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/campaignctl/campaignctl/providers"
)

// The FCM fake imitates Firebase Cloud Messaging's HTTP v1 API and Google's OAuth2 token endpoint:
//
//	POST /token                                  JWT-bearer grant → {"access_token","token_type","expires_in"}
//	POST /v1/projects/{project}/messages:send    send one message (also without /v1, as the Admin SDK's
//	POST /projects/{project}/messages:send       custom endpoint produces)
//	GET  /_sandbox/fcm/stats                     FCMStats as JSON
//	POST /_sandbox/fcm/revoke                    forget every access token issued (sends then get 401)
//	POST /_sandbox/fcm/reset                     clear FCMStats, WebhookStats and the FCM rate buckets
//
// A send must carry "Authorization: Bearer <token>" with a token /token issued and not yet expired
// (401 UNAUTHENTICATED otherwise). Checks come in this order: authentication, the project's rate
// (Options.FCMRate, a real token bucket: 429 QUOTA_EXCEEDED with Retry-After), injected faults, then
// validation and the magic tokens. Validation follows FCM: a "message" with exactly one of token, topic
// or condition; data values are strings and no data key is reserved ("from", "message_type", anything
// starting with "google" or "gcm"); the payload (notification title, body and image, data keys and
// values) is at most 4096 bytes, 2048 for a topic; a token is printable ASCII without spaces, at most 4096
// bytes. Every failure is 400 INVALID_ARGUMENT. A message with "validate_only": true is checked and
// answered but not recorded.
//
// Errors use Google's JSON shape with the FcmError detail the Admin SDK and providers/push read:
//
//	{"error":{"code":404,"message":"Requested entity was not found.","status":"NOT_FOUND",
//	  "details":[{"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"UNREGISTERED"}]}}
//
// Magic device tokens draw each FCM error (the token is refused, nothing is recorded):
//
//	unregistered-...  404 NOT_FOUND           UNREGISTERED
//	invalid-...       400 INVALID_ARGUMENT    INVALID_ARGUMENT
//	mismatch-...      403 PERMISSION_DENIED   SENDER_ID_MISMATCH
//	thirdparty-...    401 UNAUTHENTICATED     THIRD_PARTY_AUTH_ERROR
//	quota-...         429 RESOURCE_EXHAUSTED  QUOTA_EXCEEDED  (Retry-After: 1)
//	unavailable-...   503 UNAVAILABLE         UNAVAILABLE     (Retry-After: 1)
//	internal-...      500 INTERNAL            INTERNAL
//
// Injected faults map to FCM's answers: Rate429 → 429 QUOTA_EXCEEDED (Retry-After: 1), Rate500 → 500
// INTERNAL, Rate503 → 503 UNAVAILABLE (Retry-After: 1), RateRaw503 → the HTML 503, RateTimeout and
// RateReset as for Twilio. The token endpoint sees no faults, only Options.Latency.
//
// Accepted messages are recorded with Provider "fcm", SID the message ID, AccountSID the project, To the
// token (or "/topics/x", or the condition), Subject and Body the notification's title and body, Status
// "accepted". /token requests are counted in FCMStats, not in Stats.Requests.

// FCM errorCode values and the Google status that goes with each.
const (
	fcmErrorType          = "type.googleapis.com/google.firebase.fcm.v1.FcmError"
	fcmUnregistered       = "UNREGISTERED"
	fcmInvalidArgument    = "INVALID_ARGUMENT"
	fcmSenderIDMismatch   = "SENDER_ID_MISMATCH"
	fcmThirdPartyAuth     = "THIRD_PARTY_AUTH_ERROR"
	fcmQuotaExceeded      = "QUOTA_EXCEEDED"
	fcmUnavailable        = "UNAVAILABLE"
	fcmInternal           = "INTERNAL"
	googleUnauthenticated = "UNAUTHENTICATED"
)

// fcmMaxPayload and fcmMaxTopicPayload are FCM's payload limits in bytes.
const (
	fcmMaxPayload      = 4096
	fcmMaxTopicPayload = 2048
	fcmMaxToken        = 4096
	fcmMaxRequest      = 1 << 16
)

// fcmMagic is what each magic token prefix draws.
var fcmMagic = []struct {
	prefix     string
	status     int
	google     string
	code       string
	msg        string
	retryAfter bool
}{
	{"unregistered-", http.StatusNotFound, "NOT_FOUND", fcmUnregistered, "Requested entity was not found.", false},
	{"invalid-", http.StatusBadRequest, "INVALID_ARGUMENT", fcmInvalidArgument, "The registration token is not a valid FCM registration token", false},
	{"mismatch-", http.StatusForbidden, "PERMISSION_DENIED", fcmSenderIDMismatch, "SenderId mismatch", false},
	{"thirdparty-", http.StatusUnauthorized, googleUnauthenticated, fcmThirdPartyAuth, "Auth error from APNS or Web Push Service", false},
	{"quota-", http.StatusTooManyRequests, "RESOURCE_EXHAUSTED", fcmQuotaExceeded, "Quota exceeded for quota metric 'Messages per minute'.", true},
	{"unavailable-", http.StatusServiceUnavailable, "UNAVAILABLE", fcmUnavailable, "The service is currently unavailable.", true},
	{"internal-", http.StatusInternalServerError, "INTERNAL", fcmInternal, "Internal error encountered.", false},
}

// FCMStats counts what the FCM fake's token endpoint and authentication saw.
type FCMStats struct {
	// TokenRequests is every request to POST /token.
	TokenRequests int `json:"token_requests"`
	// TokensIssued is the number of access tokens handed out.
	TokensIssued int `json:"tokens_issued"`
	// TokensRefused is the number of token requests refused (a malformed or badly signed assertion).
	TokensRefused int `json:"tokens_refused"`
	// Unauthenticated is the number of sends refused for a missing, unknown or expired access token.
	Unauthenticated int `json:"unauthenticated"`
}

// fcmState is the FCM fake's state, and the webhook receiver's: Server has one hook for the two.
type fcmState struct {
	limiter *rateLimiter

	mu     sync.Mutex
	tokens map[string]time.Time // access token → expiry
	stats  FCMStats

	webhook *webhookState
}

// fcmRoutes registers the FCM HTTP v1 fake, its OAuth2 token endpoint and the generic webhook receiver.
func (s *Server) fcmRoutes() {
	s.fcm = &fcmState{
		limiter: newRateLimiter(s.opts.FCMRate),
		tokens:  make(map[string]time.Time),
		webhook: &webhookState{},
	}
	s.mux.HandleFunc("POST /token", s.fcmTokenEndpoint)
	s.mux.HandleFunc("POST /v1/projects/{project}/messages:send", s.fcmSend)
	s.mux.HandleFunc("POST /projects/{project}/messages:send", s.fcmSend)
	s.mux.HandleFunc("GET /_sandbox/fcm/stats", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.FCMStats())
	})
	s.mux.HandleFunc("POST /_sandbox/fcm/revoke", func(w http.ResponseWriter, r *http.Request) {
		s.RevokeFCMTokens()
		w.WriteHeader(http.StatusNoContent)
	})
	s.mux.HandleFunc("POST /_sandbox/fcm/reset", func(w http.ResponseWriter, r *http.Request) {
		s.ResetFCM()
		w.WriteHeader(http.StatusNoContent)
	})
	s.webhookRoutes()
	s.postbackRoutes()
}

// FCMStats returns the token endpoint's counters since the start or the last ResetFCM.
func (s *Server) FCMStats() FCMStats {
	s.fcm.mu.Lock()
	defer s.fcm.mu.Unlock()
	return s.fcm.stats
}

// RevokeFCMTokens forgets every access token issued, as if Google had revoked them: the next sends get
// 401 UNAUTHENTICATED until their client fetches a new token.
func (s *Server) RevokeFCMTokens() {
	s.fcm.mu.Lock()
	defer s.fcm.mu.Unlock()
	clear(s.fcm.tokens)
}

// ResetFCM clears FCMStats, WebhookStats and the FCM rate buckets. Issued tokens stay valid: a running
// client keeps its cached token across a reset. Reset (the shared message log, Stats and the Twilio
// buckets) does not call it.
func (s *Server) ResetFCM() {
	s.fcm.mu.Lock()
	s.fcm.stats = FCMStats{}
	s.fcm.mu.Unlock()
	s.fcm.limiter.reset()
	s.fcm.webhook.reset()
}

func (f *fcmState) count(fn func(*FCMStats)) {
	f.mu.Lock()
	fn(&f.stats)
	f.mu.Unlock()
}

// issue records a new access token valid for ttl and returns it; expired tokens are dropped on the way.
func (f *fcmState) issue(ttl time.Duration, now time.Time) string {
	var b [24]byte
	_, _ = rand.Read(b[:])
	tok := "ya29.sandbox-" + hex.EncodeToString(b[:])
	f.mu.Lock()
	defer f.mu.Unlock()
	for t, exp := range f.tokens {
		if !now.Before(exp) {
			delete(f.tokens, t)
		}
	}
	f.tokens[tok] = now.Add(ttl)
	f.stats.TokensIssued++
	return tok
}

// authorized reports whether r carries a bearer token issued by /token and not expired.
func (f *fcmState) authorized(r *http.Request, now time.Time) bool {
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	exp, ok := f.tokens[tok]
	return ok && now.Before(exp)
}

// fcmSendRequest is the body of messages:send. Both the proto field names and their lowerCamelCase JSON
// names are accepted, as Google's JSON parser does.
type fcmSendRequest struct {
	ValidateOnly      bool        `json:"validate_only"`
	ValidateOnlyCamel bool        `json:"validateOnly"`
	Message           *fcmMessage `json:"message"`
}

type fcmMessage struct {
	Name         string           `json:"name"`
	Token        string           `json:"token"`
	Topic        string           `json:"topic"`
	Condition    string           `json:"condition"`
	Notification *fcmNotification `json:"notification"`
	Data         map[string]any   `json:"data"`
	Android      json.RawMessage  `json:"android"`
	APNS         json.RawMessage  `json:"apns"`
	Webpush      json.RawMessage  `json:"webpush"`
	FCMOptions   json.RawMessage  `json:"fcm_options"`
	FCMOptions2  json.RawMessage  `json:"fcmOptions"`
}

type fcmNotification struct {
	Title string `json:"title"`
	Body  string `json:"body"`
	Image string `json:"image"`
}

// fcmSend imitates POST /v1/projects/{project}/messages:send.
func (s *Server) fcmSend(w http.ResponseWriter, r *http.Request) {
	w, done, ok := s.arrive(w, r, apiFCM, true)
	defer done()
	if !ok {
		return
	}
	project := r.PathValue("project")

	if !s.fcm.authorized(r, time.Now()) {
		s.fcm.count(func(st *FCMStats) { st.Unauthenticated++ })
		w.Header().Set("WWW-Authenticate", `Bearer realm="https://accounts.google.com/", error="invalid_token"`)
		s.fcmError(w, project, "", http.StatusUnauthorized, googleUnauthenticated, "",
			"Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential.")
		return
	}
	if !s.fcm.limiter.allow(project) {
		// The bucket refills one token every 1/rate seconds: that is the earliest a retry can pass.
		wait := max(1, int(math.Ceil(1/s.opts.FCMRate)))
		mark(w, outRate)
		w.Header().Set("Retry-After", strconv.Itoa(wait))
		s.fcmError(w, project, "", http.StatusTooManyRequests, "RESOURCE_EXHAUSTED", fcmQuotaExceeded,
			"Quota exceeded for quota metric 'Messages per minute' of service 'fcm.googleapis.com'.")
		return
	}
	if s.overRate(w, r) {
		return
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, fcmMaxRequest))
	if err != nil {
		s.fcmError(w, project, "", http.StatusBadRequest, "INVALID_ARGUMENT", fcmInvalidArgument, "Request payload size exceeds the limit.")
		return
	}

	hangAfterAccept := false
	f := s.faults.Load().pick("fcm")
	if f != noFault && f != faultTimeout {
		mark(w, faultOutcome(f))
	}
	switch f {
	case fault429:
		w.Header().Set("Retry-After", "1")
		s.fcmError(w, project, "", http.StatusTooManyRequests, "RESOURCE_EXHAUSTED", fcmQuotaExceeded, "Quota exceeded.")
		return
	case fault500:
		s.fcmError(w, project, "", http.StatusInternalServerError, "INTERNAL", fcmInternal, "Internal error encountered.")
		return
	case fault503:
		w.Header().Set("Retry-After", "1")
		s.fcmError(w, project, "", http.StatusServiceUnavailable, "UNAVAILABLE", fcmUnavailable, "The service is currently unavailable.")
		return
	case faultRaw503:
		s.log.rejected(http.StatusServiceUnavailable, 0)
		s.fcmLogRequest(project, "", http.StatusServiceUnavailable, "")
		writeRaw503(w)
		return
	case faultReset:
		s.log.connReset()
		s.fcmLogRequest(project, "", 0, "")
		resetConn(w)
		return
	case faultTimeout:
		hangAfterAccept = true
	}

	req, target, err := parseFCMRequest(data)
	if err != nil {
		s.fcmError(w, project, target, http.StatusBadRequest, "INVALID_ARGUMENT", fcmInvalidArgument, err.Error())
		return
	}
	msg := req.Message
	if msg.Token != "" {
		for _, m := range fcmMagic {
			if strings.HasPrefix(msg.Token, m.prefix) {
				if m.retryAfter {
					w.Header().Set("Retry-After", "1")
				}
				s.fcmError(w, project, target, m.status, m.google, m.code, m.msg)
				return
			}
		}
	}
	if req.ValidateOnly || req.ValidateOnlyCamel {
		s.fcmLogRequest(project, target, http.StatusOK, "")
		writeJSON(w, http.StatusOK, map[string]string{"name": "projects/" + project + "/messages/fake_message_id"})
		return
	}

	m := Message{
		Provider:   "fcm",
		SID:        newFCMMessageID(),
		AccountSID: project,
		To:         target,
		Status:     "accepted",
		At:         time.Now().UTC(),
		Hung:       hangAfterAccept,
	}
	if n := msg.Notification; n != nil {
		m.Subject, m.Body = n.Title, n.Body
	}
	s.log.accept(m)
	recorded(w, 1, 0)
	if hangAfterAccept {
		mark(w, outHung)
		s.fcmLogRequest(project, target, 0, "")
		hang(r)
		return
	}
	s.fcmLogRequest(project, target, http.StatusOK, "")
	writeJSON(w, http.StatusOK, map[string]string{"name": "projects/" + project + "/messages/" + m.SID})
}

// parseFCMRequest decodes and validates a messages:send body. It returns the message's target (for the
// log) even when the message is refused, if it got that far. Error texts are FCM's, or close to them.
func parseFCMRequest(data []byte) (*fcmSendRequest, string, error) {
	var req fcmSendRequest
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return nil, "", fmt.Errorf("Invalid JSON payload received. %s", jsonProblem(err))
	}
	if dec.More() {
		return nil, "", errors.New("Invalid JSON payload received. Unexpected data after the message.")
	}
	msg := req.Message
	if msg == nil {
		return nil, "", errors.New("Request contains an invalid argument: message is required.")
	}
	targets := 0
	target := ""
	for _, t := range []string{msg.Token, msg.Topic, msg.Condition} {
		if t != "" {
			targets++
			target = t
		}
	}
	if targets != 1 {
		return nil, "", errors.New("Request contains an invalid argument: exactly one of token, topic or condition is required.")
	}
	limit := fcmMaxPayload
	switch {
	case msg.Token != "":
		if len(msg.Token) > fcmMaxToken || strings.ContainsFunc(msg.Token, func(r rune) bool { return r <= ' ' || r > '~' }) {
			return nil, target, errors.New("The registration token is not a valid FCM registration token")
		}
	case msg.Topic != "":
		topic := strings.TrimPrefix(msg.Topic, "/topics/")
		if topic == "" || strings.ContainsFunc(topic, func(r rune) bool {
			return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || strings.ContainsRune("-_.~%", r))
		}) {
			return nil, target, errors.New("Request contains an invalid argument: malformed topic name.")
		}
		target = "/topics/" + topic
		limit = fcmMaxTopicPayload
	}
	size := 0
	for k, v := range msg.Data {
		str, ok := v.(string)
		if !ok {
			return nil, target, fmt.Errorf("Invalid value at 'message.data[%s].value' (TYPE_STRING)", k)
		}
		if k == "from" || k == "message_type" || strings.HasPrefix(k, "google") || strings.HasPrefix(k, "gcm") {
			return nil, target, fmt.Errorf("Invalid data payload key: %s", k)
		}
		size += len(k) + len(str)
	}
	if n := msg.Notification; n != nil {
		size += len(n.Title) + len(n.Body) + len(n.Image)
	}
	if size > limit {
		return nil, target, fmt.Errorf("Message is too big: %d bytes of payload, the limit is %d.", size, limit)
	}
	return &req, target, nil
}

// jsonProblem describes a decoding error without quoting the body.
func jsonProblem(err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("Syntax error at byte %d.", se.Offset)
	case errors.As(err, &te):
		return fmt.Sprintf("Invalid value for %q.", te.Field)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return "Unknown name " + strings.TrimPrefix(err.Error(), "json: unknown field ") + ": Cannot find field."
	}
	return "Cannot parse the body."
}

// fcmErrorBody is Google's JSON error shape.
type fcmErrorBody struct {
	Error fcmErrorStatus `json:"error"`
}

type fcmErrorStatus struct {
	Code    int              `json:"code"`
	Message string           `json:"message"`
	Status  string           `json:"status"`
	Details []fcmErrorDetail `json:"details,omitempty"`
}

type fcmErrorDetail struct {
	Type      string `json:"@type"`
	ErrorCode string `json:"errorCode"`
}

// fcmError answers with Google's error JSON; code, when not empty, goes into an FcmError detail.
func (s *Server) fcmError(w http.ResponseWriter, project, target string, status int, google, code, msg string) {
	s.log.rejected(status, 0)
	s.fcmLogRequest(project, target, status, code)
	body := fcmErrorBody{Error: fcmErrorStatus{Code: status, Message: msg, Status: google}}
	if code != "" {
		body.Error.Details = []fcmErrorDetail{{Type: fcmErrorType, ErrorCode: code}}
	}
	writeJSON(w, status, body)
}

// fcmLogRequest writes one debug record per send; status 0 means no answer was sent. The device token is
// masked; the access token and the payload are never logged.
func (s *Server) fcmLogRequest(project, target string, status int, code string) {
	s.logger.Debug("sandbox fcm request",
		"project", project,
		"to", providers.MaskAddress(target),
		"status", status,
		"error_code", code)
}

// newFCMMessageID returns an ID shaped like FCM's: "0:" + microseconds + "%" + 16 hex digits.
func newFCMMessageID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("0:%d%%%s", time.Now().UnixMicro(), hex.EncodeToString(b[:]))
}
