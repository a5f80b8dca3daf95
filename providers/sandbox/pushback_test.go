package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/sandbox"
	"github.com/campaignctl/campaignctl/providers/sendgrid"
	"github.com/campaignctl/campaignctl/providers/twilio"
)

// twilioProvider is the project's Twilio adapter (twilio-go) pointed at the sandbox.
func twilioProvider(t *testing.T, baseURL string) *twilio.Provider {
	t.Helper()
	p, err := twilio.New(twilio.Config{AccountSID: testSID, AuthToken: testToken, From: "+14155550100", BaseURL: baseURL, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// sendgridProvider is the project's SendGrid adapter (sendgrid-go) pointed at the sandbox.
func sendgridProvider(t *testing.T, baseURL string) *sendgrid.Provider {
	t.Helper()
	p, err := sendgrid.New(sendgrid.Config{APIKey: sgTestKey, From: "shop@example.com", BaseURL: baseURL, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func asProviderError(t *testing.T, err error) *providers.Error {
	t.Helper()
	var pe *providers.Error
	if !errors.As(err, &pe) {
		t.Fatalf("error %v is not a *providers.Error", err)
	}
	return pe
}

func timeline(t *testing.T, url string) sandbox.Timeline {
	t.Helper()
	var tl sandbox.Timeline
	getJSON(t, url, &tl)
	return tl
}

// checkTimeline checks that each second and the total add up: requests = accepted + hung + refused +
// gone, refused = the sum of refused_by, and the seconds sum to the total.
func checkTimeline(t *testing.T, tl sandbox.Timeline) {
	t.Helper()
	var sum sandbox.TimelineCounts
	check := func(what string, c sandbox.TimelineCounts) {
		by := 0
		for _, n := range c.RefusedBy {
			by += n
		}
		if c.Requests != c.Accepted+c.Hung+c.Refused+c.Gone || c.Refused != by {
			t.Errorf("%s does not add up: %+v", what, c)
		}
	}
	for i, sec := range tl.Seconds {
		check(sec.Second.String(), sec.TimelineCounts)
		if i > 0 && !sec.Second.Equal(tl.Seconds[i-1].Second.Add(time.Second)) {
			t.Errorf("second %v follows %v", sec.Second, tl.Seconds[i-1].Second)
		}
		sum.Requests += sec.Requests
		sum.Accepted += sec.Accepted
		sum.Refused += sec.Refused
		sum.Messages += sec.Messages
	}
	check("total", tl.Total)
	if sum.Requests != tl.Total.Requests || sum.Accepted != tl.Total.Accepted || sum.Refused != tl.Total.Refused || sum.Messages != tl.Total.Messages {
		t.Errorf("seconds sum to %+v, total %+v", sum, tl.Total)
	}
}

// Eight clients together offer about four times the hidden limit through twilio-go for 2.5 s. The
// sandbox's own timeline shows no second with more than the limit accepted and the full seconds close
// to it; every refusal is Twilio's 429 code 20429 without Retry-After, and nothing refused is recorded.
func TestHiddenRateLimitHoldsUnderConcurrentClients(t *testing.T) {
	const limit = 100
	s, srv := newTwilioSandbox(t, sandbox.Options{Limits: map[string]sandbox.Limit{"twilio": {Rate: limit}}})
	p := twilioProvider(t, srv.URL)
	var (
		mu          sync.Mutex
		ok, limited int
	)
	stop := time.Now().Add(2500 * time.Millisecond)
	var wg sync.WaitGroup
	for c := range 8 {
		wg.Go(func() {
			for i := 0; time.Now().Before(stop); i++ {
				_, err := p.Send(context.Background(), providers.Message{To: fmt.Sprintf("+90555%d%06d", c, i), Body: "kod"})
				mu.Lock()
				if err == nil {
					ok++
				} else {
					var pe *providers.Error
					if !errors.As(err, &pe) || pe.Status != 429 || pe.Code != 20429 || pe.RetryAfter != 0 || pe.Class != providers.Transient {
						t.Errorf("refusal %v (%+v), want 429 code 20429 with no retry hint", err, pe)
					}
					limited++
				}
				mu.Unlock()
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	wg.Wait()

	tl := timeline(t, srv.URL+"/_sandbox/timeline?api=twilio")
	checkTimeline(t, tl)
	var perSecond []string
	for _, sec := range tl.Seconds {
		perSecond = append(perSecond, fmt.Sprintf("%d/%d", sec.Accepted, sec.Requests))
	}
	t.Logf("accepted/requests per second: %v", perSecond)
	if len(tl.Seconds) < 3 {
		t.Fatalf("timeline of %d seconds, want the 2.5 s run to cover at least 3", len(tl.Seconds))
	}
	for i, sec := range tl.Seconds {
		if sec.Accepted > limit {
			t.Errorf("second %v accepted %d, limit %d", sec.Second, sec.Accepted, limit)
		}
		// The first and last seconds are partial; the ones between were pushed above the limit all along.
		if i > 0 && i < len(tl.Seconds)-1 && (sec.Accepted < limit*85/100 || sec.RefusedBy["limit"] == 0) {
			t.Errorf("full second %v: accepted %d, refused %v; want at least %d accepted and some refused",
				sec.Second, sec.Accepted, sec.RefusedBy, limit*85/100)
		}
	}
	if tl.Total.Accepted != ok || tl.Total.RefusedBy["limit"] != limited || tl.Total.Requests != ok+limited {
		t.Errorf("timeline total %+v; clients saw %d accepted, %d limited", tl.Total, ok, limited)
	}
	if n, st := len(s.Messages()), s.Stats(); n != ok || st.ByCode[20429] != limited || st.Requests != ok+limited {
		t.Errorf("recorded %d messages, stats %+v; clients saw %d accepted, %d limited", n, st, ok, limited)
	}
}

// SendGrid's 429 over the hidden limit is the documented one: X-RateLimit-Limit, -Remaining 0 and -Reset
// (Unix seconds), the body {"errors":[{"field":null,"message":"too many requests"}]}, no Retry-After.
// sendgrid-go, through the adapter, gets a transient error whose hint comes from X-RateLimit-Reset.
func TestHiddenRateLimitSendGrid(t *testing.T) {
	const limit = 3
	s, srv := newSendGridSandbox(t, sandbox.Options{Limits: map[string]sandbox.Limit{"sendgrid": {Rate: limit}}})
	p := sendgridProvider(t, srv.URL)
	ok, limited := 0, 0
	for i := range 8 {
		_, err := p.Send(context.Background(), providers.Message{To: fmt.Sprintf("u%d@example.com", i), Subject: "S", Body: "B"})
		if err == nil {
			ok++
			continue
		}
		pe := asProviderError(t, err)
		if pe.Status != 429 || pe.Class != providers.Transient || pe.RetryAfter < time.Second || pe.RetryAfter > 2*time.Second {
			t.Errorf("refusal %+v, want a transient 429 waiting out the reset (1-2 s)", pe)
		}
		limited++
	}
	if limited == 0 {
		t.Fatalf("8 requests in a row, %d accepted, none refused", ok)
	}
	seen := false
	for range 10 {
		a := sgPost(t, srv, sgTestKey, sgMail(sgPersonalization("raw@example.com", nil, nil)))
		if a.status == http.StatusAccepted {
			ok++
			continue
		}
		seen = true
		now := time.Now().Unix()
		reset, err := strconv.ParseInt(a.header.Get("X-RateLimit-Reset"), 10, 64)
		if a.status != 429 || err != nil || reset < now || reset > now+2 ||
			a.header.Get("X-RateLimit-Limit") != "3" || a.header.Get("X-RateLimit-Remaining") != "0" ||
			a.header.Get("Retry-After") != "" || a.raw != `{"errors":[{"field":null,"message":"too many requests"}]}`+"\n" {
			t.Errorf("429: %d headers %v body %q", a.status, a.header, a.raw)
		}
		break
	}
	if !seen {
		t.Error("no raw request was refused")
	}
	tl := timeline(t, srv.URL+"/_sandbox/timeline?api=sendgrid")
	checkTimeline(t, tl)
	for _, sec := range tl.Seconds {
		if sec.Accepted > limit {
			t.Errorf("second %v accepted %d, limit %d", sec.Second, sec.Accepted, limit)
		}
	}
	if n := len(s.Messages()); n != ok || tl.Total.Accepted != ok {
		t.Errorf("recorded %d, timeline accepted %d, clients saw %d", n, tl.Total.Accepted, ok)
	}
}

// Netgsm, FCM and the webhook receiver refuse over their hidden limits as each does: Netgsm with its
// rate-limit code 80 in a 200, FCM with 429 QUOTA_EXCEEDED, the webhook receiver with a 429; none with
// Retry-After, none recorded.
func TestHiddenRateLimitOtherAPIs(t *testing.T) {
	limits := map[string]sandbox.Limit{"netgsm": {Rate: 1}, "fcm": {Rate: 1}, "webhook": {Rate: 1}}
	e := newFCMSandbox(t, sandbox.Options{Limits: limits, WebhookSecret: webhookSecret})
	tok := e.token(t)
	netgsm := func() (refused bool) {
		req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/sms/rest/v2/send",
			strings.NewReader(`{"msgheader":"ACME","iysfilter":"0","messages":[{"msg":"kod","no":"5551234567"}]}`))
		req.SetBasicAuth("user", "pass")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		switch {
		case resp.StatusCode == 200 && strings.Contains(string(b), `"code":"00"`):
			return false
		case resp.StatusCode != 200 || !strings.Contains(string(b), `"code":"80"`) || resp.Header.Get("Retry-After") != "":
			t.Errorf("netgsm over the limit: %d %s", resp.StatusCode, b)
		}
		return true
	}
	fcm := func() bool {
		a := e.send(t, sendPath, tok, `{"message":{"token":"device-1","notification":{"title":"T","body":"B"}}}`)
		if a.status == 200 {
			return false
		}
		if a.status != 429 || a.google != "RESOURCE_EXHAUSTED" || a.errorCode != "QUOTA_EXCEEDED" || a.retryAfter != "" {
			t.Errorf("fcm over the limit: %+v", a)
		}
		return true
	}
	hook := func() bool {
		a := postHook(t, e.srv.URL, []byte(`{"to":"+905551234567","body":"B"}`), nil)
		if a.status == 200 {
			return false
		}
		if a.status != 429 || a.retry != "" || a.err != "too many requests" {
			t.Errorf("webhook over the limit: %+v", a)
		}
		return true
	}
	total := 0
	for name, send := range map[string]func() bool{"netgsm": netgsm, "fcm": fcm, "webhook": hook} {
		accepted, refused := 0, 0
		start := time.Now()
		for range 4 {
			if send() {
				refused++
			} else {
				accepted++
			}
		}
		// One a second: four requests in a row see one accepted, unless the machine stalled for a second.
		if refused == 0 || accepted > 1+int(time.Since(start)/time.Second) {
			t.Errorf("%s: %d accepted, %d refused", name, accepted, refused)
		}
		tl, err := e.s.TimelineOf(name, time.Time{})
		if err != nil || tl.Total.RefusedBy["limit"] != refused || tl.Total.Accepted != accepted {
			t.Errorf("%s timeline total %+v (%v)", name, tl.Total, err)
		}
		total += accepted
	}
	if n := len(e.s.Messages()); n != total {
		t.Errorf("recorded %d messages, %d accepted", n, total)
	}
}

// The concurrency limit counts requests from arrival to answer: two requests held by the timeout fault
// fill a limit of two, the next are refused at once with 429 code 20429 and no Retry-After, and once the
// held ones are let go a request passes again.
func TestConcurrencyLimit(t *testing.T) {
	s, srv := newTwilioSandbox(t, sandbox.Options{
		Limits: map[string]sandbox.Limit{"twilio": {Concurrency: 2}},
		Faults: sandbox.Faults{RateTimeout: 1},
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel) // before the server's Close, which waits for the held requests
	var held sync.WaitGroup
	for i := range 2 {
		held.Go(func() {
			form := message(fmt.Sprintf("+90555000000%d", i), "kod")
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/2010-04-01/Accounts/"+testSID+"/Messages.json", strings.NewReader(form.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.SetBasicAuth(testSID, testToken)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
				t.Errorf("a held request was answered %d", resp.StatusCode)
			}
		})
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(s.Messages()) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the two requests were not held")
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.SetFaults(sandbox.Faults{})
	p := twilioProvider(t, srv.URL)
	for range 3 {
		_, err := p.Send(context.Background(), providers.Message{To: "+905551234567", Body: "kod"})
		if pe := asProviderError(t, err); pe.Status != 429 || pe.Code != 20429 || pe.RetryAfter != 0 {
			t.Errorf("over the concurrency limit: %+v", pe)
		}
	}
	a := postMessage(t, srv, testSID, testToken, message("+905551234567", "kod"))
	if a.status != 429 || a.header.Get("Retry-After") != "" {
		t.Errorf("raw request over the concurrency limit: %d Retry-After %q", a.status, a.header.Get("Retry-After"))
	}
	cancel()
	held.Wait()
	refusedAfter := 0
	for {
		_, err := p.Send(context.Background(), providers.Message{To: "+905551234567", Body: "kod"})
		if err == nil {
			break
		}
		refusedAfter++
		if time.Now().After(deadline) {
			t.Fatalf("still refused after the held requests were let go: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	tl, _ := s.TimelineOf("twilio", time.Time{})
	if tl.Total.RefusedBy["concurrency"] != 4+refusedAfter || tl.Total.Hung != 2 || tl.Total.Accepted != 1 {
		t.Errorf("timeline total %+v", tl.Total)
	}
	if n := len(s.Messages()); n != 3 {
		t.Errorf("recorded %d messages, want the 2 held and the last", n)
	}
}

// An outage window planned at start refuses every Twilio and SendGrid request sent while it lasts (503,
// transient, no retry hint, nothing recorded) and nothing once it is over; the timeline and the stats
// say when it was.
func TestOutageWindowThroughTheSDKs(t *testing.T) {
	s := sandbox.New(sandbox.Options{
		TwilioAccountSID: testSID, TwilioAuthToken: testToken, SendGridAPIKey: sgTestKey,
		Outages: []sandbox.OutagePlan{{Only: "twilio,sendgrid", Duration: 1500 * time.Millisecond}},
	})
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	tw, sg := twilioProvider(t, srv.URL), sendgridProvider(t, srv.URL)
	active := func(api string) bool {
		for _, w := range s.Outages() {
			if w.API == api {
				return w.State == "active"
			}
		}
		t.Fatalf("no window for %s", api)
		return false
	}
	send := map[string]func() error{
		"twilio": func() error {
			_, err := tw.Send(context.Background(), providers.Message{To: "+905551234567", Body: "kod"})
			return err
		},
		"sendgrid": func() error {
			_, err := sg.Send(context.Background(), providers.Message{To: "a@example.com", Subject: "S", Body: "B"})
			return err
		},
	}
	during := 0
	for range 5 {
		for api, f := range send {
			err := f()
			if !active(api) {
				continue // the window may have closed meanwhile on a slow machine: this one proves nothing
			}
			during++
			pe := asProviderError(t, err)
			if pe.Status != 503 || pe.Class != providers.Transient || pe.RetryAfter != 0 {
				t.Errorf("%s during the outage: %+v", api, pe)
			}
		}
	}
	if during == 0 {
		t.Fatal("no request was sent during the outage")
	}
	if len(s.Messages()) != 0 {
		t.Errorf("recorded %d messages during the outage", len(s.Messages()))
	}
	deadline := time.Now().Add(5 * time.Second)
	for active("twilio") || active("sendgrid") {
		if time.Now().After(deadline) {
			t.Fatal("the outage did not end")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for api, f := range send {
		for range 3 {
			if err := f(); err != nil {
				t.Errorf("%s after the outage: %v", api, err)
			}
		}
	}
	st := s.Stats()
	if len(st.Outages) != 2 {
		t.Fatalf("stats outages %+v", st.Outages)
	}
	refused := 0
	for _, w := range st.Outages {
		if w.State != "over" || w.Mode != sandbox.Outage503 || !w.End.Equal(w.Start.Add(1500*time.Millisecond)) {
			t.Errorf("window %+v", w)
		}
		refused += w.Refused
	}
	tl := timeline(t, srv.URL+"/_sandbox/timeline?api=twilio,sendgrid")
	checkTimeline(t, tl)
	if tl.Total.RefusedBy["outage"] != refused || refused < during || tl.Total.Accepted != 6 || tl.Total.Refused != refused {
		t.Errorf("timeline total %+v, windows refused %d, %d seen during", tl.Total, refused, during)
	}
	// No second that began after the window refused anything for it.
	end := st.Outages[0].End
	for _, sec := range tl.Seconds {
		if !sec.Second.Before(end) && sec.RefusedBy["outage"] != 0 {
			t.Errorf("second %v after the window's end %v refused %d", sec.Second, end, sec.RefusedBy["outage"])
		}
	}
}

// Whatever combination of hidden limit, injected faults and bad requests the clients meet, the timeline
// counts each request once, under the reason the client saw.
func TestTimelineAddsUpToTheRequests(t *testing.T) {
	s, srv := newTwilioSandbox(t, sandbox.Options{
		Limits: map[string]sandbox.Limit{"twilio": {Rate: 150}},
		Faults: sandbox.Faults{Rate429: 0.08, Rate500: 0.08, Rate503: 0.08, RateRaw503: 0.08, RateReset: 0.08, RateTimeout: 0.03},
	})
	client := &http.Client{Timeout: 300 * time.Millisecond}
	var (
		mu  sync.Mutex
		saw = make(map[string]int)
	)
	const clients, each = 4, 60
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for i := range each {
				user, pass, form := testSID, testToken, message(fmt.Sprintf("+90555%d%06d", c, i), "kod")
				switch i % 10 {
				case 0:
					pass = "wrongtoken"
				case 1:
					form.Del("To")
				}
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/2010-04-01/Accounts/"+user+"/Messages.json", strings.NewReader(form.Encode()))
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				req.SetBasicAuth(user, pass)
				why := ""
				resp, err := client.Do(req)
				var ne interface{ Timeout() bool }
				switch {
				case err != nil && errors.As(err, &ne) && ne.Timeout():
					why = "hung"
				case err != nil:
					why = "fault_reset"
				default:
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					switch resp.StatusCode {
					case 201:
						why = "accepted"
					case 429:
						why = "limit"
						if resp.Header.Get("Retry-After") != "" {
							why = "fault_429"
						}
					case 500:
						why = "fault_500"
					case 503:
						why = "fault_503"
						if strings.HasPrefix(string(b), "<html>") {
							why = "fault_raw_503"
						}
					case 400, 401:
						why = "request"
					default:
						t.Errorf("status %d %s", resp.StatusCode, b)
					}
				}
				mu.Lock()
				saw[why]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()

	tl := timeline(t, srv.URL+"/_sandbox/timeline")
	checkTimeline(t, tl)
	got := map[string]int{"accepted": tl.Total.Accepted, "hung": tl.Total.Hung}
	for k, n := range tl.Total.RefusedBy {
		got[k] = n
	}
	for k, n := range saw {
		if got[k] != n {
			t.Errorf("%s: timeline %d, clients saw %d (timeline %v, clients %v)", k, got[k], n, got, saw)
		}
	}
	if tl.Total.Requests != clients*each || tl.Total.Gone != 0 || s.Stats().Requests != clients*each {
		t.Errorf("timeline counts %d requests (%d gone), stats %d; %d were sent", tl.Total.Requests, tl.Total.Gone, s.Stats().Requests, clients*each)
	}
	if tl.Total.Messages != len(s.Messages()) || tl.Total.Messages != saw["accepted"]+saw["hung"] {
		t.Errorf("timeline messages %d, recorded %d", tl.Total.Messages, len(s.Messages()))
	}
	for _, k := range []string{"accepted", "request", "fault_500", "fault_reset"} {
		if saw[k] == 0 {
			t.Errorf("no request ended %s: the mix did not exercise it (%v)", k, saw)
		}
	}
}

// A client that leaves during the latency is counted as gone.
func TestTimelineCountsClientsGone(t *testing.T) {
	_, srv := newTwilioSandbox(t, sandbox.Options{Latency: 2 * time.Second})
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/2010-04-01/Accounts/"+testSID+"/Messages.json", nil)
	if resp, err := (&http.Client{Timeout: 100 * time.Millisecond}).Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("answered %d before the latency", resp.StatusCode)
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		tl := timeline(t, srv.URL+"/_sandbox/timeline?api=twilio")
		if tl.Total.Gone == 1 && tl.Total.Requests == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("timeline total %+v, want one request gone", tl.Total)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func postJSONBody(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestPushbackControlAPI(t *testing.T) {
	s, srv := newTwilioSandbox(t, sandbox.Options{})
	var limits map[string]sandbox.Limit
	getJSON(t, srv.URL+"/_sandbox/limits", &limits)
	if len(limits) != 5 || limits["twilio"] != (sandbox.Limit{}) || limits["webhook"] != (sandbox.Limit{}) {
		t.Errorf("initial limits %v", limits)
	}
	if code, body := postJSONBody(t, srv.URL+"/_sandbox/limits", `{"only":"twilio,sendgrid","rate":5,"concurrency":2}`); code != 200 {
		t.Fatalf("set limits: %d %s", code, body)
	}
	if code, _ := postJSONBody(t, srv.URL+"/_sandbox/limits", `{"only":"twilio","segments":9}`); code != 200 {
		t.Fatalf("set segments: %d", code)
	}
	getJSON(t, srv.URL+"/_sandbox/limits", &limits)
	if limits["twilio"] != (sandbox.Limit{Segments: 9}) || limits["sendgrid"] != (sandbox.Limit{Rate: 5, Concurrency: 2}) || limits["fcm"] != (sandbox.Limit{}) {
		t.Errorf("limits %v", limits)
	}
	for _, bad := range []string{`{"rate":-1}`, `{"only":"twillio","rate":1}`, `{"only":"sendgrid","segments":1}`, `{"segments":1}`,
		`{"rate":"x"}`, `{"rat":1}`, `{"rate":2000000}`, ``} {
		if code, _ := postJSONBody(t, srv.URL+"/_sandbox/limits", bad); code != 400 {
			t.Errorf("POST limits %s: %d, want 400", bad, code)
		}
	}
	if s.Limits()["sendgrid"].Rate != 5 {
		t.Errorf("a refused request changed the limits: %v", s.Limits())
	}

	code, body := postJSONBody(t, srv.URL+"/_sandbox/outages", `{"only":"webhook","mode":"reset","after_ms":60000,"duration_ms":1000}`)
	if code != 200 || !strings.Contains(body, `"state":"scheduled"`) || !strings.Contains(body, `"mode":"reset"`) {
		t.Errorf("plan an outage: %d %s", code, body)
	}
	start := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	if code, body := postJSONBody(t, srv.URL+"/_sandbox/outages", `{"only":"netgsm","start":"`+start+`","duration_ms":1000}`); code != 200 || !strings.Contains(body, `"start":"`+start+`"`) {
		t.Errorf("plan an outage at a time: %d %s", code, body)
	}
	if code, body := postJSONBody(t, srv.URL+"/_sandbox/outages", `{"only":"fcm,twilio"}`); code != 200 || strings.Count(body, `"state":"active"`) != 2 || strings.Contains(body, `"end"`) {
		t.Errorf("open an outage: %d %s", code, body)
	}
	if a := postMessage(t, srv, testSID, testToken, message("+905551234567", "kod")); a.status != 503 {
		t.Errorf("twilio during its outage: %d", a.status)
	}
	for _, bad := range []string{`{"mode":"boom"}`, `{"only":"x"}`, `{"after_ms":-1}`, `{"duration_ms":-5}`, `{"duration":5}`} {
		if code, _ := postJSONBody(t, srv.URL+"/_sandbox/outages", bad); code != 400 {
			t.Errorf("POST outages %s: %d, want 400", bad, code)
		}
	}
	if code, _ := postJSONBody(t, srv.URL+"/_sandbox/outages/stop", `{"only":"fcm,twilio"}`); code != 200 {
		t.Errorf("stop: %d", code)
	}
	var ws []sandbox.OutageWindow
	getJSON(t, srv.URL+"/_sandbox/outages", &ws)
	if len(ws) != 4 || ws[0].State != "scheduled" || ws[2].State != "over" || ws[2].End.IsZero() || ws[3].Refused != 1 {
		t.Errorf("outages %+v", ws)
	}
	if code, _ := postJSONBody(t, srv.URL+"/_sandbox/outages/stop", ``); code != 200 {
		t.Errorf("stop all: %d", code)
	}
	getJSON(t, srv.URL+"/_sandbox/outages", &ws)
	if len(ws) != 2 {
		t.Errorf("scheduled windows outlived the stop: %+v", ws)
	}
	if code, _ := postJSONBody(t, srv.URL+"/_sandbox/outages/stop", `{"only":"nope"}`); code != 400 {
		t.Errorf("stop an unknown API: %d", code)
	}

	var st map[string]any
	getJSON(t, srv.URL+"/_sandbox/stats", &st)
	if o, _ := st["outages"].([]any); len(o) != 2 {
		t.Errorf("stats outages %v", st["outages"])
	}
	tl := timeline(t, srv.URL+"/_sandbox/timeline?api=twilio&since="+strconv.FormatInt(time.Now().Add(-time.Minute).Unix(), 10))
	if len(tl.APIs) != 1 || tl.APIs[0] != "twilio" || tl.Total.RefusedBy["outage"] != 1 || len(tl.Seconds) != 1 || len(tl.Outages) != 1 || tl.Limits["twilio"].Segments != 9 {
		t.Errorf("timeline %+v", tl)
	}
	if tl := timeline(t, srv.URL+"/_sandbox/timeline?since="+time.Now().Add(time.Minute).UTC().Format(time.RFC3339)); len(tl.Seconds) != 0 || tl.Total.Requests != 1 {
		t.Errorf("timeline since a minute ahead: %+v", tl)
	}
	for _, bad := range []string{"?api=twilio,bad", "?since=yesterday"} {
		resp, err := http.Get(srv.URL + "/_sandbox/timeline" + bad)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 400 {
			t.Errorf("timeline%s: %d, want 400", bad, resp.StatusCode)
		}
	}
	// Reset clears the timeline; limits and outage windows stay.
	if code := postJSON(t, srv.URL+"/_sandbox/reset", ""); code != 204 {
		t.Fatalf("reset: %d", code)
	}
	if tl := timeline(t, srv.URL+"/_sandbox/timeline"); tl.Total.Requests != 0 || len(tl.Seconds) != 0 || len(tl.Outages) != 2 || tl.Limits["sendgrid"].Rate != 5 {
		t.Errorf("timeline after reset %+v", tl)
	}
}

func TestPushbackOptionsAreChecked(t *testing.T) {
	for name, opts := range map[string]sandbox.Options{
		"unknown API":        {Limits: map[string]sandbox.Limit{"twillio": {Rate: 1}}},
		"negative":           {Limits: map[string]sandbox.Limit{"twilio": {Rate: -1}}},
		"segments elsewhere": {Limits: map[string]sandbox.Limit{"fcm": {Segments: 1}}},
		"outage mode":        {Outages: []sandbox.OutagePlan{{Mode: "boom"}}},
		"outage API":         {Outages: []sandbox.OutagePlan{{Only: "twilio,x"}}},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: New did not refuse %+v", name, opts)
				}
			}()
			sandbox.New(opts)
		}()
	}
}
