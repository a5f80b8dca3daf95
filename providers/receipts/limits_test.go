package receipts_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/providers/receipts"
)

// bodyProbe is a request body that counts what is read of it. Without a limit it is endless; block
// makes each Read wait until release is closed (a client still sending), after saying on started that
// the body is being read.
type bodyProbe struct {
	read    atomic.Int64
	block   bool
	once    sync.Once
	started chan struct{}
	release chan struct{}
}

func newProbe(block bool) *bodyProbe {
	return &bodyProbe{block: block, started: make(chan struct{}), release: make(chan struct{})}
}

func (p *bodyProbe) Read(b []byte) (int, error) {
	p.once.Do(func() { close(p.started) })
	if p.block {
		<-p.release
		return 0, errors.New("client went away")
	}
	for i := range b {
		b[i] = 'a'
	}
	p.read.Add(int64(len(b)))
	return len(b), nil
}

// probeRequest is a POST to path whose body is p, with the given Content-Length (-1: none, as chunked).
func probeRequest(path string, p *bodyProbe, length int64, hdr map[string]string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, path, p)
	r.ContentLength = length
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	return r
}

// wellFormedSig is a syntactically valid ECDSA signature that verifies nothing.
var wellFormedSig = base64.StdEncoding.EncodeToString([]byte{0x30, 0x06, 0x02, 0x01, 0x01, 0x02, 0x01, 0x01})

type limitCase struct {
	name     string
	h        *receipts.Handler
	path     string
	max      int64
	signed   map[string]string // headers that pass the header checks
	sk       *sink
	inFlight int64
}

func limitCases(t *testing.T) []limitCase {
	sg := newSigner(t)
	var twSink, sgSink sink
	sgh, err := receipts.SendGridHandler(sg.public, &sgSink, nil)
	if err != nil {
		t.Fatal(err)
	}
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	return []limitCase{
		{"twilio", receipts.TwilioHandler(twilioToken, "https://hooks.example.com", &twSink, nil), "/twilio/status", receipts.MaxTwilioBody,
			map[string]string{"X-Twilio-Signature": "bm90IGEgc2lnbmF0dXJl", "Content-Type": "application/x-www-form-urlencoded"}, &twSink, receipts.TwilioInFlight},
		{"sendgrid", sgh, "/sendgrid/events", receipts.MaxSendGridBody,
			map[string]string{sigHeader: sg.sign(t, ts, []byte("[]")), tsHeader: ts, "Content-Type": "application/json"}, &sgSink, receipts.SendGridInFlight},
	}
}

// A Content-Length over the limit is answered 413 before a byte of the body is read.
func TestOversizedBodyIsRefusedUnread(t *testing.T) {
	for _, c := range limitCases(t) {
		t.Run(c.name, func(t *testing.T) {
			p := newProbe(false)
			if code := serve(c.h, probeRequest(c.path, p, c.max+1, c.signed)); code != http.StatusRequestEntityTooLarge {
				t.Errorf("status %d, want 413", code)
			}
			if n := p.read.Load(); n != 0 {
				t.Errorf("%d bytes of the body were read, want none", n)
			}
			if got := c.h.Stats().Rejected[receipts.ReasonMalformed]; got != 1 || len(c.sk.all()) != 0 {
				t.Errorf("malformed %d (want 1), recorded %d", got, len(c.sk.all()))
			}
		})
	}
}

// A body without a Content-Length (chunked) is read no further than the limit.
func TestBodyWithoutLengthIsReadNoFurtherThanTheLimit(t *testing.T) {
	for _, c := range limitCases(t) {
		t.Run(c.name, func(t *testing.T) {
			p := newProbe(false)
			if code := serve(c.h, probeRequest(c.path, p, -1, c.signed)); code != http.StatusRequestEntityTooLarge {
				t.Errorf("status %d, want 413", code)
			}
			if n := p.read.Load(); n > c.max+1 {
				t.Errorf("%d bytes of the body were read, want at most %d", n, c.max+1)
			}
			if len(c.sk.all()) != 0 {
				t.Errorf("recorded %+v", c.sk.all())
			}
		})
	}
}

// What the headers alone condemn is refused before the body is read; a signature is checked before any
// of the content is looked at.
func TestSignatureComesBeforeTheBody(t *testing.T) {
	sg := newSigner(t)
	var sgSink, twSink sink
	sgh, err := receipts.SendGridHandler(sg.public, &sgSink, nil)
	if err != nil {
		t.Fatal(err)
	}
	twh := receipts.TwilioHandler(twilioToken, "https://hooks.example.com", &twSink, nil)
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	notASN1 := base64.StdEncoding.EncodeToString([]byte("not a DER signature"))
	for _, tt := range []struct {
		name   string
		h      *receipts.Handler
		path   string
		hdr    map[string]string
		reason string
	}{
		{"twilio unsigned", twh, "/twilio/status", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, receipts.ReasonUnsigned},
		{"sendgrid unsigned", sgh, "/sendgrid/events", nil, receipts.ReasonUnsigned},
		{"sendgrid no timestamp", sgh, "/sendgrid/events", map[string]string{sigHeader: wellFormedSig}, receipts.ReasonUnsigned},
		{"sendgrid signature not base64", sgh, "/sendgrid/events", map[string]string{sigHeader: "%%%", tsHeader: ts}, receipts.ReasonBadSignature},
		{"sendgrid signature not ASN.1", sgh, "/sendgrid/events", map[string]string{sigHeader: notASN1, tsHeader: ts}, receipts.ReasonBadSignature},
		{"sendgrid signature too long", sgh, "/sendgrid/events", map[string]string{sigHeader: strings.Repeat("A", 4096), tsHeader: ts}, receipts.ReasonBadSignature},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := tt.h.Stats().Rejected[tt.reason]
			p := newProbe(false)
			if code := serve(tt.h, probeRequest(tt.path, p, 1000, tt.hdr)); code != http.StatusForbidden {
				t.Errorf("status %d, want 403", code)
			}
			if n := p.read.Load(); n != 0 {
				t.Errorf("%d bytes of the body were read, want none", n)
			}
			if got := tt.h.Stats().Rejected[tt.reason] - before; got != 1 {
				t.Errorf("rejected[%s] grew by %d, want 1", tt.reason, got)
			}
		})
	}

	// Content that would be refused as malformed is refused as forged when the signature is wrong: the
	// signature is checked first.
	other := newSigner(t)
	junk := []byte(`{"not": "an array"`)
	if code := serve(sgh, eventRequest(junk, other.sign(t, ts, junk), ts)); code != http.StatusForbidden {
		t.Errorf("sendgrid: undecodable body under another key's signature: status %d, want 403", code)
	}
	noSID := callbackForm("delivered", "")
	noSID.Del("MessageSid")
	noSID.Del("SmsSid")
	if code := serve(twh, twilioRequest("/twilio/status", noSID, sign("otherToken", "https://hooks.example.com/twilio/status", noSID))); code != http.StatusForbidden {
		t.Errorf("twilio: incomplete form under another token's signature: status %d, want 403", code)
	}
	if len(sgSink.all())+len(twSink.all()) != 0 {
		t.Errorf("recorded %+v %+v", sgSink.all(), twSink.all())
	}
}

// Bodies being read at once are bounded: once the room is taken, a request waits, then is answered 503
// with Retry-After and its body unread; room comes back when a body is done with.
func TestBodiesInFlightAreBounded(t *testing.T) {
	for _, c := range limitCases(t) {
		t.Run(c.name, func(t *testing.T) {
			receipts.SetTimings(c.h, 200*time.Millisecond, 10*time.Second)
			var wg sync.WaitGroup
			var probes []*bodyProbe
			for range c.inFlight {
				p := newProbe(true)
				probes = append(probes, p)
				wg.Go(func() { serve(c.h, probeRequest(c.path, p, c.max, c.signed)) })
				select {
				case <-p.started:
				case <-time.After(10 * time.Second):
					t.Fatalf("body %d of %d is not being read", len(probes), c.inFlight)
				}
			}
			for _, size := range []int64{c.max, 1} {
				p := newProbe(false)
				w := httptest.NewRecorder()
				start := time.Now()
				c.h.ServeHTTP(w, probeRequest(c.path, p, size, c.signed))
				if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" {
					t.Errorf("%d-byte body with the room taken: status %d, Retry-After %q; want 503 with Retry-After", size, w.Code, w.Header().Get("Retry-After"))
				}
				if waited := time.Since(start); waited < 150*time.Millisecond || waited > 5*time.Second {
					t.Errorf("answered after %s, want after the 200ms wait", waited)
				}
				if n := p.read.Load(); n != 0 {
					t.Errorf("%d bytes of the refused body were read", n)
				}
			}
			if got := c.h.Stats().Rejected[receipts.ReasonBusy]; got != 2 {
				t.Errorf("rejected[busy] = %d, want 2", got)
			}
			for _, p := range probes {
				close(p.release)
			}
			wg.Wait()
			// The room is back: a full-size body is read again (and refused for its signature).
			p := newProbe(false)
			if code := serve(c.h, probeRequest(c.path, p, -1, c.signed)); code != http.StatusRequestEntityTooLarge || p.read.Load() == 0 {
				t.Errorf("after the bodies were done with: status %d with %d bytes read; want 413 after reading", code, p.read.Load())
			}
			if len(c.sk.all()) != 0 {
				t.Errorf("recorded %+v", c.sk.all())
			}
		})
	}
}

// A body trickled in is cut off once its time is up (the grace, plus its size at the minimum pace), on
// a real connection.
func TestTrickledBodyIsCutOff(t *testing.T) {
	var sk sink
	h := receipts.TwilioHandler(twilioToken, "", &sk, nil)
	receipts.SetTimings(h, time.Second, 500*time.Millisecond)
	srv := httptest.NewServer(h)
	defer srv.Close()

	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	form := callbackForm("delivered", "").Encode()
	fmt.Fprintf(conn, "POST /twilio/status HTTP/1.1\r\nHost: %s\r\nX-Twilio-Signature: %s\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: %d\r\n\r\n",
		srv.Listener.Addr(), sign(twilioToken, srv.URL+"/twilio/status", callbackForm("delivered", "")), len(form))
	start := time.Now()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for i := range len(form) {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if _, err := conn.Write([]byte{form[i]}); err != nil {
				return
			}
		}
	}()
	conn.SetReadDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("no answer within 5s of a trickled body (%v): it was not cut off", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Errorf("status %d, want 408", resp.StatusCode)
	}
	if took > 2*time.Second {
		t.Errorf("cut off after %s, want about 0.5s", took.Round(time.Millisecond))
	}
	if len(sk.all()) != 0 {
		t.Errorf("recorded %+v", sk.all())
	}
}

// slowSink records after delay, unless the request's context ends first.
type slowSink struct {
	delay time.Duration
	sink
}

func (s *slowSink) Record(ctx context.Context, rs []receipts.Receipt) error {
	select {
	case <-time.After(s.delay):
		return s.sink.Record(ctx, rs)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// The body's deadline is the body's: a sink slower than it still records, and the request is answered
// 204 (a deadline that covered the sink would cancel the request's context).
func TestSlowSinkOutlivesTheBodyDeadline(t *testing.T) {
	sk := &slowSink{delay: time.Second}
	h := receipts.TwilioHandler(twilioToken, "", sk, nil)
	receipts.SetTimings(h, time.Second, 200*time.Millisecond)
	srv := httptest.NewServer(h)
	defer srv.Close()
	form := callbackForm("delivered", "")
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/twilio/status", strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("X-Twilio-Signature", sign(twilioToken, srv.URL+"/twilio/status", form))
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body) //nolint:errcheck
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent || len(sk.all()) != 1 {
		t.Errorf("status %d with %d receipts recorded, want 204 and 1", resp.StatusCode, len(sk.all()))
	}
}

// ctxSink fails a record whose request's context has ended.
type ctxSink struct{ sink }

func (s *ctxSink) Record(ctx context.Context, rs []receipts.Receipt) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.sink.Record(ctx, rs)
}

// Requests refused without a body, before reading it or after, leave their connection fit for the next
// one: the callback that follows on it is recorded (a read deadline there would have ended the
// connection's context).
func TestRefusalWithoutBodyKeepsTheConnection(t *testing.T) {
	sk := &ctxSink{}
	h := receipts.TwilioHandler(twilioToken, "", sk, nil)
	receipts.SetTimings(h, time.Second, 100*time.Millisecond)
	srv := httptest.NewServer(h)
	defer srv.Close()
	var conns atomic.Int32
	client := srv.Client()
	post := func(body string, hdr map[string]string) int {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/twilio/status", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(info httptrace.GotConnInfo) {
				if !info.Reused {
					conns.Add(1)
				}
			},
		}))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post("", nil); code != http.StatusForbidden {
		t.Fatalf("unsigned empty POST: %d, want 403", code)
	}
	if code := post("", map[string]string{"X-Twilio-Signature": "Zm9yZ2Vk"}); code != http.StatusForbidden {
		t.Fatalf("forged empty POST: %d, want 403", code)
	}
	time.Sleep(300 * time.Millisecond) // past any deadline the refusals might have left
	form := callbackForm("delivered", "")
	hdr := map[string]string{"Content-Type": "application/x-www-form-urlencoded", "X-Twilio-Signature": sign(twilioToken, srv.URL+"/twilio/status", form)}
	if code := post(form.Encode(), hdr); code != http.StatusNoContent || len(sk.all()) != 1 {
		t.Errorf("callback after it: %d with %d recorded, want 204 and 1", code, len(sk.all()))
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections, want both requests on one", n)
	}
}
