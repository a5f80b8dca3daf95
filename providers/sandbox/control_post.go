package sandbox

import (
	"context"
	"errors"
	"io"
	"net/http"
)

// The control endpoints that make a provider post something to a receiver now (a recipient's refusal:
// POST /_sandbox/sendgrid/events, POST /_sandbox/twilio/inbound) post once, synchronously, and answer
// with what they posted and what the receiver answered: 200 when it answered at all (whatever its
// status; the caller reads it in the answer), 502 when it did not, 400 for a request that cannot be
// posted and 409 when the sandbox has nowhere to post it or nothing to sign it with.

// maxReceiverAnswer bounds the part of a receiver's answer a control endpoint passes on.
const maxReceiverAnswer = 4 << 10

// errNotConfigured wraps the errors of a post the sandbox has no URL or no key for (409).
var errNotConfigured = errors.New("not configured")

// errInvalid wraps the errors of a control request that cannot be posted (400).
var errInvalid = errors.New("invalid")

// postForAnswer POSTs body to target through client (a loopbackClient) with the given headers, within
// loopbackTimeout, and returns the receiver's status and the start of its answer. err is set when no
// answer came.
func postForAnswer(ctx context.Context, client *http.Client, target string, header http.Header, body io.Reader) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, loopbackTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, body)
	if err != nil {
		return 0, nil, err
	}
	req.Header = header
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, maxReceiverAnswer))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16)) // so that the connection can be reused
	return resp.StatusCode, answer, nil
}

// writeControlPost answers a control endpoint that posted (see above): err is what kept it from posting,
// status the receiver's (0: no answer).
func writeControlPost(w http.ResponseWriter, result any, status int, err error) {
	switch {
	case errors.Is(err, errInvalid):
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
	case errors.Is(err, errNotConfigured):
		writeJSON(w, http.StatusConflict, map[string]string{"error": err.Error()})
	case err != nil:
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
	case status == 0:
		writeJSON(w, http.StatusBadGateway, result)
	default:
		writeJSON(w, http.StatusOK, result)
	}
}
