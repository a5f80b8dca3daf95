package sendgrid

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptrace"
	"sync"
	"time"
)

// pendingWriteWait bounds how long a failed request waits to learn whether a write still in progress got
// through. net/http may report the end of a write after RoundTrip has already returned (the client
// timeout cancels the round trip, not the writer); once the connection is closed that report comes at
// once, so the wait is short in practice.
const pendingWriteWait = time.Second

// maxAnswer bounds the answer body read into memory. SendGrid answers a send with an empty body or an
// error list of a few hundred bytes.
const maxAnswer = 1 << 20

var errAnswerTooLarge = errors.New("answer larger than 1 MiB")

// call is what happened to the request of one SendBatch: whether a connection was obtained and whether
// the request was written. It travels in the request's context, so that the RoundTripper shared by all
// calls records each request in its own call and never mixes up two goroutines' requests.
type call struct {
	writeDone chan struct{} // signalled after each write report, capacity 1

	mu     sync.Mutex
	conns  int // connections obtained (net/http may retry a request that wrote nothing)
	writes int // write reports, successful or not
	wrote  bool
}

func newCall() *call { return &call{writeDone: make(chan struct{}, 1)} }

type callKey struct{}

func withCall(ctx context.Context, c *call) context.Context {
	return context.WithValue(ctx, callKey{}, c)
}

// tracingTransport is the RoundTripper of the shared http.Client. It attaches to each request a trace
// that reports to the request's call, and reads the answer in full (bounded) before handing it on.
type tracingTransport struct {
	next http.RoundTripper
}

// RoundTrip sends req with a trace that reports to its call, if it has one.
func (t *tracingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if c, ok := req.Context().Value(callKey{}).(*call); ok {
		trace := &httptrace.ClientTrace{GotConn: c.gotConn, WroteRequest: c.wroteRequest}
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
	}
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	resp.Body = &boundedBody{r: io.LimitReader(resp.Body, maxAnswer+1), c: resp.Body}
	return resp, nil
}

// boundedBody fails a read past maxAnswer, so that a runaway answer cannot fill the memory.
type boundedBody struct {
	r io.Reader
	c io.Closer
	n int
}

func (b *boundedBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.n += n
	if b.n > maxAnswer {
		return n, errAnswerTooLarge
	}
	return n, err
}

func (b *boundedBody) Close() error { return b.c.Close() }

func (c *call) gotConn(httptrace.GotConnInfo) {
	c.mu.Lock()
	c.conns++
	c.mu.Unlock()
}

// wroteRequest runs on net/http's writer goroutine, possibly after RoundTrip has returned.
func (c *call) wroteRequest(info httptrace.WroteRequestInfo) {
	c.mu.Lock()
	c.writes++
	if info.Err == nil {
		c.wrote = true
	}
	c.mu.Unlock()
	select {
	case c.writeDone <- struct{}{}:
	default:
	}
}

// written reports, after a round trip failed without an answer, whether the request may have reached
// the server. It is false only when that is certain: no connection was made, or every write failed.
// net/http reports a successful write once the request is in its buffer, just before the flush, so a
// failed flush counts as written; that errs on the side of ambiguity, never of a double send.
func (c *call) written() bool {
	timer := time.NewTimer(pendingWriteWait)
	defer timer.Stop()
	for {
		c.mu.Lock()
		conns, writes, wrote := c.conns, c.writes, c.wrote
		c.mu.Unlock()
		switch {
		case wrote:
			return true
		case conns == 0:
			return false
		case writes >= conns:
			return false
		}
		select {
		case <-c.writeDone:
		case <-timer.C:
			return true // still writing: it may yet arrive
		}
	}
}
