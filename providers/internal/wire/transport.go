package wire

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// IdleConnTimeout is how long a connection may wait in the idle list before Transport closes it, as in
// net/http's default transport: servers and load balancers drop idle connections after a minute or
// two, and a connection they have dropped is worse than none.
const IdleConnTimeout = 90 * time.Second

const (
	// checkIdleAfter is how long a connection must have been idle before it is checked (conn.alive)
	// before reuse. Checking costs a system call; a server rarely drops a connection within a second of
	// answering on it without saying so (Connection: close).
	checkIdleAfter = time.Second
	// maxHeaderBytes bounds the status line and headers of an answer, so that a broken server cannot
	// fill the memory. Provider answers carry a few hundred bytes of headers.
	maxHeaderBytes = 1 << 20
	// max1xx bounds the informational answers (103 Early Hints, an unasked 100 Continue) skipped
	// before the final answer, as net/http does.
	max1xx = 5
	// The dial and handshake bounds of net/http's default transport, which apply when the request's
	// context has no earlier deadline.
	dialTimeout         = 30 * time.Second
	dialKeepAlive       = 30 * time.Second
	tlsHandshakeTimeout = 10 * time.Second
)

var dialer = net.Dialer{Timeout: dialTimeout, KeepAlive: dialKeepAlive}

// Transport is an HTTP/1.1 keep-alive RoundTripper that writes a request and reads its answer on the
// calling goroutine. net/http's Transport hands each request to a writer goroutine and takes the answer
// from a reader goroutine per connection; on a machine where goroutine hand-offs, context switches and
// system calls are expensive that is the largest part of a request's client CPU. Here a request costs
// the writes and reads it needs and nothing else: no goroutine per connection or per request, and no
// read ahead on an idle connection.
//
// Connections are kept per host (scheme, host and port) in a LIFO idle list of at most
// MaxIdleConnsPerHost; one idle for longer than IdleConnTimeout is closed. A connection goes back to
// the list only when the answer's body was read to its end and closed, the answer allows keep-alive
// (HTTP/1.1, no Connection: close, nor on the request) and nothing follows it on the connection; a body
// closed early closes the connection. A connection idle for more than a second is checked without
// blocking before reuse, and dropped if the server has closed it (or sent something unasked).
//
// Transport never sends a request twice, not even one that wrote nothing before failing: a provider may
// have accepted a POST whose answer was lost, and the caller decides, with a Tracker, whether to send
// it again. What is left is a race: a server may close a connection after the check and before the
// request reaches it (its idle timeout expiring just then, or a connection idle for less than a
// second). The request then fails after it was written, and its Tracker says so: ambiguous, never
// resent.
//
// It hands to a net/http Transport (a clone of http.DefaultTransport keeping as many idle connections,
// with the same Proxy and TLSClientConfig) every request it cannot send as net/http would:
//   - a scheme other than http and https, a URL without a host or with a host that is not ASCII;
//   - a request a proxy applies to (Proxy, by default http.ProxyFromEnvironment);
//   - a request with an Expect header (100-continue), a protocol upgrade (Upgrade header) or the
//     CONNECT method;
//   - a request that asks for HTTP/2 or later (ProtoMajor above 1);
//   - a request net/http refuses (no header, an invalid method, header or trailer), so that the error
//     is net/http's.
//
// Unlike net/http, it speaks only HTTP/1.1, over TLS too (ALPN offers "http/1.1" alone); it adds no
// Accept-Encoding (net/http asks for gzip and decompresses the answer itself; unasked, a server sends
// it uncompressed); it writes the whole request before reading the answer (a server that answers
// before it has read a large body, and stops reading, fails the write); and it watches the request's
// context, not the deprecated Request.Cancel.
//
// Give a request its time limit as a deadline on its context rather than with http.Client.Timeout: for
// a RoundTripper that is not net/http's own, the client enforces Timeout with a goroutine, a timer and
// a cancel channel per request, which is the kind of cost this Transport exists to avoid.
//
// The request's httptrace.ClientTrace hears GetConn, GotConn (Reused and WasIdle set for a connection
// from the idle list), TLSHandshakeStart and TLSHandshakeDone, WroteRequest once the request is flushed
// (with Err when the write or the flush failed; see Tracker for a write that failed part way),
// GotFirstResponseByte and Got1xxResponse; the DNS and connect hooks are the dialer's.
//
// Set the fields before the first request. A Transport is safe for concurrent use.
type Transport struct {
	// MaxIdleConnsPerHost is the most idle connections kept per host. Zero means MaxIdleConns.
	MaxIdleConnsPerHost int
	// TLSClientConfig, when set, is the TLS configuration of https connections (tests trust an
	// httptest server's certificate with it). It is cloned; ServerName defaults to the URL's host, and
	// NextProtos is always "http/1.1". Nil means crypto/tls's defaults: the system roots.
	TLSClientConfig *tls.Config
	// Proxy returns the proxy of a request, as http.Transport.Proxy; a request it names one for goes
	// to net/http. Nil means http.ProxyFromEnvironment.
	Proxy func(*http.Request) (*url.URL, error)

	// now is the clock of idle times; nil means time.Now. Tests move it instead of sleeping.
	now func() time.Time

	fallbackOnce sync.Once
	fallback     atomic.Pointer[http.Transport]

	mu         sync.Mutex
	hosts      map[hostKey]*host
	sweeper    *time.Timer // closes connections idle for too long; armed while any are idle
	sweepArmed bool
	// closeIdle: CloseIdleConnections was called and no request has started since; a connection
	// coming back is closed, as net/http does.
	closeIdle bool
}

// hostKey names the connections that can carry a request: scheme, and host:port in lower case with the
// scheme's port made explicit.
type hostKey struct {
	https bool
	addr  string
}

// host is the idle list of one hostKey.
type host struct {
	key  hostKey
	tls  *tls.Config // https only: TLSClientConfig for this host
	idle []*conn     // oldest first: the last one went idle last and is reused first
	// warming counts the connections Warm is opening, so that calls at once do not open them twice.
	warming int
	// promised are the connections Warm calls made ready for requests still to come, oldest first: each
	// request taking a connection uses up one of the oldest, and what is not used within promiseHold
	// lapses. A Warm counts the others' as taken, so that the requests of one caller do not take the
	// connections another warmed and leave that one's requests to open their own.
	promised []promise
	pending  int // the connections promised holds, summed
}

// promise is n connections a Warm call made ready, kept for requests until until.
type promise struct {
	n     int
	until time.Time
}

// promiseHold is how long the connections a Warm call made ready are kept for its requests. The caller
// takes a rate limit's tokens in between, which under a low cap shared by many callers takes seconds.
const promiseHold = 10 * time.Second

// keepLocked drops h's lapsed promises; with use, a request takes a connection and uses up one of the
// oldest. It returns the connections still promised. t.mu must be held.
func (h *host) keepLocked(now time.Time, use bool) int {
	k := 0
	for k < len(h.promised) && now.After(h.promised[k].until) {
		h.pending -= h.promised[k].n
		k++
	}
	if use && k < len(h.promised) {
		h.pending--
		if h.promised[k].n--; h.promised[k].n == 0 {
			k++
		}
	}
	if k > 0 {
		n := copy(h.promised, h.promised[k:])
		clear(h.promised[n:])
		h.promised = h.promised[:n]
	}
	return h.pending
}

// RoundTrip sends req and returns its answer, or hands req to net/http (see Transport). The answer's
// body reads from the connection: read it to the end and close it to reuse the connection.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !t.handles(req) {
		return t.fallbackTransport().RoundTrip(req)
	}
	ctx := req.Context()
	trace := httptrace.ContextClientTrace(ctx)
	pc, err := t.getConn(ctx, trace, req.URL)
	if err != nil {
		closeBody(req)
		if cerr := ctxErr(ctx, err); cerr != nil {
			return nil, &canceledError{op: "dial", err: cerr, cause: context.Cause(ctx)}
		}
		return nil, err // net's and crypto/tls's errors say what failed
	}
	return pc.roundTrip(ctx, trace, req)
}

// handles reports whether RoundTrip can send req itself (see Transport for what it cannot).
func (t *Transport) handles(req *http.Request) bool {
	u := req.URL
	switch {
	case u == nil || req.Header == nil:
		return false
	case u.Scheme != "http" && u.Scheme != "https":
		return false
	case u.Host == "" || !isASCII(u.Host):
		return false
	case req.ProtoMajor > 1:
		return false
	case req.Method == http.MethodConnect || (req.Method != "" && !isToken(req.Method)):
		return false
	case len(req.Header["Expect"]) > 0 || len(req.Header["Upgrade"]) > 0:
		return false
	case !validHeader(req.Header) || !validHeader(req.Trailer):
		return false
	}
	proxy := t.Proxy
	if proxy == nil {
		proxy = http.ProxyFromEnvironment
	}
	p, err := proxy(req)
	return p == nil && err == nil
}

// fallbackTransport returns the net/http Transport of the requests RoundTrip does not send itself.
func (t *Transport) fallbackTransport() *http.Transport {
	t.fallbackOnce.Do(func() {
		var ft *http.Transport
		if base, ok := http.DefaultTransport.(*http.Transport); ok {
			ft = base.Clone()
		} else {
			ft = &http.Transport{DialContext: dialer.DialContext, ForceAttemptHTTP2: true,
				IdleConnTimeout: IdleConnTimeout, TLSHandshakeTimeout: tlsHandshakeTimeout, ExpectContinueTimeout: time.Second}
		}
		ft.MaxIdleConns = t.maxIdle()
		ft.MaxIdleConnsPerHost = ft.MaxIdleConns
		ft.Proxy = t.Proxy
		if ft.Proxy == nil {
			ft.Proxy = http.ProxyFromEnvironment
		}
		if t.TLSClientConfig != nil {
			ft.TLSClientConfig = t.TLSClientConfig.Clone()
		}
		t.fallback.Store(ft)
	})
	return t.fallback.Load()
}

// CloseIdleConnections closes the idle connections, its own and net/http's. Connections in use are
// closed when their request ends, unless a new request starts first.
func (t *Transport) CloseIdleConnections() {
	var idle []*conn
	t.mu.Lock()
	for _, h := range t.hosts {
		idle = append(idle, h.idle...)
		clear(h.idle)
		h.idle = h.idle[:0]
	}
	t.closeIdle = true
	if t.sweeper != nil {
		t.sweeper.Stop()
	}
	t.sweepArmed = false
	t.mu.Unlock()
	for _, pc := range idle {
		pc.close()
	}
	if ft := t.fallback.Load(); ft != nil {
		ft.CloseIdleConnections()
	}
}

func (t *Transport) maxIdle() int {
	if t.MaxIdleConnsPerHost > 0 {
		return t.MaxIdleConnsPerHost
	}
	return MaxIdleConns
}

func (t *Transport) clock() time.Time {
	if t.now != nil {
		return t.now()
	}
	return time.Now()
}

// keyOf returns the hostKey of u.
func keyOf(u *url.URL) hostKey {
	key := hostKey{https: u.Scheme == "https", addr: u.Host}
	if u.Port() == "" {
		port := "80"
		if key.https {
			port = "443"
		}
		key.addr = net.JoinHostPort(u.Hostname(), port)
	}
	key.addr = strings.ToLower(key.addr)
	return key
}

// newHost returns the idle list of key, whose host is u's. t.mu must be held.
func (t *Transport) newHostLocked(key hostKey, u *url.URL) *host {
	h := &host{key: key}
	if key.https {
		cfg := &tls.Config{}
		if t.TLSClientConfig != nil {
			cfg = t.TLSClientConfig.Clone()
		}
		if cfg.ServerName == "" {
			cfg.ServerName = strings.ToLower(u.Hostname())
		}
		cfg.NextProtos = []string{"http/1.1"}
		h.tls = cfg
	}
	if t.hosts == nil {
		t.hosts = make(map[hostKey]*host)
	}
	t.hosts[key] = h
	return h
}

// Warm opens connections to u's host until n of them are ready for the caller's next requests (at most
// the idle limit): idle, or being opened, beyond those that earlier calls made ready and their requests
// have not yet taken (for up to promiseHold). It returns once the ones it dialled are open (TCP and, for
// https, the TLS handshake) and idle, or have failed: the first error, if any. A request that will go
// through a proxy is not warmed. A caller that is about to take a rate limit's tokens for n requests warms
// first, so that no request holds its tokens through a connection's set-up, even while other callers
// (the other batch runs of a worker) send on the same host.
func (t *Transport) Warm(ctx context.Context, u *url.URL, n int) error {
	key := keyOf(u)
	want := min(n, t.maxIdle())
	if want <= 0 {
		return nil
	}
	now := t.clock()
	t.mu.Lock()
	t.closeIdle = false
	h := t.hosts[key]
	if h == nil {
		h = t.newHostLocked(key, u)
	}
	need := min(h.keepLocked(now, false)+want, t.maxIdle())
	h.promised = append(h.promised, promise{n: want, until: now.Add(promiseHold)})
	h.pending += want
	missing := need - len(h.idle) - h.warming
	t.mu.Unlock()
	// The usual case, connections already open, costs a lookup: the proxy is asked only when one is missing.
	if missing <= 0 || !t.handles(&http.Request{Method: http.MethodPost, URL: u, Header: http.Header{}, ProtoMajor: 1, ProtoMinor: 1}) {
		return nil
	}
	t.mu.Lock()
	missing = need - len(h.idle) - h.warming
	if missing <= 0 {
		t.mu.Unlock()
		return nil
	}
	h.warming += missing
	t.mu.Unlock()
	errs := make(chan error, missing)
	for range missing {
		go func() {
			pc, err := t.dial(ctx, nil, h)
			t.mu.Lock()
			h.warming--
			t.mu.Unlock()
			if err == nil {
				t.putIdle(pc)
			}
			errs <- err
		}()
	}
	var first error
	for range missing {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Warm warms n connections to u through rt (Transport.Warm) when rt is a Transport of this package, the
// RoundTripper NewTransport returns; through any other, connections are opened by the requests themselves.
func Warm(ctx context.Context, rt http.RoundTripper, u *url.URL, n int) error {
	if t, ok := rt.(*Transport); ok {
		return t.Warm(ctx, u, n)
	}
	return nil
}

// getConn returns a connection to u's host: the idle one used last, if it is still open, or a new one.
func (t *Transport) getConn(ctx context.Context, trace *httptrace.ClientTrace, u *url.URL) (*conn, error) {
	key := keyOf(u)
	if trace != nil && trace.GetConn != nil {
		trace.GetConn(key.addr)
	}
	var h *host
	for first := true; ; first = false {
		var pc *conn
		var idle time.Duration
		h, pc, idle = t.takeIdle(key, u, first)
		if pc == nil {
			break
		}
		if idle > checkIdleAfter && !pc.alive() {
			pc.close()
			continue
		}
		if trace != nil && trace.GotConn != nil {
			trace.GotConn(httptrace.GotConnInfo{Conn: pc.top, Reused: true, WasIdle: true, IdleTime: idle})
		}
		return pc, nil
	}
	pc, err := t.dial(ctx, trace, h)
	if err != nil {
		return nil, err
	}
	if trace != nil && trace.GotConn != nil {
		trace.GotConn(httptrace.GotConnInfo{Conn: pc.top})
	}
	return pc, nil
}

// takeIdle returns the idle list of key (made on first use) and takes off it the connection that went
// idle last, with how long it was idle; nil when there is none. When that one has been idle too long,
// so have all the others: it closes them all and returns none. A request's first call uses up one
// connection a Warm promised (host.promised), whether an idle one is found or the request dials its own.
func (t *Transport) takeIdle(key hostKey, u *url.URL, first bool) (*host, *conn, time.Duration) {
	now := t.clock()
	t.mu.Lock()
	t.closeIdle = false
	h := t.hosts[key]
	if h == nil {
		h = t.newHostLocked(key, u)
	}
	if first && len(h.promised) > 0 {
		h.keepLocked(now, true)
	}
	n := len(h.idle)
	if n == 0 {
		t.mu.Unlock()
		return h, nil, 0
	}
	pc := h.idle[n-1]
	idle := now.Sub(pc.idleAt)
	if idle <= IdleConnTimeout {
		h.idle[n-1] = nil
		h.idle = h.idle[:n-1]
		t.mu.Unlock()
		return h, pc, idle
	}
	stale := append([]*conn(nil), h.idle...)
	clear(h.idle)
	h.idle = h.idle[:0]
	t.mu.Unlock()
	for _, pc := range stale {
		pc.close()
	}
	return h, nil, 0
}

// putIdle puts pc, ready for another request, on its host's idle list, or closes it when the list is
// full (as net/http does with the connection coming back) or CloseIdleConnections asked for it.
func (t *Transport) putIdle(pc *conn) {
	pc.idleAt = t.clock()
	t.mu.Lock()
	h := pc.h
	if t.closeIdle || len(h.idle) >= t.maxIdle() {
		t.mu.Unlock()
		pc.close()
		return
	}
	h.idle = append(h.idle, pc)
	if !t.sweepArmed {
		t.armSweepLocked(IdleConnTimeout)
	}
	t.mu.Unlock()
}

// armSweepLocked makes sweep run after d. t.mu must be held.
func (t *Transport) armSweepLocked(d time.Duration) {
	t.sweepArmed = true
	if t.sweeper == nil {
		t.sweeper = time.AfterFunc(d, t.sweep)
		return
	}
	t.sweeper.Reset(d)
}

// sweep closes the connections idle for longer than IdleConnTimeout and arms itself for when the
// oldest of the others will be. One timer per Transport rather than one per idle connection (net/http
// keeps one per connection): a put or take from the idle list touches no timer.
func (t *Transport) sweep() {
	now := t.clock()
	var stale []*conn
	next := time.Duration(-1)
	t.mu.Lock()
	for _, h := range t.hosts {
		// The list is oldest first, so the connections idle too long are a prefix of it.
		k := 0
		for k < len(h.idle) && now.Sub(h.idle[k].idleAt) > IdleConnTimeout {
			k++
		}
		if k > 0 {
			stale = append(stale, h.idle[:k]...)
			n := copy(h.idle, h.idle[k:])
			clear(h.idle[n:])
			h.idle = h.idle[:n]
		}
		if len(h.idle) > 0 {
			if wait := IdleConnTimeout - now.Sub(h.idle[0].idleAt); next < 0 || wait < next {
				next = wait
			}
		}
	}
	t.sweepArmed = false
	if next >= 0 {
		// A little late rather than early: the connection is then surely past its time.
		t.armSweepLocked(next + 10*time.Millisecond)
	}
	t.mu.Unlock()
	for _, pc := range stale {
		pc.close()
	}
}

// dial opens a connection to h and, for https, shakes hands over TLS, within ctx.
func (t *Transport) dial(ctx context.Context, trace *httptrace.ClientTrace, h *host) (*conn, error) {
	raw, err := dialer.DialContext(ctx, "tcp", h.key.addr)
	if err != nil {
		return nil, err
	}
	pc := &conn{t: t, h: h, raw: raw, top: raw, meter: &meter{Conn: raw, readLeft: math.MaxInt64}}
	pc.interrupt = func() { raw.SetDeadline(aLongTimeAgo) }
	var rw io.ReadWriter = pc.meter
	if h.key.https {
		tc := tls.Client(pc.meter, h.tls)
		if err := handshake(ctx, trace, tc); err != nil {
			raw.Close()
			return nil, err
		}
		state := tc.ConnectionState()
		pc.top, pc.tlsState, rw = tc, &state, tc
	}
	pc.br = bufio.NewReaderSize(rw, 4<<10)
	pc.bw = bufio.NewWriterSize(rw, 4<<10)
	return pc, nil
}

// handshake runs the TLS handshake of tc within ctx and at most tlsHandshakeTimeout.
func handshake(ctx context.Context, trace *httptrace.ClientTrace, tc *tls.Conn) error {
	if trace != nil && trace.TLSHandshakeStart != nil {
		trace.TLSHandshakeStart()
	}
	hctx, cancel := context.WithTimeout(ctx, tlsHandshakeTimeout)
	defer cancel()
	err := tc.HandshakeContext(hctx)
	if trace != nil && trace.TLSHandshakeDone != nil {
		trace.TLSHandshakeDone(tc.ConnectionState(), err)
	}
	if err != nil {
		return err
	}
	if p := tc.ConnectionState().NegotiatedProtocol; p != "" && p != "http/1.1" {
		return fmt.Errorf("tls: server chose protocol %q, not the http/1.1 offered", p)
	}
	return nil
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// isToken reports whether s is an RFC 9110 token: a valid method or header field name.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !tokenByte(s[i]) {
			return false
		}
	}
	return true
}

// validHeader reports whether every field name of h is a token and no value holds a control character
// other than tab, as net/http requires before sending.
func validHeader(h http.Header) bool {
	for k, vv := range h {
		if !isToken(k) {
			return false
		}
		for _, v := range vv {
			for i := 0; i < len(v); i++ {
				if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
					return false
				}
			}
		}
	}
	return true
}
