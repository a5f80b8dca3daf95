package wire_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/campaignctl/campaignctl/providers/internal/wire"
)

// The race left: a connection idle for less than a second is not checked. When the server reset it,
// the write fails before anything leaves, and the Tracker says so: the request may be sent again.
func TestTransportWriteOnAResetConnectionIsNotWritten(t *testing.T) {
	s := newServer(t, answer)
	tr, _ := newTransport(t)
	mustSend(t, tr, http.MethodPost, s.URL+"/first", "ok /first")
	c := <-s.idle
	c.(*net.TCPConn).SetLinger(0) // close with a reset
	c.Close()
	s.waitClosed(t)

	var trk wire.Tracker
	_, err := send(tr, trk.WithTrace(context.Background()), http.MethodPost, s.URL+"/second", "Body=hello")
	if err == nil {
		t.Fatal("a request written on a reset connection succeeded")
	}
	if !trk.Connected() || trk.Written() {
		t.Errorf("Connected() = %v, Written() = %v, want true, false (%v)", trk.Connected(), trk.Written(), err)
	}
	if got := s.hits.Load(); got != 1 {
		t.Errorf("the server served %d requests, want 1", got)
	}
}

// A write that failed after part of the request left may have reached the server.
func TestTransportWriteFailedPartwayIsWritten(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		c.Read(make([]byte, 1))
		c.Close() // unread data: a reset
	}()

	tr, _ := newTransport(t)
	var trk wire.Tracker
	var writeErr error
	ctx := httptrace.WithClientTrace(trk.WithTrace(context.Background()), &httptrace.ClientTrace{
		WroteRequest: func(info httptrace.WroteRequestInfo) { writeErr = info.Err },
	})
	const size = 64 << 20 // more than the socket buffers hold
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+ln.Addr().String()+"/", io.LimitReader(zeros{}, size))
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = size
	if _, err := tr.RoundTrip(req); err == nil {
		t.Fatal("a request the server reset succeeded")
	}
	if writeErr == nil {
		t.Fatal("the write did not fail: the test did not reach a write that failed partway")
	}
	if !trk.Written() {
		t.Errorf("Written() = false after a write that failed partway (%v), want true", writeErr)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// An answer that says Connection: close, and a request that does, end the connection.
func TestTransportConnectionClose(t *testing.T) {
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/close" {
			w.Header().Set("Connection", "close")
		}
		answer(w, r)
	})
	tr, _ := newTransport(t)
	mustSend(t, tr, http.MethodPost, s.URL+"/close", "ok /close")
	mustSend(t, tr, http.MethodPost, s.URL+"/keep", "ok /keep")
	s.wantDials(t, 2)

}

// A request that says Connection: close ends its connection, even when the server would keep it.
func TestTransportRequestConnectionClose(t *testing.T) {
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/asked" {
			answer(w, r)
			return
		}
		// A server that ignores the request's Connection: close, and answers whatever comes next on
		// the connection with an answer that gives it away.
		rw := hijackOpen(t, w)
		if rw == nil {
			return
		}
		rw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		rw.Flush()
		if _, err := http.ReadRequest(rw.Reader); err == nil {
			rw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 16\r\n\r\nwrong connection")
			rw.Flush()
		}
	})
	tr, _ := newTransport(t)
	req, _ := http.NewRequest(http.MethodGet, s.URL+"/asked", nil)
	req.Close = true
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	mustSend(t, tr, http.MethodPost, s.URL+"/keep", "ok /keep")
	s.wantDials(t, 2)
}

func TestTransportChunkedAnswer(t *testing.T) {
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		for i := range 3 {
			fmt.Fprintf(w, "part %d;", i)
			w.(http.Flusher).Flush()
		}
	})
	tr, _ := newTransport(t)
	for range 2 {
		resp, err := tr.RoundTrip(httptest.NewRequest(http.MethodGet, s.URL, nil).WithContext(context.Background()))
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(data) != "part 0;part 1;part 2;" {
			t.Fatalf("chunked answer %q, %v", data, err)
		}
		if diff := cmp.Diff([]string{"chunked"}, resp.TransferEncoding); diff != "" {
			t.Errorf("Transfer-Encoding (-want +got):\n%s", diff)
		}
	}
	s.wantDials(t, 1)
}

// An answer that ends with the connection (no length, not chunked) is read to the end, and the
// connection is not reused.
func TestTransportCloseDelimitedAnswer(t *testing.T) {
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/until-close" {
			answer(w, r)
			return
		}
		c, bw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		bw.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end")
		bw.Flush()
		c.Close()
	})
	tr, _ := newTransport(t)
	mustSend(t, tr, http.MethodGet, s.URL+"/until-close", "until the end")
	mustSend(t, tr, http.MethodGet, s.URL+"/next", "ok /next")
	s.wantDials(t, 2)
}

// A connection with bytes after the answer (a second answer nobody asked for) is not reused: they
// would be taken for the next request's answer.
func TestTransportDropsAConnectionWithBytesAfterTheAnswer(t *testing.T) {
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/extra" {
			answer(w, r)
			return
		}
		bw := hijackOpen(t, w) // left open: only the client can tell the answer is bad
		if bw == nil {
			return
		}
		bw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale")
		bw.Flush()
	})
	tr, _ := newTransport(t)
	mustSend(t, tr, http.MethodGet, s.URL+"/extra", "ok")
	mustSend(t, tr, http.MethodGet, s.URL+"/next", "ok /next")
	s.wantDials(t, 2)
}

// A body closed before its end closes the connection, at once: what is left of the body is not read.
func TestTransportBodyClosedEarly(t *testing.T) {
	large := strings.Repeat("x", 1<<20)
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/large" {
			io.WriteString(w, large)
			return
		}
		answer(w, r)
	})
	tr, _ := newTransport(t)
	resp, err := tr.RoundTrip(httptest.NewRequest(http.MethodGet, s.URL+"/large", nil).WithContext(context.Background()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if _, err := resp.Body.Read(make([]byte, 1)); !errors.Is(err, http.ErrBodyReadAfterClose) {
		t.Errorf("read after Close: %v, want %v", err, http.ErrBodyReadAfterClose)
	}
	mustSend(t, tr, http.MethodGet, s.URL+"/next", "ok /next")
	s.wantDials(t, 2)
}

// A body closed partway, when the rest has not arrived yet, closes the connection too: the rest would
// be taken for the next request's answer.
func TestTransportBodyClosedBeforeTheRestArrived(t *testing.T) {
	rest := make(chan struct{})
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/slow" {
			answer(w, r)
			return
		}
		w.Header().Set("Content-Length", "20")
		io.WriteString(w, "0123456789")
		w.(http.Flusher).Flush()
		<-rest
		io.WriteString(w, "abcdefghij")
	})
	sendRest := sync.OnceFunc(func() { close(rest) })
	t.Cleanup(sendRest) // before the server's Close, which waits for its handlers
	tr, _ := newTransport(t)
	resp, err := tr.RoundTrip(httptest.NewRequest(http.MethodGet, s.URL+"/slow", nil).WithContext(context.Background()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	sendRest()
	mustSend(t, tr, http.MethodGet, s.URL+"/next", "ok /next")
	s.wantDials(t, 2)
}

// An answer without a body (HEAD, 204, 304) frees the connection at once, even if its body is never
// read.
func TestTransportAnswersWithoutBody(t *testing.T) {
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/204":
			w.WriteHeader(http.StatusNoContent)
		case "/304":
			w.WriteHeader(http.StatusNotModified)
		default:
			answer(w, r) // for HEAD, the server sends the length and not the body
		}
	})
	tr, _ := newTransport(t)
	for _, tt := range []struct {
		method, path string
		status       int
	}{{http.MethodHead, "/head", 200}, {http.MethodGet, "/204", 204}, {http.MethodGet, "/304", 304}} {
		req, _ := http.NewRequest(tt.method, s.URL+tt.path, nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s %s: %v", tt.method, tt.path, err)
		}
		if resp.StatusCode != tt.status || resp.Body == nil {
			t.Errorf("%s %s: status %d, body %v, want %d and a body", tt.method, tt.path, resp.StatusCode, resp.Body, tt.status)
		}
	}
	mustSend(t, tr, http.MethodGet, s.URL+"/last", "ok /last")
	s.wantDials(t, 1)
}

// held starts a server that holds every answer until the test ends, and reports each arrival.
func held(t *testing.T) (*server, chan struct{}) {
	arrived := make(chan struct{}, 16)
	release := make(chan struct{})
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		arrived <- struct{}{}
		<-release
	})
	t.Cleanup(func() { close(release) }) // before the server's Close, which waits for its handlers
	return s, arrived
}

// roundTripWithin runs rt.RoundTrip(req) and ends the test if it does not return within 5 s.
func roundTripWithin(t *testing.T, rt http.RoundTripper, req *http.Request) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		resp, err := rt.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("the request did not end with its context")
		return nil
	}
}

// A deadline that passes while the server holds the answer ends the request, which may have arrived:
// context.WithTimeout's, and Until's, which has no Done channel for the transport to watch (its parent's
// cancellation does not reach it) and ends the request at its time all the same, with the same error.
func TestTransportContextDeadlineWhileWaiting(t *testing.T) {
	for _, tc := range []struct {
		name    string
		withCtx func(parent context.Context) (context.Context, func())
	}{
		{"WithTimeout", func(parent context.Context) (context.Context, func()) {
			return context.WithTimeout(parent, 300*time.Millisecond)
		}},
		{"Until, its parent cancelled", func(parent context.Context) (context.Context, func()) {
			parent, cancel := context.WithCancel(parent)
			cancel()
			ctx := wire.Until(parent, time.Now().Add(300*time.Millisecond))
			if ctx.Done() != nil || ctx.Err() != nil {
				t.Fatalf("Until's context: Done %v, Err %v after its parent was cancelled; want neither", ctx.Done(), ctx.Err())
			}
			return ctx, func() {}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := held(t)
			tr, _ := newTransport(t)
			var trk wire.Tracker
			ctx, cancel := tc.withCtx(trk.WithTrace(context.Background()))
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL, strings.NewReader("Body=hello"))
			start := time.Now()
			err := roundTripWithin(t, tr, req)
			if d := time.Since(start); d < 250*time.Millisecond {
				t.Errorf("the request ended after %v; want at its deadline, 300ms", d)
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("err %v, want context.DeadlineExceeded", err)
			}
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Errorf("err %v is not a net.Error that says Timeout()", err)
			}
			if !trk.Written() {
				t.Error("Written() = false for a request the server was holding (or the trace in the context's values was not reached)")
			}
		})
	}
}

// Cancelling the context while the server holds the answer ends the request, which may have arrived.
func TestTransportCancelWhileWaiting(t *testing.T) {
	s, arrived := held(t)
	tr, _ := newTransport(t)
	var trk wire.Tracker
	ctx, cancel := context.WithCancel(trk.WithTrace(context.Background()))
	go func() {
		<-arrived
		cancel()
	}()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL, strings.NewReader("Body=hello"))
	if err := roundTripWithin(t, tr, req); !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	if !trk.Written() {
		t.Error("Written() = false for a request the server was holding")
	}
}

// A context cancelled once the connection is there, before the write, sends nothing, on a new
// connection or a reused one, and the Tracker says so.
func TestTransportCancelledBeforeTheWrite(t *testing.T) {
	s := newServer(t, answer)
	tr, _ := newTransport(t)
	for _, reused := range []bool{false, true} {
		var trk wire.Tracker
		ctx, cancel := context.WithCancel(context.Background())
		ctx = httptrace.WithClientTrace(trk.WithTrace(ctx), &httptrace.ClientTrace{
			GotConn: func(info httptrace.GotConnInfo) {
				if info.Reused != reused {
					t.Errorf("GotConn Reused = %v, want %v", info.Reused, reused)
				}
				cancel()
			},
		})
		_, err := send(tr, ctx, http.MethodPost, s.URL, "Body=hello")
		if !errors.Is(err, context.Canceled) {
			t.Errorf("reused %v: err %v, want context.Canceled", reused, err)
		}
		if !trk.Connected() || trk.Written() {
			t.Errorf("reused %v: Connected() = %v, Written() = %v, want true, false", reused, trk.Connected(), trk.Written())
		}
		if got := s.hits.Load(); got != 0 {
			t.Errorf("reused %v: the server served %d requests, want none", reused, got)
		}
		if !reused {
			// Leave a connection idle for the second round; the warm-up goes around the server's count.
			mustSend(t, tr, http.MethodGet, s.URL, "ok /")
			s.hits.Store(0)
		}
	}
}

// A context that ends after the answer was read, before its body is closed (a deferred cancel that runs
// first), leaves the connection reusable.
func TestTransportKeepsTheConnectionWhenTheContextEndsAfterTheAnswer(t *testing.T) {
	s := newServer(t, answer)
	tr, _ := newTransport(t)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL, nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(resp.Body); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	mustSend(t, tr, http.MethodGet, s.URL, "ok /")
	s.wantDials(t, 1)
}

// traced records the client trace reports that Tracker and a reader of the trace care about.
type traced struct {
	mu     sync.Mutex
	events []string
}

func (r *traced) add(format string, args ...any) {
	r.mu.Lock()
	r.events = append(r.events, fmt.Sprintf(format, args...))
	r.mu.Unlock()
}

func (r *traced) context() context.Context {
	return httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		GetConn: func(hostPort string) { r.add("GetConn %s", hostPort) },
		GotConn: func(info httptrace.GotConnInfo) {
			r.add("GotConn reused=%v wasIdle=%v", info.Reused, info.WasIdle)
		},
		WroteRequest:         func(info httptrace.WroteRequestInfo) { r.add("WroteRequest err=%v", info.Err) },
		GotFirstResponseByte: func() { r.add("GotFirstResponseByte") },
	})
}

// The trace hears what net/http would tell it, in the same order.
func TestTransportTracesAsNetHTTP(t *testing.T) {
	s := newServer(t, answer)
	addr := s.Listener.Addr().String()
	want := []string{
		"GetConn " + addr, "GotConn reused=false wasIdle=false", "WroteRequest err=<nil>", "GotFirstResponseByte",
		"GetConn " + addr, "GotConn reused=true wasIdle=true", "WroteRequest err=<nil>", "GotFirstResponseByte",
	}
	tr, _ := newTransport(t)
	std := &http.Transport{}
	t.Cleanup(std.CloseIdleConnections)
	for _, rt := range []struct {
		name string
		rt   http.RoundTripper
	}{{"net/http", std}, {"wire", tr}} {
		var r traced
		for range 2 {
			if _, err := send(rt.rt, r.context(), http.MethodPost, s.URL, "Body=hello"); err != nil {
				t.Fatal(err)
			}
		}
		r.mu.Lock()
		if diff := cmp.Diff(want, r.events); diff != "" {
			t.Errorf("%s trace (-want +got):\n%s", rt.name, diff)
		}
		r.mu.Unlock()
	}
}

// Transport adds no Accept-Encoding: a server that would compress answers when asked sends them plain.
func TestTransportAsksForNoCompression(t *testing.T) {
	var asked atomic.Value
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		asked.Store(r.Header.Get("Accept-Encoding"))
		if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			io.WriteString(w, "plain answer")
			return
		}
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		io.WriteString(zw, "plain answer")
		zw.Close()
	})
	tr, _ := newTransport(t)
	mustSend(t, tr, http.MethodGet, s.URL, "plain answer")
	if got := asked.Load(); got != "" {
		t.Errorf("Accept-Encoding %q, want none", got)
	}
}

// The request arrives on the wire as net/http writes it: same request line, Host and headers, no
// additions but the User-Agent net/http adds too.
func TestTransportWritesTheRequestAsNetHTTP(t *testing.T) {
	got := make(chan string, 2)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			br := bufio.NewReader(c)
			req, err := http.ReadRequest(br)
			if err != nil {
				c.Close()
				continue
			}
			var buf bytes.Buffer
			req.Header.Del("Accept-Encoding") // net/http's own, for its transparent gzip
			fmt.Fprintf(&buf, "%s %s %s\n", req.Method, req.RequestURI, req.Host)
			req.Header.Write(&buf)
			body, _ := io.ReadAll(req.Body)
			buf.Write(body)
			got <- buf.String()
			io.WriteString(c, "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
			c.Close()
		}
	}()
	var seen []string
	for _, rt := range []http.RoundTripper{&http.Transport{}, &wire.Transport{}} {
		req, _ := http.NewRequest(http.MethodPost, "http://"+ln.Addr().String()+"/2010-04-01/Accounts/AC1/Messages.json?x=1", strings.NewReader("To=%2B90&Body=hi"))
		req.SetBasicAuth("AC1", "token")
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		seen = append(seen, <-got)
	}
	if diff := cmp.Diff(seen[0], seen[1]); diff != "" {
		t.Errorf("request as written (-net/http +wire):\n%s", diff)
	}
}

// An answer the server held past the request's deadline, and sends late, is never read as the answer of
// the next request: the connection the held request was written on is closed, not put back for the next
// request to take unchecked (it was idle for less than a second). Read on it, the late answer would
// record one recipient's message as another's, or a refused send as accepted.
func TestTransportNeverReadsAHeldAnswerAsTheNextOne(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/held" {
			<-release
			io.WriteString(w, "late answer to /held")
			return
		}
		answer(w, r)
	})
	t.Cleanup(free) // before the server's Close, which waits for its handlers
	tr, _ := newTransport(t)
	mustSend(t, tr, http.MethodPost, s.URL+"/first", "ok /first") // a connection in the pool, as in a running worker

	var trk wire.Tracker
	ctx, cancel := context.WithTimeout(trk.WithTrace(context.Background()), 100*time.Millisecond)
	defer cancel()
	if _, err := send(tr, ctx, http.MethodPost, s.URL+"/held", "Body=held"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("held request: err %v, want context.DeadlineExceeded", err)
	}
	if !trk.Written() {
		t.Error("Written() = false for a request the server was holding")
	}

	// The late answer goes out once the next request is written, wherever it was written.
	wrote := make(chan struct{})
	next := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) { close(wrote) },
	})
	type result struct {
		body string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		body, err := send(tr, next, http.MethodPost, s.URL+"/next", "Body=next")
		done <- result{body, err}
	}()
	select {
	case <-wrote:
	case <-time.After(5 * time.Second):
		t.Fatal("the next request was never written")
	}
	free()
	select {
	case r := <-done:
		if r.err != nil || r.body != "ok /next" {
			t.Fatalf("the next request read %q (%v), want its own answer %q", r.body, r.err, "ok /next")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the next request got no answer")
	}
	s.wantDials(t, 2)
}

// hijackOpen takes w's connection over from the server for a handler that answers by hand and leaves it
// open; the test closes it at its end. nil: the takeover failed (reported).
func hijackOpen(t *testing.T, w http.ResponseWriter) *bufio.ReadWriter {
	c, rw, err := w.(http.Hijacker).Hijack()
	if err != nil {
		t.Error(err)
		return nil
	}
	t.Cleanup(func() { c.Close() })
	return rw
}
