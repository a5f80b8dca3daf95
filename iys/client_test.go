package iys_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/campaignctl/campaignctl/internal/testlog"
	"github.com/campaignctl/campaignctl/iys"
	"github.com/campaignctl/campaignctl/providers/sandbox"
)

const (
	testUser     = "api@brand.example"
	testPassword = "pa55-İYS-w0rd!"
	testIYSCode  = 700001
	testBrand    = 700002
)

var trt = time.FixedZone("TRT", 3*60*60)

// clock is a settable clock shared by the fake İYS and the client.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// arrival is one request the fake İYS received (the control API aside).
type arrival struct {
	at     time.Time
	path   string
	status int
}

type recorder struct {
	mu   sync.Mutex
	reqs []arrival
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (rec *recorder) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/_sandbox/") {
			h.ServeHTTP(w, r)
			return
		}
		at := time.Now()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(sw, r)
		rec.mu.Lock()
		rec.reqs = append(rec.reqs, arrival{at: at, path: r.URL.Path, status: sw.status})
		rec.mu.Unlock()
	})
}

// sorted returns the arrivals in time order.
func (rec *recorder) sorted() []arrival {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	out := slices.Clone(rec.reqs)
	slices.SortFunc(out, func(a, b arrival) int { return a.at.Compare(b.at) })
	return out
}

type env struct {
	s     *sandbox.Server
	srv   *httptest.Server
	clock *clock
	rec   *recorder
}

// newEnv starts a fake İYS with the test credentials and codes. With a nil clock it runs on real time.
func newEnv(t *testing.T, opts sandbox.Options, clk *clock) *env {
	t.Helper()
	opts.IYSUsername, opts.IYSPassword = testUser, testPassword
	opts.IYSCode, opts.IYSBrandCode = testIYSCode, testBrand
	if clk != nil {
		opts.IYSNow = clk.Now
	}
	s := sandbox.New(opts)
	rec := &recorder{}
	srv := httptest.NewServer(rec.wrap(s))
	t.Cleanup(srv.Close)
	return &env{s: s, srv: srv, clock: clk, rec: rec}
}

func newClock() *clock { return &clock{t: time.Date(2026, 3, 10, 12, 0, 0, 0, trt)} }

func (e *env) config() iys.Config {
	cfg := iys.Config{
		BaseURL:   e.srv.URL,
		Username:  testUser,
		Password:  testPassword,
		IYSCode:   fmt.Sprint(testIYSCode),
		BrandCode: fmt.Sprint(testBrand),
	}
	if e.clock != nil {
		cfg.Now = e.clock.Now
	}
	return cfg
}

func (e *env) client(t *testing.T, edit func(*iys.Config)) *iys.Client {
	t.Helper()
	cfg := e.config()
	if edit != nil {
		edit(&cfg)
	}
	c, err := iys.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (e *env) seed(t *testing.T, cs ...sandbox.IYSConsent) []sandbox.IYSConsent {
	t.Helper()
	out, err := e.s.AddIYSConsents(cs...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func ago(c *clock, d time.Duration) string {
	return c.Now().Add(-d).In(trt).Format(iys.DateLayout)
}

func TestNewClientValidates(t *testing.T) {
	good := iys.Config{BaseURL: "https://api.iys.org.tr", Username: "u", Password: "p", IYSCode: "1", BrandCode: "2"}
	if _, err := iys.NewClient(good); err != nil {
		t.Fatalf("good config: %v", err)
	}
	for name, edit := range map[string]func(*iys.Config){
		"no base URL":      func(c *iys.Config) { c.BaseURL = "" },
		"base URL scheme":  func(c *iys.Config) { c.BaseURL = "api.iys.org.tr" },
		"no password":      func(c *iys.Config) { c.Password = "" },
		"no username":      func(c *iys.Config) { c.Username = "" },
		"code not digits":  func(c *iys.Config) { c.IYSCode = "IYS-1" },
		"no brand":         func(c *iys.Config) { c.BrandCode = "" },
		"negative rate":    func(c *iys.Config) { c.RatePerSecond = -1 },
		"page too large":   func(c *iys.Config) { c.PageSize = 1001 },
		"batch too large":  func(c *iys.Config) { c.MultiStatusBatch = 1001 },
		"batch below zero": func(c *iys.Config) { c.MultiStatusBatch = -5 },
	} {
		cfg := good
		cfg.Password = "hunter2-secret"
		edit(&cfg)
		_, err := iys.NewClient(cfg)
		if err == nil {
			t.Errorf("%s: no error", name)
			continue
		}
		if strings.Contains(err.Error(), "hunter2-secret") {
			t.Errorf("%s: the error shows the password: %v", name, err)
		}
	}
	cfg := good
	cfg.Password = "hunter2-secret"
	for _, s := range []string{fmt.Sprint(cfg), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg), fmt.Sprintf("%s", cfg)} {
		if strings.Contains(s, "hunter2") || !strings.Contains(s, "api.iys.org.tr") {
			t.Errorf("printed config: %s", s)
		}
	}
}

// One token serves every request, concurrent ones included.
func TestClientTokenObtainedOnceAndReused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sandbox.Options{IYSPullLag: -1}, nil)
	c := e.client(t, func(cfg *iys.Config) { cfg.RatePerSecond = 100 })
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Go(func() {
			_, err := c.Changes(ctx, iys.PullIYS, "", 0)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for range 5 {
		if _, err := c.Changes(ctx, iys.PullHS, "", 10); err != nil {
			t.Fatal(err)
		}
	}
	st := e.s.IYSStats()
	if st.TokenRequests != 1 || st.PasswordGrants != 1 || st.ChangesQueries != 25 || st.Unauthenticated != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestClientTokenExpiry(t *testing.T) {
	t.Parallel()
	clk := newClock()
	e := newEnv(t, sandbox.Options{IYSTokenTTL: 10 * time.Minute, IYSRefreshTTL: 30 * time.Minute}, clk)
	c := e.client(t, func(cfg *iys.Config) { cfg.RatePerSecond = 100 })
	ctx := context.Background()
	pull := func(step string) {
		t.Helper()
		if _, err := c.Changes(ctx, iys.PullIYS, "", 0); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
	}
	want := func(step string, password, refresh, unauth int) {
		t.Helper()
		st := e.s.IYSStats()
		if st.PasswordGrants != password || st.RefreshGrants != refresh || st.Unauthenticated != unauth {
			t.Errorf("%s: password grants %d, refresh grants %d, 401s %d; want %d, %d, %d",
				step, st.PasswordGrants, st.RefreshGrants, st.Unauthenticated, password, refresh, unauth)
		}
	}
	pull("first")
	want("first", 1, 0, 0)
	clk.Advance(7 * time.Minute)
	pull("within the token's life")
	want("within the token's life", 1, 0, 0)

	// Close to its expiry the token is renewed with the refresh grant, before İYS refuses it.
	clk.Advance(2 * time.Minute)
	pull("near expiry")
	want("near expiry", 1, 1, 0)

	// Once the refresh token has expired too, the client logs in again.
	clk.Advance(40 * time.Minute)
	pull("both expired")
	want("both expired", 2, 1, 0)

	// A token İYS refuses before the client expected it to (401 H351) is renewed and the request retried.
	e.s.ExpireIYSTokens()
	pull("expired by İYS")
	want("expired by İYS", 2, 2, 1)

	// When the refresh token is refused too, the client logs in with the password.
	e.s.RevokeIYSTokens()
	pull("revoked by İYS")
	want("revoked by İYS", 3, 2, 2)
	if st := e.s.IYSStats(); st.TokensRefused != 1 || st.ByCode["invalid_grant"] != 1 {
		t.Errorf("the refused refresh: %+v", st)
	}
}

// A 401 that survives a fresh token is returned as an auth error after exactly one retry.
func TestClientUnauthorizedTwice(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sandbox.Options{}, nil)
	var api int
	var mu sync.Mutex
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/oauth2/token" {
			e.s.ServeHTTP(w, r)
			return
		}
		mu.Lock()
		api++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, `{"errors":[{"message":"Eksik veya geçersiz jeton!","code":"H351"}]}`)
	})
	srv := httptest.NewServer(h)
	defer srv.Close()
	cfg := e.config()
	cfg.BaseURL = srv.URL
	c, err := iys.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Status(context.Background(), iys.RecipientIndividual, iys.TypeMessage, "05321234567")
	var ae *iys.APIError
	if !errors.As(err, &ae) || !iys.IsAuth(err) || ae.Status != 401 || ae.Code != "H351" || ae.Op != "status" {
		t.Fatalf("err = %v", err)
	}
	if iys.IsRetryable(err) || iys.IsValidation(err) {
		t.Errorf("a 401 is neither retryable nor a validation error")
	}
	st := e.s.IYSStats()
	if api != 2 || st.PasswordGrants != 1 || st.RefreshGrants != 1 {
		t.Errorf("API requests %d (want 2), token grants %+v", api, st)
	}
}

func TestClientWrongPassword(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sandbox.Options{}, nil)
	var logs testlog.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	const wrong = "not-the-password-42"
	c := e.client(t, func(cfg *iys.Config) { cfg.Password = wrong; cfg.Logger = logger })
	_, err := c.Changes(context.Background(), iys.PullIYS, "", 0)
	var ae *iys.APIError
	if !errors.As(err, &ae) {
		t.Fatalf("err = %v, want *APIError", err)
	}
	want := &iys.APIError{Op: "token", Status: 400, Code: "invalid_request", Message: "Kullanıcı kimlik bilgileri geçersiz."}
	if diff := cmp.Diff(want, ae, cmp.AllowUnexported(iys.APIError{})); diff != "" {
		t.Errorf("error (-want +got):\n%s", diff)
	}
	if !iys.IsAuth(err) || iys.IsRetryable(err) || iys.IsValidation(err) || iys.IsRateLimited(err) {
		t.Errorf("classification of %v", err)
	}
	out := logs.String()
	for _, s := range []string{err.Error(), fmt.Sprintf("%+v", err), fmt.Sprintf("%#v", err), out} {
		if strings.Contains(s, wrong) || strings.Contains(s, testPassword) {
			t.Errorf("the password shows in %q", s)
		}
	}
	if st := e.s.IYSStats(); st.TokenRequests != 1 || st.Requests != 0 {
		t.Errorf("a refused login must not be retried: %+v", st)
	}
}

// sendRecorder notes when the client hands each request to the network.
type sendRecorder struct {
	mu    sync.Mutex
	sends []time.Time
}

func (s *sendRecorder) RoundTrip(r *http.Request) (*http.Response, error) {
	s.mu.Lock()
	s.sends = append(s.sends, time.Now())
	s.mu.Unlock()
	return http.DefaultTransport.RoundTrip(r)
}

// The client keeps under RatePerSecond: measured where it sends, no one-second window holds more than 10
// requests (a few milliseconds of slack for the scheduler), and the fake's own limiter of 10 a second,
// which sees them arrive, never fires. Not parallel: other tests' load would only add jitter.
func TestClientKeepsTheRate(t *testing.T) {
	e := newEnv(t, sandbox.Options{IYSRate: 10, IYSPullLag: -1}, nil)
	rec := &sendRecorder{}
	c := e.client(t, func(cfg *iys.Config) { cfg.HTTPClient = &http.Client{Transport: rec} }) // the default rate, 10 a second
	ctx := context.Background()
	start := time.Now()
	var wg sync.WaitGroup
	for range 24 {
		wg.Go(func() {
			if _, err := c.Changes(ctx, iys.PullIYS, "", 0); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	rec.mu.Lock()
	sends := slices.Clone(rec.sends)
	rec.mu.Unlock()
	slices.SortFunc(sends, time.Time.Compare)
	if len(sends) != 25 { // the token and 24 pulls
		t.Fatalf("%d requests, want 25", len(sends))
	}
	const slack = 15 * time.Millisecond
	for i := 0; i+10 < len(sends); i++ {
		if gap := sends[i+10].Sub(sends[i]); gap < time.Second-slack {
			t.Errorf("requests %d to %d went out within %v: more than 10 in a second", i, i+10, gap)
		}
	}
	if took < 2350*time.Millisecond {
		t.Errorf("25 requests at 10/s took %v", took)
	}
	if st := e.s.IYSStats(); st.RateLimited != 0 || st.ChangesQueries != 24 {
		t.Errorf("İYS refused %d requests for the rate (stats %+v)", st.RateLimited, st)
	}
}

// A 429 H124 is retried after its Retry-After, whether İYS's limiter or an injected fault sent it.
func TestClientRetriesRateLimited(t *testing.T) {
	t.Parallel()
	t.Run("injected", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, sandbox.Options{IYSPullLag: -1}, nil)
		c := e.client(t, nil)
		e.s.SetIYSFaults(sandbox.IYSFaults{RateLimited: 1})
		if _, err := c.Changes(context.Background(), iys.PullIYS, "", 0); err != nil {
			t.Fatal(err)
		}
		reqs := e.rec.sorted()
		if len(reqs) != 3 || reqs[1].status != 429 || reqs[2].status != 204 {
			t.Fatalf("requests %+v", reqs)
		}
		if gap := reqs[2].at.Sub(reqs[1].at); gap < time.Second-10*time.Millisecond {
			t.Errorf("retried %v after the 429, before its Retry-After: 1", gap)
		}
	})
	t.Run("server's limiter", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, sandbox.Options{IYSRate: 1, IYSPullLag: -1}, nil)
		c := e.client(t, func(cfg *iys.Config) { cfg.RatePerSecond = 5 }) // faster than İYS allows
		for i := range 2 {
			if _, err := c.Changes(context.Background(), iys.PullIYS, "", 0); err != nil {
				t.Fatalf("pull %d: %v", i, err)
			}
		}
		reqs := e.rec.sorted()
		limited := 0
		for i, r := range reqs {
			if r.status != 429 {
				continue
			}
			limited++
			if i+1 == len(reqs) || reqs[i+1].at.Sub(r.at) < time.Second-10*time.Millisecond {
				t.Errorf("request %d: retried too early after a 429: %+v", i, reqs)
			}
		}
		if st := e.s.IYSStats(); limited == 0 || st.RateLimited != limited || st.ChangesQueries != 2 {
			t.Errorf("429s seen %d, stats %+v", limited, st)
		}
	})
	t.Run("retries used up", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, sandbox.Options{}, nil)
		c := e.client(t, func(cfg *iys.Config) { cfg.MaxRetries = 1 })
		e.s.SetIYSFaults(sandbox.IYSFaults{RateLimited: 5})
		_, err := c.Changes(context.Background(), iys.PullIYS, "", 0)
		var ae *iys.APIError
		if !errors.As(err, &ae) || !iys.IsRateLimited(err) || !iys.IsRetryable(err) || ae.Code != "H124" || ae.RetryAfter != time.Second {
			t.Fatalf("err = %#v", err)
		}
		if st := e.s.IYSStats(); st.RateLimited != 2 {
			t.Errorf("%d attempts, want 2", st.RateLimited)
		}
	})
	t.Run("Retry-After over MaxRetryWait", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, sandbox.Options{}, nil)
		c := e.client(t, func(cfg *iys.Config) { cfg.MaxRetryWait = 500 * time.Millisecond })
		e.s.SetIYSFaults(sandbox.IYSFaults{RateLimited: 5})
		start := time.Now()
		_, err := c.Changes(context.Background(), iys.PullIYS, "", 0)
		if !iys.IsRateLimited(err) || time.Since(start) > 400*time.Millisecond {
			t.Fatalf("err = %v after %v, want at once", err, time.Since(start))
		}
		if st := e.s.IYSStats(); st.RateLimited != 1 {
			t.Errorf("%d attempts, want 1", st.RateLimited)
		}
	})
	t.Run("server errors", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, sandbox.Options{}, nil)
		c := e.client(t, func(cfg *iys.Config) { cfg.MaxRetryWait = 20 * time.Millisecond })
		e.s.SetIYSFaults(sandbox.IYSFaults{ServerError: 1, Unavailable: 1})
		if _, err := c.Changes(context.Background(), iys.PullIYS, "", 0); err != nil {
			t.Fatal(err)
		}
		e.s.SetIYSFaults(sandbox.IYSFaults{ServerError: 9})
		_, err := c.Changes(context.Background(), iys.PullIYS, "", 0)
		var ae *iys.APIError
		if !errors.As(err, &ae) || ae.Status != 500 || ae.Code != "H103" || !iys.IsRetryable(err) || iys.IsRateLimited(err) {
			t.Fatalf("err = %v", err)
		}
		if st := e.s.IYSStats(); st.ByCode["H103"] != 1+4 || st.ByCode["H192"] != 1 {
			t.Errorf("stats %+v", st.ByCode)
		}
	})
}

// After 429 H084 the client asks for no token until the hour is up: asking early restarts İYS's hour.
func TestClientTokenHourlyLimit(t *testing.T) {
	t.Parallel()
	clk := newClock()
	e := newEnv(t, sandbox.Options{IYSTokenPerHour: 2}, clk)
	c := e.client(t, nil)
	ctx := context.Background()
	if _, err := c.Changes(ctx, iys.PullIYS, "", 0); err != nil {
		t.Fatal(err)
	}
	e.s.RevokeIYSTokens() // the 401 leads to a refused refresh (the 2nd request of the hour), then a login (the 3rd)
	_, err := c.Changes(ctx, iys.PullIYS, "", 0)
	var ae *iys.APIError
	if !errors.As(err, &ae) || ae.Code != "H084" || !iys.IsRateLimited(err) || iys.IsRetryable(err) || ae.RetryAfter != time.Hour {
		t.Fatalf("err = %v", err)
	}
	before := e.s.IYSStats().TokenRequests
	clk.Advance(30 * time.Minute)
	_, err = c.Changes(ctx, iys.PullIYS, "", 0)
	if !errors.As(err, &ae) || ae.Code != "H084" || !strings.Contains(err.Error(), "no token is asked for before 2026-03-10 13:00:00") {
		t.Errorf("during the hour: %v", err)
	}
	if after := e.s.IYSStats().TokenRequests; after != before {
		t.Errorf("asked for a token during the hour: %d requests, was %d", after, before)
	}
	clk.Advance(31 * time.Minute)
	if _, err := c.Changes(ctx, iys.PullIYS, "", 0); err != nil {
		t.Errorf("after the hour: %v", err)
	}
}

func TestClientMultiStatusChunks(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sandbox.Options{}, newClock())
	const n = 2500
	var seeds []sandbox.IYSConsent
	var ask []string
	want := map[string]iys.Record{}
	for i := range n {
		phone := fmt.Sprintf("+90532%07d", i)
		switch i % 3 {
		case 0:
			seeds = append(seeds, sandbox.IYSConsent{Recipient: phone, Type: "MESAJ", Status: "ONAY", Source: "HS_WEB"})
			want[phone] = iys.Record{Recipient: phone, Type: "MESAJ", RecipientType: "BIREYSEL", Status: "ONAY"}
		case 1:
			seeds = append(seeds, sandbox.IYSConsent{Recipient: phone, Type: "MESAJ", Status: "RET", Source: "IYS_KISAMESAJ"})
		}
		if i%2 == 0 {
			ask = append(ask, phone)
		} else {
			ask = append(ask, fmt.Sprintf("0532 %03d %02d %02d", i/10000, i/100%100, i%100)) // national spelling
		}
	}
	// An ONAY for the same numbers as TACIR must not count for BIREYSEL.
	seeds = append(seeds, sandbox.IYSConsent{Recipient: "+905320000001", Type: "MESAJ", RecipientType: "TACIR", Status: "ONAY", Source: "HS_WEB"})
	e.seed(t, seeds...)
	ask = append(ask, "+905320000000") // a repeat
	c := e.client(t, nil)
	got, err := c.MultiStatus(context.Background(), iys.RecipientIndividual, iys.TypeMessage, ask)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("approved (-want +got):\n%s", diff)
	}
	batches := e.s.IYSStats().MultiStatusBatches
	slices.Sort(batches)
	if diff := cmp.Diff([]int{500, 1000, 1000}, batches); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}

	// An invalid recipient fails the call before any request.
	before := e.s.IYSStats().Requests
	_, err = c.MultiStatus(context.Background(), iys.RecipientIndividual, iys.TypeMessage, []string{"+905321234567", "+9005321234567"})
	if !errors.Is(err, iys.ErrInvalidPhone) || !strings.Contains(err.Error(), "recipient 1") {
		t.Errorf("invalid recipient: %v", err)
	}
	if got, err := c.MultiStatus(context.Background(), iys.RecipientIndividual, iys.TypeEmail, nil); err != nil || len(got) != 0 {
		t.Errorf("no recipients: %v %v", got, err)
	}
	if _, err := c.MultiStatus(context.Background(), "KURUMSAL", iys.TypeEmail, []string{"a@b.co"}); err == nil {
		t.Errorf("bad recipient type accepted")
	}
	if e.s.IYSStats().Requests != before {
		t.Errorf("requests were sent for calls that should fail locally")
	}
}

// If İYS refuses a list's length with H127 (its error table says 100), the client asks again in lists of
// 100 and keeps to that size.
func TestClientMultiStatusFallsBackOnH127(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sandbox.Options{IYSMultiStatusMax: 100}, newClock())
	var ask []string
	for i := range 250 {
		ask = append(ask, fmt.Sprintf("user%03d@example.com", i))
	}
	e.seed(t, sandbox.IYSConsent{Recipient: "user007@example.com", Type: "EPOSTA", Status: "ONAY", Source: "HS_WEB"},
		sandbox.IYSConsent{Recipient: "user249@example.com", Type: "EPOSTA", Status: "ONAY", Source: "HS_WEB"})
	c := e.client(t, func(cfg *iys.Config) { cfg.RatePerSecond = 50 })
	got, err := c.MultiStatus(context.Background(), iys.RecipientIndividual, iys.TypeEmail, ask)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["user007@example.com"].Status != "ONAY" || got["user249@example.com"].Status != "ONAY" {
		t.Errorf("approved %v", got)
	}
	if _, err := c.MultiStatus(context.Background(), iys.RecipientIndividual, iys.TypeEmail, ask[:150]); err != nil {
		t.Fatal(err)
	}
	batches := e.s.IYSStats().MultiStatusBatches
	if len(batches) == 6 {
		slices.Sort(batches[4:]) // the second call's two lists go out together
	}
	if diff := cmp.Diff([]int{250, 100, 100, 50, 50, 100}, batches); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
}

func TestClientChangesPaging(t *testing.T) {
	t.Parallel()
	clk := newClock()
	e := newEnv(t, sandbox.Options{}, clk)
	var citizen []sandbox.IYSConsent
	for i := range 7 {
		rec := e.seed(t, sandbox.IYSConsent{Recipient: fmt.Sprintf("+90533000000%d", i), Type: "MESAJ", Status: "RET",
			Source: "IYS_KISAMESAJ", ConsentDate: ago(clk, time.Duration(70-i)*time.Hour), CreationDate: ago(clk, time.Duration(70-i)*time.Hour)})
		citizen = append(citizen, rec[0])
	}
	brand := e.seed(t,
		sandbox.IYSConsent{Recipient: "Musteri@Example.com", Type: "EPOSTA", Status: "ONAY", Source: "HS_WEB", CreationDate: ago(clk, 5*time.Hour)},
		sandbox.IYSConsent{Recipient: "bayi@example.com", Type: "EPOSTA", RecipientType: "TACIR", Status: "ONAY", Source: "HS_FIZIKSEL_ORTAM", CreationDate: ago(clk, 4*time.Hour)},
	)
	c := e.client(t, func(cfg *iys.Config) { cfg.RatePerSecond = 50 })
	ctx := context.Background()

	var got []iys.Record
	after := ""
	sizes := []int{}
	for {
		page, err := c.Changes(ctx, iys.PullIYS, after, 3)
		if err != nil {
			t.Fatal(err)
		}
		if page.Source != iys.PullIYS {
			t.Errorf("page source %q", page.Source)
		}
		if len(page.Changes) == 0 {
			if page.After != after {
				t.Errorf("an empty page moved the cursor from %q to %q", after, page.After)
			}
			break
		}
		sizes = append(sizes, len(page.Changes))
		got = append(got, page.Changes...)
		after = page.After
	}
	if diff := cmp.Diff([]int{3, 3, 1}, sizes); diff != "" {
		t.Errorf("pages (-want +got):\n%s", diff)
	}
	var want []iys.Record
	for _, s := range citizen {
		want = append(want, record(t, s))
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("changes (-want +got):\n%s", diff)
	}
	if st := e.s.IYSStats(); st.ChangesEmpty != 1 || st.ChangesQueries != 4 {
		t.Errorf("stats %+v", st)
	}
	// Dates are Europe/Istanbul; the TACIR record added without a consent date has none.
	if got[0].CreationDate.Location() != iys.Istanbul() || got[0].CreationDate.Hour() != 14 {
		t.Errorf("creation date %v", got[0].CreationDate)
	}
	hs, err := c.Changes(ctx, iys.PullHS, "", 0)
	if err != nil || len(hs.Changes) != 2 {
		t.Fatalf("HS: %+v %v", hs, err)
	}
	if hs.Changes[0].Recipient != "musteri@example.com" || !hs.Changes[1].ConsentDate.IsZero() || hs.Changes[1].RecipientType != "TACIR" ||
		hs.Changes[1].TransactionID != brand[1].TransactionID {
		t.Errorf("HS changes %+v", hs.Changes)
	}

	// Local checks send nothing.
	before := e.s.IYSStats().Requests
	for _, tt := range []struct {
		source string
		limit  int
	}{{"ALL", 0}, {"", 10}, {iys.PullIYS, 1001}, {iys.PullHS, -1}} {
		if _, err := c.Changes(ctx, tt.source, "", tt.limit); err == nil {
			t.Errorf("Changes(%q, %d): no error", tt.source, tt.limit)
		}
	}
	if e.s.IYSStats().Requests != before {
		t.Errorf("invalid calls reached İYS")
	}
}

// record is the client's view of a change the fake recorded.
func record(t *testing.T, s sandbox.IYSConsent) iys.Record {
	t.Helper()
	parse := func(v string) time.Time {
		if v == "" {
			return time.Time{}
		}
		tm, err := time.ParseInLocation(iys.DateLayout, v, iys.Istanbul())
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	return iys.Record{Recipient: s.Recipient, Type: s.Type, RecipientType: s.RecipientType, Status: s.Status, Source: s.Source,
		ConsentDate: parse(s.ConsentDate), CreationDate: parse(s.CreationDate), TransactionID: s.TransactionID}
}

func TestClientPullAll(t *testing.T) {
	t.Parallel()
	clk := newClock()
	e := newEnv(t, sandbox.Options{}, clk)
	var want []string
	for i := range 7 {
		rec := e.seed(t, sandbox.IYSConsent{Recipient: fmt.Sprintf("+90533000001%d", i), Type: "ARAMA", Status: "RET",
			Source: "IYS_CM", CreationDate: ago(clk, time.Duration(10-i)*time.Hour)})
		want = append(want, rec[0].TransactionID)
	}
	c := e.client(t, func(cfg *iys.Config) { cfg.PageSize = 2; cfg.RatePerSecond = 50 })
	ctx := context.Background()

	var got, cursors []string
	err := c.PullAll(ctx, iys.PullIYS, "", func(p iys.Page) error {
		for _, r := range p.Changes {
			got = append(got, r.TransactionID)
		}
		cursors = append(cursors, p.After)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("changes (-want +got):\n%s", diff)
	}
	if len(cursors) != 4 || !strings.HasSuffix(cursors[3], want[6]) {
		t.Errorf("cursors %v", cursors)
	}
	// Resuming from the last stored cursor finds nothing new; a new change comes next.
	calls := 0
	if err := c.PullAll(ctx, iys.PullIYS, cursors[3], func(iys.Page) error { calls++; return nil }); err != nil || calls != 0 {
		t.Errorf("resume: %d calls, %v", calls, err)
	}
	late := e.seed(t, sandbox.IYSConsent{Recipient: "+905330000020", Type: "ARAMA", Status: "RET", Source: "IYS_WEB", CreationDate: ago(clk, 2*time.Hour)})
	if err := c.PullAll(ctx, iys.PullIYS, cursors[3], func(p iys.Page) error {
		calls++
		if len(p.Changes) != 1 || p.Changes[0].TransactionID != late[0].TransactionID {
			t.Errorf("late page %+v", p)
		}
		return nil
	}); err != nil || calls != 1 {
		t.Errorf("late change: %d calls, %v", calls, err)
	}
	// fn's error stops the pull and comes back as it was.
	stop := errors.New("store is down")
	calls = 0
	err = c.PullAll(ctx, iys.PullIYS, "", func(iys.Page) error { calls++; return stop })
	if err != stop || calls != 1 {
		t.Errorf("fn error: %v after %d calls", err, calls)
	}
}

// A malformed answer is an error, and nothing of it is returned: not a page, not a record, not a map.
func TestClientMalformedResponse(t *testing.T) {
	t.Parallel()
	clk := newClock()
	e := newEnv(t, sandbox.Options{}, clk)
	for i := range 5 {
		e.seed(t, sandbox.IYSConsent{Recipient: fmt.Sprintf("+90534000000%d", i), Type: "MESAJ", Status: "ONAY", Source: "HS_WEB", CreationDate: ago(clk, 3*time.Hour)})
	}
	c := e.client(t, func(cfg *iys.Config) { cfg.RatePerSecond = 50; cfg.PageSize = 2 })
	ctx := context.Background()
	if _, err := c.Changes(ctx, iys.PullHS, "", 0); err != nil { // get the token before the fault
		t.Fatal(err)
	}

	e.s.SetIYSFaults(sandbox.IYSFaults{Malformed: 1})
	page, err := c.Changes(ctx, iys.PullHS, "", 0)
	if !errors.Is(err, iys.ErrMalformedResponse) || !strings.Contains(err.Error(), "iys changes: malformed İYS response") {
		t.Errorf("changes: %v", err)
	}
	if page.Changes != nil || page.After != "" || page.Source != "" {
		t.Errorf("a malformed page returned %+v", page)
	}
	if strings.Contains(err.Error(), "+90534") {
		t.Errorf("the error quotes the body: %v", err)
	}

	e.s.SetIYSFaults(sandbox.IYSFaults{Malformed: 1})
	rec, err := c.Status(ctx, iys.RecipientIndividual, iys.TypeMessage, "+905340000001")
	if !errors.Is(err, iys.ErrMalformedResponse) || rec != (iys.Record{}) {
		t.Errorf("status: %+v %v", rec, err)
	}

	// The second of two lists fails: no partial map.
	var ask []string
	for i := range 1500 {
		ask = append(ask, fmt.Sprintf("+90534%07d", i))
	}
	e.s.SetIYSFaults(sandbox.IYSFaults{Malformed: 1})
	m, err := c.MultiStatus(ctx, iys.RecipientIndividual, iys.TypeMessage, ask)
	if !errors.Is(err, iys.ErrMalformedResponse) || m != nil {
		t.Errorf("multi-status: %d entries, %v", len(m), err)
	}

	// PullAll: the first page is handed over, the broken second is not.
	var pages []iys.Page
	calls := 0
	err = c.PullAll(ctx, iys.PullHS, "", func(p iys.Page) error {
		calls++
		pages = append(pages, p)
		if calls == 1 {
			e.s.SetIYSFaults(sandbox.IYSFaults{Malformed: 1})
		}
		return nil
	})
	if !errors.Is(err, iys.ErrMalformedResponse) || calls != 1 || len(pages[0].Changes) != 2 {
		t.Errorf("pull all: %d pages, %v", calls, err)
	}

	// The status answered for another key than asked is malformed too; so is a token answer that is not
	// JSON, and its error shows no part of the body.
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"access_token":"eyJsecret-token-material","token_type":"bearer","expires_in":72`)
	})
	srv := httptest.NewServer(h)
	defer srv.Close()
	cfg := e.config()
	cfg.BaseURL = srv.URL
	bad, err := iys.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = bad.Changes(ctx, iys.PullIYS, "", 0)
	if !errors.Is(err, iys.ErrMalformedResponse) || strings.Contains(err.Error(), "secret-token") {
		t.Errorf("token: %v", err)
	}
}

// A RET a citizen gives in İYS (3338, the app) reaches the pull after İYS's hour, and status answers it.
func TestClientCitizenRET(t *testing.T) {
	t.Parallel()
	clk := newClock()
	e := newEnv(t, sandbox.Options{}, clk)
	const phone = "+905321112233"
	onay := e.seed(t, sandbox.IYSConsent{Recipient: phone, Type: "MESAJ", Status: "ONAY", Source: "HS_WEB",
		ConsentDate: ago(clk, 72*time.Hour), CreationDate: ago(clk, 72*time.Hour)})
	c := e.client(t, nil)
	ctx := context.Background()

	st, err := c.Status(ctx, iys.RecipientIndividual, iys.TypeMessage, "0532 111 22 33")
	if err != nil || st.Status != iys.StatusApproved || st.TransactionID != onay[0].TransactionID || st.Recipient != phone {
		t.Fatalf("before: %+v %v", st, err)
	}
	if m, err := c.MultiStatus(ctx, iys.RecipientIndividual, iys.TypeMessage, []string{phone}); err != nil || len(m) != 1 {
		t.Fatalf("multi-status before: %v %v", m, err)
	}
	iysCursor := ""
	if p, err := c.Changes(ctx, iys.PullIYS, "", 0); err != nil || len(p.Changes) != 0 {
		t.Fatalf("no citizen change yet: %+v %v", p, err)
	}

	// The citizen texts RET to 3338.
	resp, err := http.Post(e.srv.URL+"/_sandbox/iys/consents", "application/json",
		strings.NewReader(`{"recipient":"`+phone+`","type":"MESAJ","recipientType":"BIREYSEL","status":"RET","source":"IYS_KISAMESAJ"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("control API: %d", resp.StatusCode)
	}

	// Status sees it at once; the pull leaves out the last hour, as İYS does.
	st, err = c.Status(ctx, iys.RecipientIndividual, iys.TypeMessage, phone)
	if err != nil || st.Status != iys.StatusRejected || st.Source != "IYS_KISAMESAJ" {
		t.Fatalf("status after the RET: %+v %v", st, err)
	}
	if m, err := c.MultiStatus(ctx, iys.RecipientIndividual, iys.TypeMessage, []string{phone}); err != nil || len(m) != 0 {
		t.Errorf("multi-status after the RET: %v %v", m, err)
	}
	if p, err := c.Changes(ctx, iys.PullIYS, iysCursor, 0); err != nil || len(p.Changes) != 0 {
		t.Errorf("within the hour: %+v %v", p, err)
	}
	clk.Advance(61 * time.Minute)
	p, err := c.Changes(ctx, iys.PullIYS, iysCursor, 0)
	if err != nil || len(p.Changes) != 1 {
		t.Fatalf("after the hour: %+v %v", p, err)
	}
	ch := p.Changes[0]
	if ch.Recipient != phone || ch.Status != iys.StatusRejected || ch.Source != "IYS_KISAMESAJ" || ch.Type != iys.TypeMessage ||
		ch.RecipientType != iys.RecipientIndividual || ch.TransactionID != st.TransactionID || ch.ConsentDate.IsZero() {
		t.Errorf("the change %+v, status %+v", ch, st)
	}
	// The brand's own source does not carry it.
	if hs, err := c.Changes(ctx, iys.PullHS, "", 0); err != nil || len(hs.Changes) != 1 || hs.Changes[0].Status != iys.StatusApproved {
		t.Errorf("HS: %+v %v", hs, err)
	}
	// No record at all: ErrNoConsent, and İYS's 404 underneath.
	_, err = c.Status(ctx, iys.RecipientMerchant, iys.TypeMessage, phone)
	var ae *iys.APIError
	if !errors.Is(err, iys.ErrNoConsent) || !errors.As(err, &ae) || ae.Status != 404 {
		t.Errorf("no record: %v", err)
	}
}

// The client's log names operations and answers, never the password, a token or a recipient.
func TestClientLogsNoSecrets(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sandbox.Options{IYSPullLag: -1}, nil)
	var logs testlog.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	c := e.client(t, func(cfg *iys.Config) { cfg.Logger = logger; cfg.MaxRetryWait = 10 * time.Millisecond })
	e.seed(t, sandbox.IYSConsent{Recipient: "+905321234567", Type: "MESAJ", Status: "RET", Source: "IYS_KISAMESAJ"})
	ctx := context.Background()
	if _, err := c.Status(ctx, iys.RecipientIndividual, iys.TypeMessage, "+905321234567"); err != nil {
		t.Fatal(err)
	}
	e.s.SetIYSFaults(sandbox.IYSFaults{ServerError: 1})
	if _, err := c.Changes(ctx, iys.PullIYS, "", 0); err != nil {
		t.Fatal(err)
	}
	e.s.ExpireIYSTokens()
	if _, err := c.MultiStatus(ctx, iys.RecipientIndividual, iys.TypeMessage, []string{"+905321234567"}); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	for _, s := range []string{testPassword, "+905321234567", "eyJ"} {
		if strings.Contains(out, s) {
			t.Errorf("the log shows %q:\n%s", s, out)
		}
	}
	for _, s := range []string{"op=token", "op=status", "iys retry", "iys token refused"} {
		if !strings.Contains(out, s) {
			t.Errorf("the log lacks %q:\n%s", s, out)
		}
	}
}
