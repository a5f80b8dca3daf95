package sandbox

import (
	"encoding/json"
	"io"
	"net/http"
	"time"
)

// The postback receiver stands in for an in-house messaging endpoint that takes one JSON POST a message,
// with no signature, in the shape that bulk senders' generic HTTP messengers post:
//
//	POST /postback    {"subject": ..., "body": ..., "recipients": [{"email": ..., "name": ...}, ...]}
//
// It exists so that a benchmark can run another sender against the same stand-in provider as
// campaignctl's own adapters, on the same machine, and compare the two on equal terms: each recipient is
// recorded as a message of Provider "postback" (To is its e-mail, or its "to" when it has one), so the
// duplicate count of /_sandbox/stats covers it like any other, and the request is answered 200 {} as soon as
// it is read. It shares the webhook's pushback settings (limits, outages, latency) and injected faults,
// answered the webhook's way (webhookFault; the timeout fault does not apply). A body that is not JSON, or
// that names no recipient, is answered 400.

// postbackPayload is the part of a postback body the receiver reads.
type postbackPayload struct {
	Subject    string `json:"subject"`
	Body       string `json:"body"`
	Recipients []struct {
		Email string `json:"email"`
		To    string `json:"to"`
	} `json:"recipients"`
}

func (s *Server) postbackRoutes() {
	s.mux.HandleFunc("POST /postback", s.postbackReceive)
}

func (s *Server) postbackReceive(w http.ResponseWriter, r *http.Request) {
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
	if s.overRate(w, r) {
		return
	}
	if _, answered := s.webhookFault(w); answered {
		return
	}
	var p postbackPayload
	if err := json.Unmarshal(body, &p); err != nil {
		s.webhookError(w, "", http.StatusBadRequest, "body is not JSON")
		return
	}
	n := 0
	at := time.Now().UTC()
	for _, rc := range p.Recipients {
		to := rc.To
		if to == "" {
			to = rc.Email
		}
		if to == "" {
			continue
		}
		s.log.accept(Message{Provider: "postback", To: to, Subject: p.Subject, Body: p.Body, Status: "accepted", At: at})
		n++
	}
	if n == 0 {
		s.webhookError(w, "", http.StatusBadRequest, "recipients is empty")
		return
	}
	recorded(w, n, 0)
	writeJSONBytes(w, http.StatusOK, []byte("{}"))
}
