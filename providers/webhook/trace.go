package webhook

import (
	"net/http/httptrace"
	"sync"
	"time"
)

// pendingWriteWait bounds how long a failed request waits to learn whether a write still in progress got
// through. net/http may report the end of a write after Do has returned (the client timeout cancels the
// round trip, not the writer); once the connection is closed that report comes at once.
const pendingWriteWait = time.Second

// writeTracker follows one HTTP request with net/http/httptrace and tells, after a failure without an
// answer, whether the request may have reached the server. Each request has its own tracker, so the
// answer cannot be mixed up with another goroutine's request on the shared connection pool.
type writeTracker struct {
	writeDone chan struct{} // signalled after each write report, capacity 1

	mu     sync.Mutex
	conns  int // connections obtained (net/http may retry a request that wrote nothing)
	writes int // write reports, successful or not
	wrote  bool
}

func newWriteTracker() *writeTracker {
	return &writeTracker{writeDone: make(chan struct{}, 1)}
}

func (t *writeTracker) trace() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{GotConn: t.gotConn, WroteRequest: t.wroteRequest}
}

func (t *writeTracker) gotConn(httptrace.GotConnInfo) {
	t.mu.Lock()
	t.conns++
	t.mu.Unlock()
}

// wroteRequest runs on net/http's writer goroutine, possibly after Do has returned.
func (t *writeTracker) wroteRequest(info httptrace.WroteRequestInfo) {
	t.mu.Lock()
	t.writes++
	if info.Err == nil {
		t.wrote = true
	}
	t.mu.Unlock()
	select {
	case t.writeDone <- struct{}{}:
	default:
	}
}

// written reports whether the request may have reached the server. It is false only when that is
// certain: no connection was made, or every write failed. net/http reports a successful write once the
// request is in its buffer, just before the flush, so a failed flush counts as written; that errs on the
// side of ambiguity, never of a double send.
func (t *writeTracker) written() bool {
	timer := time.NewTimer(pendingWriteWait)
	defer timer.Stop()
	for {
		t.mu.Lock()
		conns, writes, wrote := t.conns, t.writes, t.wrote
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
		case <-t.writeDone:
		case <-timer.C:
			return true // still writing: it may yet arrive
		}
	}
}
