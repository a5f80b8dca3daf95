package wire

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"os"
	"sync"
	"time"
)

// aLongTimeAgo is the deadline that interrupts a read or write in progress when a context ends.
var aLongTimeAgo = time.Unix(1, 0)

// conn is one connection. It belongs to one request at a time, from getConn until its answer's body
// is closed, or to the idle list; the hand-over is under Transport.mu.
type conn struct {
	t        *Transport
	h        *host
	raw      net.Conn // the TCP connection: deadlines, the liveness check
	top      net.Conn // raw, or the *tls.Conn over it: what requests go through and what is closed
	meter    *meter   // between raw and TLS
	tlsState *tls.ConnectionState
	br       *bufio.Reader
	bw       *bufio.Writer

	deadline  time.Time // last set on raw
	interrupt func()    // sets a deadline in the past on raw: ends a context
	idleAt    time.Time
}

// roundTrip writes req on pc and reads the answer's status and headers.
func (pc *conn) roundTrip(ctx context.Context, trace *httptrace.ClientTrace, req *http.Request) (*http.Response, error) {
	stop := pc.watch(ctx)
	if err := ctx.Err(); err != nil {
		// Nothing was written: the connection can go back, unless the interrupt has already fired (for a
		// context done before the watch began, it has, or is about to).
		closeBody(req)
		wrote(trace, err)
		pc.finish(stop, true)
		return nil, fail(ctx, "write request", err)
	}
	w := req
	if trace != nil {
		// Request.Write reports WroteRequest to the trace in the request's context as soon as the
		// request is in the buffer, before the flush. This copy's context has none: the report comes
		// below, once the request is on its way or has failed.
		w = req.WithContext(context.Background())
	}
	pc.meter.written = 0
	done, err := writeRequest(pc.bw, w) // closes req.Body when done
	if !done {
		err = w.Write(pc.bw) // closes req.Body
	}
	if err == nil {
		err = pc.bw.Flush()
	}
	if err != nil {
		if pc.meter.written > 0 {
			err = &partialWriteError{err}
		}
		wrote(trace, err)
		pc.finish(stop, false)
		return nil, fail(ctx, "write request", err)
	}
	wrote(trace, nil)

	resp, err := pc.readAnswer(trace, req)
	if err != nil {
		pc.finish(stop, false)
		return nil, fail(ctx, "read answer", err)
	}
	resp.TLS = pc.tlsState
	keep := resp.ProtoAtLeast(1, 1) && !resp.Close && !req.Close
	if resp.Body == http.NoBody {
		// HEAD, 204, 304, Content-Length: 0: the answer is complete, and the connection free.
		pc.finish(stop, keep)
		return resp, nil
	}
	resp.Body = &body{pc: pc, rc: resp.Body, ctx: ctx, stop: stop, keep: keep}
	return resp, nil
}

// readAnswer reads the status line and headers of the final answer to req, skipping informational ones.
func (pc *conn) readAnswer(trace *httptrace.ClientTrace, req *http.Request) (*http.Response, error) {
	if trace != nil && trace.GotFirstResponseByte != nil {
		if _, err := pc.br.Peek(1); err == nil {
			trace.GotFirstResponseByte()
		}
	}
	for n := 0; ; n++ {
		pc.meter.readLeft = maxHeaderBytes
		resp, done, err := readResponse(pc.br, req)
		if !done {
			resp, err = http.ReadResponse(pc.br, req)
		}
		pc.meter.readLeft = math.MaxInt64
		if err != nil {
			return nil, err
		}
		code := resp.StatusCode
		switch {
		case code < 100 || code > 199:
			return resp, nil
		case code == http.StatusSwitchingProtocols:
			// Upgrades go to net/http; this one was not asked for.
			return nil, errors.New("unexpected 101 Switching Protocols")
		case n == max1xx:
			return nil, errors.New("too many 1xx informational answers")
		}
		if trace != nil && trace.Got1xxResponse != nil {
			if err := trace.Got1xxResponse(code, textproto.MIMEHeader(resp.Header)); err != nil {
				return nil, err
			}
		}
	}
}

// watch makes pc's reads and writes end with ctx: the deadline of ctx on the connection, and an
// interrupt when ctx is cancelled. stop ends the watch (nil when ctx cannot be cancelled); it reports
// false when the interrupt has run or is running.
func (pc *conn) watch(ctx context.Context) (stop func() bool) {
	dl, _ := ctx.Deadline()
	if !dl.Equal(pc.deadline) {
		pc.raw.SetDeadline(dl)
		pc.deadline = dl
	}
	if ctx.Done() == nil {
		return nil
	}
	return context.AfterFunc(ctx, pc.interrupt)
}

// finish ends pc's request: the connection goes back to the idle list if keep says it may carry
// another, the context's interrupt cannot touch it any more and nothing unread is waiting on it, and is
// closed otherwise.
func (pc *conn) finish(stop func() bool, keep bool) {
	if stop != nil && !stop() {
		keep = false
	}
	if keep && pc.br.Buffered() == 0 {
		pc.t.putIdle(pc)
		return
	}
	pc.close()
}

func (pc *conn) close() { pc.top.Close() }

// body is an answer's body: it reads from the connection, and its Close hands the connection back (or
// closes it).
type body struct {
	pc  *conn
	rc  io.ReadCloser // http.ReadResponse's body: Content-Length, chunked, or until the connection ends
	ctx context.Context

	mu      sync.Mutex
	stop    func() bool // ends the context watch; nil once ended
	keep    bool        // the answer allows another request on the connection, and no read failed
	reading bool
	eof     bool
	closed  bool
}

func (b *body) Read(p []byte) (int, error) {
	b.mu.Lock()
	switch {
	case b.closed:
		b.mu.Unlock()
		return 0, http.ErrBodyReadAfterClose
	case b.eof:
		b.mu.Unlock()
		return 0, io.EOF
	}
	b.reading = true
	b.mu.Unlock()

	n, err := b.rc.Read(p)

	b.mu.Lock()
	b.reading = false
	switch {
	case err == io.EOF:
		b.eof = true
		// The answer is complete: a context that ends before Close must not cost the connection.
		if b.stop != nil && !b.stop() {
			b.keep = false
		}
		b.stop = nil
	case err != nil:
		b.keep = false
	}
	b.mu.Unlock()
	if err != nil && err != io.EOF {
		if cerr := ctxErr(b.ctx, err); cerr != nil {
			err = &canceledError{op: "read body", err: cerr, cause: context.Cause(b.ctx)}
		}
	}
	return n, err
}

// Close hands the connection back when the body was read to its end, and closes it otherwise (also
// ending a Read in progress). The rest of an unread body is not read: that could take as long as the
// server pleases.
func (b *body) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	keep := b.keep && b.eof && !b.reading
	stop := b.stop
	b.mu.Unlock()
	b.pc.finish(stop, keep)
	return nil
}

// meter sits on the TCP connection, under TLS. It counts the bytes handed to the kernel, so that a
// failed write can tell whether any of the request may have reached the server, and bounds the bytes
// read while an answer's headers are parsed.
type meter struct {
	net.Conn
	written  int64
	readLeft int64
}

var errHeaderTooLarge = fmt.Errorf("answer headers larger than %d bytes", maxHeaderBytes)

func (m *meter) Write(p []byte) (int, error) {
	n, err := m.Conn.Write(p)
	m.written += int64(n)
	return n, err
}

func (m *meter) Read(p []byte) (int, error) {
	if m.readLeft <= 0 {
		return 0, errHeaderTooLarge
	}
	if int64(len(p)) > m.readLeft {
		p = p[:m.readLeft]
	}
	n, err := m.Conn.Read(p)
	m.readLeft -= int64(n)
	return n, err
}

// partialWriteError is the WroteRequest error of a write that failed after some of the request was
// handed to the connection: it may have reached the server, and Tracker counts it as written.
type partialWriteError struct{ err error }

func (e *partialWriteError) Error() string { return "request partly sent: " + e.err.Error() }
func (e *partialWriteError) Unwrap() error { return e.err }

// canceledError is the error of an operation the request's context ended. Like the context's own
// DeadlineExceeded, it says Timeout() when the deadline passed, for url.Error.Timeout.
type canceledError struct {
	op    string
	err   error // ctx.Err()
	cause error // context.Cause(ctx)
}

func (e *canceledError) Error() string {
	if e.cause != nil && e.cause != e.err {
		return e.op + ": " + e.err.Error() + ": " + e.cause.Error()
	}
	return e.op + ": " + e.err.Error()
}

func (e *canceledError) Unwrap() []error { return []error{e.err, e.cause} }
func (e *canceledError) Timeout() bool   { return errors.Is(e.err, context.DeadlineExceeded) }

// fail wraps the error of op, saying the context's error when the context is what ended it.
func fail(ctx context.Context, op string, err error) error {
	if cerr := ctxErr(ctx, err); cerr != nil {
		return &canceledError{op: op, err: cerr, cause: context.Cause(ctx)}
	}
	return fmt.Errorf("%s: %w", op, err)
}

// ctxErr returns the context's error when the context ended an operation that failed with err, and nil
// otherwise. The connection's deadline, set from the context's, can pass a moment before the context
// says so.
func ctxErr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
			return context.DeadlineExceeded
		}
	}
	return nil
}

func wrote(trace *httptrace.ClientTrace, err error) {
	if trace != nil && trace.WroteRequest != nil {
		trace.WroteRequest(httptrace.WroteRequestInfo{Err: err})
	}
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}
