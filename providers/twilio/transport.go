package twilio

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"sync"
	"time"
)

// pendingWriteWait bounds how long a failed Send waits to learn whether a write still in progress got
// through. net/http may report the end of a write after RoundTrip has already returned (the client
// timeout cancels the round trip, not the writer); once the connection is closed that report comes at
// once, so the wait is short in practice.
const pendingWriteWait = time.Second

// maxAnswer bounds the answer body read into memory. A Message resource or an error is about 1 KiB.
const maxAnswer = 1 << 20

var errAnswerTooLarge = errors.New("answer larger than 1 MiB")

// recorder is the RoundTripper of a single Send. It points the request at the configured host and
// remembers what happened to it: whether a connection was obtained, whether the request was written,
// and the status and Retry-After of the answer. twilio-go keeps none of this, and a RoundTripper per
// call is the only place where it cannot be mixed up with another goroutine's request.
//
// It also reads the whole answer before handing it to the SDK. twilio-go v1.31.0 never closes the body
// of an error answer and stops reading a success body at the end of the JSON value; unless the last
// read happens to report the end of the body, the connection (or HTTP/2 stream) stays stuck until the
// timeout instead of going back to the pool.
type recorder struct {
	next      http.RoundTripper
	target    *url.URL      // nil: leave the URL alone
	writeDone chan struct{} // signalled after each write report, capacity 1

	mu         sync.Mutex
	conns      int // connections obtained (net/http may retry a request that wrote nothing)
	writes     int // write reports, successful or not
	wrote      bool
	status     int
	retryAfter string
}

// RoundTrip sends a clone of req to the target host with a trace attached.
func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	trace := &httptrace.ClientTrace{GotConn: r.gotConn, WroteRequest: r.wroteRequest}
	out := req.Clone(httptrace.WithClientTrace(req.Context(), trace))
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

func (r *recorder) gotConn(httptrace.GotConnInfo) {
	r.mu.Lock()
	r.conns++
	r.mu.Unlock()
}

// wroteRequest runs on net/http's writer goroutine, possibly after RoundTrip has returned.
func (r *recorder) wroteRequest(info httptrace.WroteRequestInfo) {
	r.mu.Lock()
	r.writes++
	if info.Err == nil {
		r.wrote = true
	}
	r.mu.Unlock()
	select {
	case r.writeDone <- struct{}{}:
	default:
	}
}

// answer returns the HTTP status of the answer (0 when none arrived) and its Retry-After header.
func (r *recorder) answer() (status int, retryAfter string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status, r.retryAfter
}

// connected reports whether a connection to the server was ever obtained.
func (r *recorder) connected() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.conns > 0
}

// written reports, after a round trip failed without an answer, whether the request may have reached
// the server. It is false only when that is certain: no connection was made, or every write failed.
// net/http reports a successful write once the request is in its buffer, just before the flush, so a
// failed flush counts as written; that errs on the side of ambiguity, never of a double send.
func (r *recorder) written() bool {
	timer := time.NewTimer(pendingWriteWait)
	defer timer.Stop()
	for {
		r.mu.Lock()
		conns, writes, wrote := r.conns, r.writes, r.wrote
		r.mu.Unlock()
		switch {
		case wrote:
			return true
		case conns == 0:
			return false
		case writes >= conns:
			return false
		}
		select {
		case <-r.writeDone:
		case <-timer.C:
			return true // still writing: it may yet arrive
		}
	}
}
