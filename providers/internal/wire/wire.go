// Package wire is the HTTP plumbing the provider adapters share: a Tracker that tells whether a request
// may have reached the server, the transport and connection pool of a provider's client (NewTransport,
// Transport), and the reading of a Retry-After header (ParseRetryAfter).
//
// A request that fails without an answer either never left (connection refused, DNS, TLS: sending it
// again is safe) or was written and then lost its answer (timeout, reset: the provider may have accepted
// it, and sending it again risks a double send). A Tracker tells the two apart from the GotConn and
// WroteRequest reports of net/http/httptrace, which Transport makes as net/http does.
//
// Use one Tracker per request, attached to the request's context:
//
//	var tr wire.Tracker
//	req, _ := http.NewRequestWithContext(tr.WithTrace(ctx), ...)
//	resp, err := client.Do(req)
//	if err != nil && tr.Written() {
//		// ambiguous: the request may have arrived
//	}
//
// Since each request reports to its own Tracker, what it says cannot be mixed up with another
// goroutine's request on a shared connection pool.
package wire

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"time"
)

// PendingWriteWait bounds how long Written waits to learn whether a write still in progress got through.
// net/http may report the end of a write after Do or RoundTrip has already returned (the client timeout
// cancels the round trip, not the writer); once the connection is closed that report comes at once, so
// the wait is short in practice.
const PendingWriteWait = time.Second

// Tracker follows one HTTP request: whether a connection was obtained for it and whether it was written.
// Its methods are safe for concurrent use (net/http reports writes on its own goroutine, possibly after
// the round trip has returned). The zero Tracker is ready to use; a Tracker must not be copied after
// first use.
type Tracker struct {
	mu        sync.Mutex
	writeDone chan struct{} // signalled after each write report, capacity 1; made on first use
	conns     int           // connections obtained (net/http may retry a request that wrote nothing)
	writes    int           // write reports, successful or not
	wrote     bool          // a write succeeded
}

// WithTrace returns a copy of ctx whose client trace reports to t, composed with any trace ctx already
// holds. Send the request with that context.
func (t *Tracker) WithTrace(ctx context.Context) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: t.GotConn, WroteRequest: t.WroteRequest})
}

// GotConn is the httptrace.ClientTrace hook that counts a connection obtained for the request.
func (t *Tracker) GotConn(httptrace.GotConnInfo) {
	t.mu.Lock()
	t.conns++
	t.mu.Unlock()
}

// WroteRequest is the httptrace.ClientTrace hook that records a write report, successful or not. A
// write that failed after part of the request went out (Transport says so) counts as a successful one:
// the server may have it. Under net/http it runs on the writer goroutine, possibly after the round trip
// has returned.
func (t *Tracker) WroteRequest(info httptrace.WroteRequestInfo) {
	t.mu.Lock()
	t.writes++
	var partial *partialWriteError
	if info.Err == nil || errors.As(info.Err, &partial) {
		t.wrote = true
	}
	done := t.doneLocked()
	t.mu.Unlock()
	select {
	case done <- struct{}{}:
	default:
	}
}

// Settled reports whether net/http is done reading the request's body: a connection was obtained and
// every connection the request got has reported its write (net/http reports it once the body is read
// whole into the connection's buffer, or the write failed). Only then may the buffer the body was read
// from be written again: a round trip can end (an early answer, a cancelled context) while the body is
// still being written.
func (t *Tracker) Settled() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.conns > 0 && t.writes >= t.conns
}

// Connected reports whether a connection to the server was ever obtained.
func (t *Tracker) Connected() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.conns > 0
}

// Written reports, after a round trip failed without an answer, whether the request may have reached
// the server. It is false only when that is certain: no connection was made, or every write failed
// before any of the request left. Transport reports a write once it is flushed, and a failed write
// that had sent part of the request as such. net/http reports a successful write once the request is in
// its buffer, just before the flush, so there a failed flush counts as written; that errs on the side
// of ambiguity, never of a double send. While a write is still in progress it waits for its report, at
// most PendingWriteWait, and then says true.
func (t *Tracker) Written() bool {
	timer := time.NewTimer(PendingWriteWait)
	defer timer.Stop()
	for {
		t.mu.Lock()
		conns, writes, wrote := t.conns, t.writes, t.wrote
		done := t.doneLocked()
		t.mu.Unlock()
		switch {
		case wrote:
			return true
		case conns == 0:
			return false
		case writes >= conns:
			return false
		}
		select {
		case <-done:
		case <-timer.C:
			return true // still writing: it may yet arrive
		}
	}
}

// doneLocked returns the write report signal, making it on first use. t.mu must be held.
func (t *Tracker) doneLocked() chan struct{} {
	if t.writeDone == nil {
		t.writeDone = make(chan struct{}, 1)
	}
	return t.writeDone
}

// MaxIdleConns is the fewest idle connections per host the pool NewTransport returns keeps, sized for a
// few dozen concurrent senders; net/http's default of 2 would make most sends open a new connection.
const MaxIdleConns = 128

// NewTransport returns the RoundTripper of a provider's shared http.Client: a Transport (HTTP/1.1 on the
// calling goroutine, handing to net/http what it cannot send itself) that keeps idle up to conns
// connections per host (at least MaxIdleConns). Give it the most requests the process has in flight at
// once: when more requests finish together than the pool keeps, the surplus connections are closed and
// the next sends dial (and, against a real provider, shake hands over TLS) again.
func NewTransport(conns int) http.RoundTripper {
	return &Transport{MaxIdleConnsPerHost: max(conns, MaxIdleConns)}
}

// ParseRetryAfter reads a Retry-After header, in seconds or as an HTTP date; 0 when absent or invalid.
func ParseRetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
		if s < 0 {
			return 0
		}
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// Until returns a context with the values of parent that ends at t and never before: nothing cancels it,
// and parent's cancellation does not reach it. Transport sets t on the request's connection, for its
// writes and its reads, and reports a read or write that runs into it as the context's DeadlineExceeded;
// so a request made with it costs neither the timer nor the watch for a cancellation that
// context.WithTimeout would add to every message. It is for requests through Transport only: net/http's
// own transport ends a request with its context's Done, which this context never closes.
func Until(parent context.Context, t time.Time) context.Context { return until{values: parent, at: t} }

type until struct {
	values context.Context
	at     time.Time
}

func (u until) Deadline() (time.Time, bool) { return u.at, true }
func (until) Done() <-chan struct{}         { return nil }
func (until) Err() error                    { return nil }
func (u until) Value(key any) any           { return u.values.Value(key) }
