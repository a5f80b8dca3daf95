package wire_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/providers/internal/wire"
)

// server is an httptest server that counts the connections it accepts and the requests it serves, and
// tells when a connection closes or goes idle.
type server struct {
	*httptest.Server
	dials  atomic.Int64
	hits   atomic.Int64
	closed chan struct{} // one value per connection closed or hijacked
	idle   chan net.Conn // the server's side of each connection that went idle
}

func newServer(t *testing.T, h http.HandlerFunc) *server { return startServer(t, h, false) }

func startServer(t *testing.T, h http.HandlerFunc, tls bool) *server {
	t.Helper()
	s := &server{closed: make(chan struct{}, 1024), idle: make(chan net.Conn, 1024)}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		h(w, r)
	}))
	s.Config.ConnState = func(c net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			s.dials.Add(1)
		case http.StateIdle:
			select {
			case s.idle <- c:
			default:
			}
		case http.StateClosed, http.StateHijacked:
			s.closed <- struct{}{}
		}
	}
	if tls {
		s.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshake a test makes fail on purpose
		s.StartTLS()
	} else {
		s.Start()
	}
	t.Cleanup(s.Close)
	return s
}

// waitClosed waits until the server has seen a connection close.
func (s *server) waitClosed(t *testing.T) {
	t.Helper()
	select {
	case <-s.closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the server saw no connection close")
	}
}

func (s *server) wantDials(t *testing.T, want int64) {
	t.Helper()
	if got := s.dials.Load(); got != want {
		t.Errorf("the server accepted %d connections, want %d", got, want)
	}
}

// clock is the clock of a Transport's idle times in a test.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func newTransport(t *testing.T) (*wire.Transport, *clock) {
	tr := &wire.Transport{}
	c := &clock{now: time.Now()}
	wire.SetClock(tr, c.Now)
	t.Cleanup(tr.CloseIdleConnections)
	return tr, c
}

// send sends a request through rt and returns the answer's body, read to the end and closed.
func send(rt http.RoundTripper, ctx context.Context, method, target, body string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, method, target, strings.NewReader(body))
	if err != nil {
		return "", err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return string(data), err
}

// mustSend is send that ends the test on an error or an answer other than want.
func mustSend(t *testing.T, rt http.RoundTripper, method, target, want string) {
	t.Helper()
	got, err := send(rt, context.Background(), method, target, "To=%2B905551234567&Body=hello")
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	if got != want {
		t.Fatalf("%s %s: answer %q, want %q", method, target, got, want)
	}
}

func answer(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	io.WriteString(w, "ok "+r.URL.Path)
}

func TestTransportReusesAConnection(t *testing.T) {
	s := newServer(t, answer)
	tr, _ := newTransport(t)
	for i := range 5 {
		mustSend(t, tr, http.MethodPost, fmt.Sprintf("%s/%d", s.URL, i), fmt.Sprintf("ok /%d", i))
	}
	s.wantDials(t, 1)
	if got := s.hits.Load(); got != 5 {
		t.Errorf("the server served %d requests, want 5", got)
	}
}

// The connection that went idle last is the one reused: the others, idle longer, are left to expire.
func TestTransportReusesTheConnectionIdleLeast(t *testing.T) {
	var arrived sync.WaitGroup
	arrived.Add(2)
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/pair" {
			arrived.Done()
			arrived.Wait() // both requests in flight at once: two connections
		}
		answer(w, r)
	})
	tr, _ := newTransport(t)
	type sent struct {
		local string // the client's address on the connection
		resp  *http.Response
		err   error
	}
	conn := func(path string) sent {
		var local string
		ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
			GotConn: func(info httptrace.GotConnInfo) { local = info.Conn.LocalAddr().String() },
		})
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+path, nil)
		resp, err := tr.RoundTrip(req)
		return sent{local, resp, err}
	}
	pair := make(chan sent, 2)
	for range 2 {
		go func() { pair <- conn("/pair") }()
	}
	first, second := <-pair, <-pair
	for _, s := range []sent{first, second} { // second goes idle last
		if s.err != nil {
			t.Fatal(s.err)
		}
		io.Copy(io.Discard, s.resp.Body)
		s.resp.Body.Close()
	}
	next := conn("/next")
	if next.err != nil {
		t.Fatal(next.err)
	}
	next.resp.Body.Close()
	if next.local != second.local {
		t.Errorf("reused the connection from %s, want %s, idle last (the other: %s)", next.local, second.local, first.local)
	}
	s.wantDials(t, 2)
}

// http.Client.CloseIdleConnections reaches the Transport, which closes what is idle.
func TestTransportClosesIdleConnectionsOnRequest(t *testing.T) {
	s := newServer(t, answer)
	tr, _ := newTransport(t)
	client := &http.Client{Transport: tr}
	mustSend(t, tr, http.MethodGet, s.URL, "ok /")
	client.CloseIdleConnections()
	s.waitClosed(t)
	mustSend(t, tr, http.MethodGet, s.URL, "ok /")
	s.wantDials(t, 2)
}

// A connection the server closed while it sat idle for more than a second is found closed before it
// is used: the next request goes on a new connection, and arrives once.
func TestTransportDialsAnewWhenTheServerClosedAnIdleConnection(t *testing.T) {
	s := newServer(t, answer)
	tr, clock := newTransport(t)
	mustSend(t, tr, http.MethodPost, s.URL+"/first", "ok /first")
	s.CloseClientConnections()
	s.waitClosed(t)
	clock.Advance(2 * time.Second)

	var trk wire.Tracker
	got, err := send(tr, trk.WithTrace(context.Background()), http.MethodPost, s.URL+"/second", "Body=hello")
	if err != nil || got != "ok /second" {
		t.Fatalf("request after the server closed the idle connection: %q, %v", got, err)
	}
	if got := s.hits.Load(); got != 2 {
		t.Errorf("the server served %d requests, want 2", got)
	}
	s.wantDials(t, 2)
}

func TestTransportTLS(t *testing.T) {
	s := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Proto)
	}, true)
	trusting := &wire.Transport{TLSClientConfig: s.Client().Transport.(*http.Transport).TLSClientConfig}
	t.Cleanup(trusting.CloseIdleConnections)
	for range 2 {
		resp, err := trusting.RoundTrip(httptest.NewRequest(http.MethodGet, s.URL, nil).WithContext(context.Background()))
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(data) != "HTTP/1.1" || resp.TLS == nil || resp.TLS.NegotiatedProtocol != "http/1.1" {
			t.Errorf("answer %q over %+v, want HTTP/1.1 negotiated over TLS", data, resp.TLS)
		}
	}
	s.wantDials(t, 1)

	// Without the test's root, the server's certificate is refused, and nothing was written.
	var trk wire.Tracker
	_, err := send(&wire.Transport{}, trk.WithTrace(context.Background()), http.MethodGet, s.URL, "")
	var verr *tls.CertificateVerificationError
	if !errors.As(err, &verr) {
		t.Errorf("err %v, want a certificate verification error", err)
	}
	if trk.Written() {
		t.Error("Written() = true after a failed handshake")
	}
}

// The requests Transport does not send itself go to net/http, which sends them as it would.
func TestTransportHandsToNetHTTP(t *testing.T) {
	t.Run("proxy", func(t *testing.T) {
		proxy := newServer(t, func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "proxied "+r.URL.String())
		})
		proxyURL, _ := url.Parse(proxy.URL)
		tr := &wire.Transport{Proxy: http.ProxyURL(proxyURL)}
		t.Cleanup(tr.CloseIdleConnections)
		var trk wire.Tracker
		got, err := send(tr, trk.WithTrace(context.Background()), http.MethodPost, "http://provider.invalid/send", "Body=hello")
		if err != nil || got != "proxied http://provider.invalid/send" {
			t.Fatalf("through the proxy: %q, %v", got, err)
		}
		if !trk.Written() {
			t.Error("Written() = false for a request the proxy answered")
		}
	})
	t.Run("expect 100-continue", func(t *testing.T) {
		s := newServer(t, answer)
		tr, _ := newTransport(t)
		waited := false
		ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{Wait100Continue: func() { waited = true }})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/expect", strings.NewReader("Body=hello"))
		req.Header.Set("Expect", "100-continue")
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if !waited {
			t.Error("the request was sent without waiting for 100 Continue")
		}
	})
	t.Run("refused", func(t *testing.T) {
		s := newServer(t, answer)
		tr, _ := newTransport(t)
		req, _ := http.NewRequest(http.MethodGet, s.URL, nil)
		req.Header["X-Split"] = []string{"a\r\nX-Injected: 1"}
		if _, err := tr.RoundTrip(req); err == nil || !strings.Contains(err.Error(), "invalid header") {
			t.Errorf("header with a line break: %v, want net/http's invalid header error", err)
		}
		req, _ = http.NewRequest(http.MethodGet, "ftp://"+s.Listener.Addr().String(), nil)
		if _, err := tr.RoundTrip(req); err == nil || !strings.Contains(err.Error(), "unsupported protocol scheme") {
			t.Errorf("ftp: %v, want net/http's unsupported scheme error", err)
		}
		if got := s.hits.Load(); got != 0 {
			t.Errorf("the server served %d requests, want none", got)
		}
	})
}

// By default the proxy of the environment applies: a request HTTP_PROXY covers goes to net/http, through
// the proxy. http.ProxyFromEnvironment reads the environment once a process, so the request is sent by a
// child process of the test binary, started with HTTP_PROXY set.
func TestTransportProxyFromEnvironment(t *testing.T) {
	if os.Getenv("WIRE_TEST_PROXY_CHILD") != "" {
		tr := &wire.Transport{}
		got, err := send(tr, context.Background(), http.MethodPost, "http://provider.invalid/send", "Body=hello")
		if err != nil || got != "proxied http://provider.invalid/send" {
			t.Fatalf("with HTTP_PROXY=%s: %q, %v", os.Getenv("HTTP_PROXY"), got, err)
		}
		return
	}
	proxy := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "proxied "+r.URL.String())
	})
	cmd := exec.Command(os.Args[0], "-test.run=^TestTransportProxyFromEnvironment$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "WIRE_TEST_PROXY_CHILD=1", "HTTP_PROXY="+proxy.URL, "NO_PROXY=", "no_proxy=", "REQUEST_METHOD=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the child process failed: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "--- PASS: TestTransportProxyFromEnvironment") {
		t.Fatalf("the child process did not run the test:\n%s", out)
	}
	if got := proxy.hits.Load(); got != 1 {
		t.Errorf("the proxy served %d requests, want 1", got)
	}
}

// An idle connection is closed after IdleConnTimeout, by the sweep or when it is next taken.
func TestTransportClosesConnectionsIdleTooLong(t *testing.T) {
	t.Run("sweep", func(t *testing.T) {
		s := newServer(t, answer)
		tr, clock := newTransport(t)
		mustSend(t, tr, http.MethodGet, s.URL, "ok /")
		clock.Advance(wire.IdleConnTimeout - time.Second)
		wire.Sweep(tr)
		mustSend(t, tr, http.MethodGet, s.URL, "ok /")
		s.wantDials(t, 1)
		clock.Advance(wire.IdleConnTimeout + time.Second)
		wire.Sweep(tr)
		s.waitClosed(t)
		mustSend(t, tr, http.MethodGet, s.URL, "ok /")
		s.wantDials(t, 2)
	})
	t.Run("taken", func(t *testing.T) {
		s := newServer(t, answer)
		tr, clock := newTransport(t)
		mustSend(t, tr, http.MethodGet, s.URL, "ok /")
		clock.Advance(wire.IdleConnTimeout + time.Second)
		mustSend(t, tr, http.MethodGet, s.URL, "ok /")
		s.wantDials(t, 2)
	})
}

// Many goroutines share a Transport, each getting its own answer; run with -race.
func TestTransportConcurrentUse(t *testing.T) {
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body) // all of it first: the server ends the body once the answer starts
		w.Write(body)
	})
	tr, _ := newTransport(t)
	const senders, each = 16, 40
	var wg sync.WaitGroup
	for g := range senders {
		wg.Go(func() {
			for i := range each {
				body := fmt.Sprintf("sender=%d&message=%d&pad=%s", g, i, strings.Repeat("z", i*37))
				got, err := send(tr, context.Background(), http.MethodPost, s.URL, body)
				if err != nil || got != body {
					t.Errorf("sender %d message %d: answer of %d bytes %.40q, %v; want %d bytes", g, i, len(got), got, err, len(body))
					return
				}
			}
		})
	}
	wg.Wait()
	if n := s.dials.Load(); n > senders {
		t.Errorf("%d senders dialled %d connections", senders, n)
	}
}
