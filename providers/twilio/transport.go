package twilio

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/url"
	"sync"

	"github.com/campaignctl/campaignctl/providers/internal/wire"
)

// maxAnswer bounds the answer body read into memory. A Message resource or an error is about 1 KiB.
const maxAnswer = 1 << 20

var errAnswerTooLarge = errors.New("answer larger than 1 MiB")

// recorder is the RoundTripper of a single Send. It points the request at the configured host and
// remembers what happened to it: whether a connection was obtained and whether the request was written
// (its embedded wire.Tracker), and the status and Retry-After of the answer. twilio-go keeps none of
// this, and a RoundTripper per call is the only place where it cannot be mixed up with another
// goroutine's request.
//
// It also reads the whole answer before handing it to the SDK. twilio-go v1.31.0 never closes the body
// of an error answer and stops reading a success body at the end of the JSON value; unless the last
// read happens to report the end of the body, the connection (or HTTP/2 stream) stays stuck until the
// timeout instead of going back to the pool.
type recorder struct {
	wire.Tracker
	next   http.RoundTripper
	target *url.URL // nil: leave the URL alone

	mu         sync.Mutex
	status     int
	retryAfter string
}

// RoundTrip sends a clone of req to the target host with the recorder's trace attached.
func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	out := req.Clone(r.WithTrace(req.Context()))
	if r.target != nil {
		out.URL.Scheme = r.target.Scheme
		out.URL.Host = r.target.Host
		out.Host = ""
	}
	resp, err := r.next.RoundTrip(out)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.status = resp.StatusCode
	r.retryAfter = resp.Header.Get("Retry-After")
	r.mu.Unlock()

	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	resp.Body.Close()
	if err == nil && len(data) > maxAnswer {
		data, err = data[:maxAnswer], errAnswerTooLarge
	}
	resp.Body = &readBody{r: bytes.NewReader(data), err: err}
	return resp, nil
}

// readBody replays an answer read in full, then the error that cut it short, if any.
type readBody struct {
	r   *bytes.Reader
	err error
}

func (b *readBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF && b.err != nil {
		err = b.err
	}
	return n, err
}

func (b *readBody) Close() error { return nil }

// answer returns the HTTP status of the answer (0 when none arrived) and its Retry-After header.
func (r *recorder) answer() (status int, retryAfter string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status, r.retryAfter
}
