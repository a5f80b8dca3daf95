package sandbox

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/campaignctl/campaignctl/providers"
)

// The webhook receiver imitates an in-house system that takes campaign messages from providers/webhook:
//
//	POST /webhook                   receive one message
//	GET  /_sandbox/webhook/stats    WebhookStats as JSON
//
// A request must be signed with Options.WebhookSecret: X-Campaignctl-Timestamp is the Unix time in
// seconds, within 5 minutes of the sandbox's clock, and X-Campaignctl-Signature holds
// "v1=" + hex(HMAC-SHA256(secret, timestamp + "." + body)) (several comma-separated values are allowed,
// for secret rotation). A missing, stale or wrong signature is answered 401 and counted; with no
// WebhookSecret every request is refused. The check is written here independently of
// providers/webhook, so that the two can catch each other's mistakes.
//
// Then, as for the other fakes, injected faults apply (429 with Retry-After: 1, JSON 500 and 503, the HTML
// 503, timeout, reset), then the body must be JSON with a non-empty "to" (400 otherwise). A "to" of the
// form "status-NNN", NNN from 400 to 599, is answered with that status ({"error": ...}; Retry-After: 1 on
// 429 and 503) and not recorded. Other messages are recorded with Provider "webhook", SID the id
// answered, and To, Subject, Body from the payload, and answered 200 {"id": "wh_..."}.

// webhookTolerance is how far the signed timestamp may be from the sandbox's clock.
const webhookTolerance = 5 * time.Minute

// webhookMaxBody bounds a webhook request body.
const webhookMaxBody = 1 << 20

// WebhookStats counts what the webhook receiver saw since the start or the last ResetFCM.
type WebhookStats struct {
	// Requests is every POST /webhook.
	Requests int `json:"requests"`
	// Accepted is the number of messages recorded.
	Accepted int `json:"accepted"`
	// MissingSignature counts requests without the timestamp or signature header (or with no secret
	// configured in the sandbox).
	MissingSignature int `json:"missing_signature"`
	// StaleTimestamp counts requests whose timestamp is malformed or outside the tolerance.
	StaleTimestamp int `json:"stale_timestamp"`
	// BadSignature counts requests whose signature did not match.
	BadSignature int `json:"bad_signature"`
}

// Rejected is the number of requests refused for their signature.
func (s WebhookStats) Rejected() int { return s.MissingSignature + s.StaleTimestamp + s.BadSignature }

type webhookState struct {
	mu    sync.Mutex
	stats WebhookStats
}

func (h *webhookState) count(fn func(*WebhookStats)) {
	h.mu.Lock()
	fn(&h.stats)
	h.mu.Unlock()
}

func (h *webhookState) reset() {
	h.mu.Lock()
	h.stats = WebhookStats{}
	h.mu.Unlock()
}

// webhookPayload is the body providers/webhook sends.
type webhookPayload struct {
	CampaignID int64             `json:"campaign_id"`
	UserID     string            `json:"user_id"`
	To         string            `json:"to"`
	Subject    string            `json:"subject"`
	Body       string            `json:"body"`
	Data       map[string]string `json:"data"`
}

func (s *Server) webhookRoutes() {
	s.mux.HandleFunc("POST /webhook", s.webhookReceive)
	s.mux.HandleFunc("GET /_sandbox/webhook/stats", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.WebhookStats())
	})
}

// WebhookStats returns the webhook receiver's counters.
func (s *Server) WebhookStats() WebhookStats {
	h := s.fcm.webhook
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.stats
}

func (s *Server) webhookReceive(w http.ResponseWriter, r *http.Request) {
	h := s.fcm.webhook
	h.count(func(st *WebhookStats) { st.Requests++ })
	w, done, ok := s.arrive(w, r, apiWebhook, true)
	defer done()
	if !ok {
		return
	}

	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, webhookMaxBody))
	if err != nil {
		s.webhookError(w, "", http.StatusRequestEntityTooLarge, "body too large or unreadable")
		return
	}
	if verdict := s.checkWebhookSignature(r.Header, body, time.Now()); verdict != "" {
		h.count(func(st *WebhookStats) {
			switch verdict {
			case "missing":
				st.MissingSignature++
			case "stale":
				st.StaleTimestamp++
			default:
				st.BadSignature++
			}
		})
		s.webhookError(w, "", http.StatusUnauthorized, "invalid signature: "+verdict)
		return
	}
	if s.overRate(w, r) {
		return
	}

	hangAfterAccept, answered := s.webhookFault(w)
	if answered {
		return
	}

	var p webhookPayload
	if err := json.Unmarshal(body, &p); err != nil {
		s.webhookError(w, "", http.StatusBadRequest, "body is not the JSON message")
		return
	}
	if p.To == "" {
		s.webhookError(w, "", http.StatusBadRequest, "to is required")
		return
	}
	if code, ok := strings.CutPrefix(p.To, "status-"); ok {
		if st, err := strconv.Atoi(code); err == nil && st >= 400 && st <= 599 {
			if st == http.StatusTooManyRequests || st == http.StatusServiceUnavailable {
				w.Header().Set("Retry-After", "1")
			}
			s.webhookError(w, p.To, st, "refused: "+http.StatusText(st))
			return
		}
	}

	var b [12]byte
	_, _ = rand.Read(b[:])
	m := Message{
		Provider: "webhook",
		SID:      "wh_" + hex.EncodeToString(b[:]),
		To:       p.To,
		Subject:  p.Subject,
		Body:     p.Body,
		Status:   "accepted",
		At:       time.Now().UTC(),
		Hung:     hangAfterAccept,
	}
	s.log.accept(m)
	recorded(w, 1, 0)
	h.count(func(st *WebhookStats) { st.Accepted++ })
	if hangAfterAccept {
		mark(w, outHung)
		s.webhookLogRequest(p.To, 0)
		hang(r)
		return
	}
	s.webhookLogRequest(p.To, http.StatusOK)
	writeJSON(w, http.StatusOK, map[string]string{"id": m.SID})
}

// webhookFault answers the request with the injected fault it draws, if any, and says so (answered). The
// timeout fault is not answered: hang reports it, for the handler to hang once the message is recorded.
func (s *Server) webhookFault(w http.ResponseWriter) (hang, answered bool) {
	f := s.faults.Load().pick("webhook")
	if f != noFault && f != faultTimeout {
		mark(w, faultOutcome(f))
	}
	switch f {
	case fault429:
		w.Header().Set("Retry-After", "1")
		s.webhookError(w, "", http.StatusTooManyRequests, "too many requests")
	case fault500:
		s.webhookError(w, "", http.StatusInternalServerError, "internal error")
	case fault503:
		s.webhookError(w, "", http.StatusServiceUnavailable, "service unavailable")
	case faultRaw503:
		s.log.rejected(http.StatusServiceUnavailable, 0)
		s.webhookLogRequest("", http.StatusServiceUnavailable)
		writeRaw503(w)
	case faultReset:
		s.log.connReset()
		s.webhookLogRequest("", 0)
		resetConn(w)
	default:
		return f == faultTimeout, false
	}
	return false, true
}

// checkWebhookSignature returns "" when the request is signed with Options.WebhookSecret, or why not:
// "missing", "stale" or "mismatch".
func (s *Server) checkWebhookSignature(hdr http.Header, body []byte, now time.Time) string {
	ts, sigs := hdr.Get("X-Campaignctl-Timestamp"), hdr.Values("X-Campaignctl-Signature")
	if s.opts.WebhookSecret == "" || ts == "" || len(sigs) == 0 {
		return "missing"
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return "stale"
	}
	if d := now.Sub(time.Unix(sec, 0)); d > webhookTolerance || d < -webhookTolerance {
		return "stale"
	}
	mac := hmac.New(sha256.New, []byte(s.opts.WebhookSecret))
	mac.Write([]byte(ts))
	mac.Write([]byte("."))
	mac.Write(body)
	want := []byte("v1=" + hex.EncodeToString(mac.Sum(nil)))
	ok := false
	for _, v := range sigs {
		for _, sig := range strings.Split(v, ",") {
			// Compare every candidate, so that the time taken says nothing about which one matched.
			if hmac.Equal([]byte(strings.TrimSpace(sig)), want) {
				ok = true
			}
		}
	}
	if !ok {
		return "mismatch"
	}
	return ""
}

func (s *Server) webhookError(w http.ResponseWriter, to string, status int, msg string) {
	s.log.rejected(status, 0)
	s.webhookLogRequest(to, status)
	writeJSON(w, status, map[string]string{"error": msg})
}

// webhookLogRequest writes one debug record per request; status 0 means no answer was sent. The
// recipient is masked; the signature and the body are never logged.
func (s *Server) webhookLogRequest(to string, status int) {
	s.logger.Debug("sandbox webhook request", "to", providers.MaskAddress(to), "status", status)
}
