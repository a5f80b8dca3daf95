package netgsm_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/providertest"
	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/netgsm"
	"github.com/campaignctl/campaignctl/providers/sandbox"
)

const password = "s3cretpass"

func setup(t *testing.T, cfg netgsm.Config) (*netgsm.Provider, *sandbox.Server) {
	t.Helper()
	s := sandbox.New(sandbox.Options{NetgsmUserCode: "8503000000", NetgsmPassword: password})
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	if cfg.UserCode == "" {
		cfg.UserCode = "8503000000"
	}
	if cfg.Password == "" {
		cfg.Password = password
	}
	if cfg.Header == "" {
		cfg.Header = "KAMPANYA"
	}
	cfg.BaseURL = srv.URL
	p, err := netgsm.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p, s
}

func TestSendAccepted(t *testing.T) {
	t.Parallel()
	p, s := setup(t, netgsm.Config{})
	res, err := p.Send(context.Background(), providers.Message{To: "+905321234567", Body: "Merhaba Ayşe, kodunuz ABC123"})
	if err != nil {
		t.Fatal(err)
	}
	msgs := s.Messages()
	if len(msgs) != 1 || res.MessageID == "" || msgs[0].SID != res.MessageID || msgs[0].To != "+905321234567" ||
		msgs[0].From != "KAMPANYA" || msgs[0].Provider != "netgsm" || msgs[0].Body != "Merhaba Ayşe, kodunuz ABC123" {
		t.Fatalf("result %+v, sandbox saw %+v", res, msgs)
	}
	if res.Segments != 1 {
		t.Errorf("segments %d, want 1", res.Segments)
	}
}

// The İYS filter follows the campaign: Netgsm checks İYS for commercial messages, for the right recipient
// type, and not for transactional ones.
func TestIYSFilterFollowsTheMessage(t *testing.T) {
	t.Parallel()
	p, s := setup(t, netgsm.Config{})
	for i, m := range []providers.Message{
		{Commercial: true, RecipientType: "BIREYSEL"}, {Commercial: true, RecipientType: "TACIR"}, {Commercial: false},
	} {
		m.To, m.Body = fmt.Sprintf("+90532000000%d", i), "kod"
		if _, err := p.Send(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for _, m := range s.Messages() {
		got = append(got, m.IYSFilter)
	}
	if strings.Join(got, ",") != "11,12,0" {
		t.Fatalf("İYS filters %v, want 11 (individuals), 12 (merchants), 0 (transactional)", got)
	}
}

func perr(t *testing.T, err error) *providers.Error {
	t.Helper()
	var pe *providers.Error
	if !errors.As(err, &pe) {
		t.Fatalf("error %v (%T) is not a *providers.Error", err, err)
	}
	if strings.Contains(err.Error(), password) {
		t.Fatalf("the password is in the error: %v", err)
	}
	return pe
}

func TestSendRefusals(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		cfg     netgsm.Config
		to      string
		class   providers.Class
		code    int
		account bool
		sent    bool // a request reached the sandbox
	}{
		{"wrong password", netgsm.Config{Password: "wrongpass"}, "+905321234567", providers.Permanent, 30, true, true},
		{"İYS refuses the number", netgsm.Config{}, "+905550021610", providers.Permanent, 50, false, true},
		{"not a Turkish mobile", netgsm.Config{}, "+14155550100", providers.Permanent, 0, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, s := setup(t, tc.cfg)
			_, err := p.Send(context.Background(), providers.Message{To: tc.to, Body: "kod", Commercial: true})
			pe := perr(t, err)
			if pe.Class != tc.class || pe.Code != tc.code || pe.AccountLevel() != tc.account {
				t.Fatalf("%v: class %v code %d account %v; want %v %d %v", err, pe.Class, pe.Code, pe.AccountLevel(), tc.class, tc.code, tc.account)
			}
			if pe.NoConsent != (tc.code == 50) { // İYS holds no consent for the number
				t.Fatalf("%v: NoConsent %v", err, pe.NoConsent)
			}
			if got := s.Stats().Requests; (got > 0) != tc.sent {
				t.Fatalf("%d requests reached the sandbox", got)
			}
			if len(s.Messages()) != 0 {
				t.Fatal("a refused message was recorded")
			}
		})
	}
}

func TestSendFaults(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		faults sandbox.Faults
		class  providers.Class
		status int
		code   int
	}{
		{"503", sandbox.Faults{Rate503: 1}, providers.Transient, 503, 101},
		{"500", sandbox.Faults{Rate500: 1}, providers.Transient, 500, 100},
		{"HTML 503", sandbox.Faults{RateRaw503: 1}, providers.Transient, 503, 0},
		{"rate limit (code 80)", sandbox.Faults{Rate429: 1}, providers.Transient, 200, 80},
		{"reset after the request was written", sandbox.Faults{RateReset: 1}, providers.Ambiguous, 0, 0},
		{"accepted, then no answer", sandbox.Faults{RateTimeout: 1}, providers.Ambiguous, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, s := setup(t, netgsm.Config{Timeout: 300 * time.Millisecond})
			tc.faults.Only = "netgsm"
			s.SetFaults(tc.faults)
			_, err := p.Send(context.Background(), providers.Message{To: "+905321234567", Body: "kod"})
			pe := perr(t, err)
			if pe.Throttled != (tc.code == 80) {
				t.Errorf("%v: throttled %v", err, pe.Throttled)
			}
			if pe.Class != tc.class || pe.Status != tc.status || pe.Code != tc.code {
				t.Fatalf("%v: class %v status %d code %d; want %v %d %d", err, pe.Class, pe.Status, pe.Code, tc.class, tc.status, tc.code)
			}
			if strings.Contains(err.Error(), "5321234567") {
				t.Fatalf("the number is in the error: %v", err)
			}
		})
	}
	// Faults aimed at Twilio leave Netgsm alone: that is what a failover test needs.
	p, s := setup(t, netgsm.Config{})
	s.SetFaults(sandbox.Faults{Rate503: 1, Only: "twilio"})
	if _, err := p.Send(context.Background(), providers.Message{To: "+905321234567", Body: "kod"}); err != nil {
		t.Fatalf("faults for twilio only: %v", err)
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  netgsm.Config
		want string
	}{
		{netgsm.Config{Password: "p", Header: "H"}, "set NETGSM_USERCODE"},
		{netgsm.Config{UserCode: "u", Header: "H"}, "set NETGSM_PASSWORD"},
		{netgsm.Config{UserCode: "u", Password: "p", Header: "KAMPANYA ŞİRKETİ"}, "check NETGSM_HEADER"},
		{netgsm.Config{UserCode: "u", Password: "p", Header: "H", IYSFilter: "9"}, "give 11 (individuals)"},
		{netgsm.Config{UserCode: "u", Password: "p", Header: "H", BaseURL: "ftp://x"}, "check NETGSM_BASE_URL"},
	} {
		if _, err := netgsm.New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want an error saying %q", tc.cfg, err, tc.want)
		}
	}
}

// Warm opens the connections the next sends use (providers.Warmer).
func TestWarmOpensTheConnectionsOfTheNextSends(t *testing.T) {
	t.Parallel()
	const n = 3
	srv := providertest.NewCountingServer(t, sandbox.New(sandbox.Options{NetgsmUserCode: "8503000000", NetgsmPassword: password}), nil)
	p, err := netgsm.New(netgsm.Config{UserCode: "8503000000", Password: password, Header: "KAMPANYA", BaseURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	var _ providers.Warmer = p
	if err := p.Warm(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	if got := srv.Opened(n); got != n {
		t.Fatalf("Warm(%d) opened %d connections", n, got)
	}
	var sends sync.WaitGroup
	for i := range n {
		sends.Go(func() {
			if _, err := p.Send(context.Background(), providers.Message{To: fmt.Sprintf("+90532123%04d", i), Body: "Merhaba"}); err != nil {
				t.Error(err)
			}
		})
	}
	sends.Wait()
	if got := srv.Opened(n); got != n {
		t.Errorf("%d sends after Warm(%d) opened %d connections of their own", n, n, got-n)
	}
}

// Netgsm takes at most 20 messages to one number within a minute (code 85 beyond): the refusal is the
// number's, not the account's. It is transient with a minute's wait, and it asks nobody to slow down.
func TestANumberOverItsMinuteIsLimitedAloneWithCode85(t *testing.T) {
	t.Parallel()
	s := sandbox.New(sandbox.Options{NetgsmUserCode: "8503000000", NetgsmPassword: password, NetgsmPerNumber: 2})
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	p, err := netgsm.New(netgsm.Config{UserCode: "8503000000", Password: password, Header: "KAMPANYA", BaseURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 2 {
		if _, err := p.Send(ctx, providers.Message{To: "+905321234567", Body: "kod"}); err != nil {
			t.Fatalf("message %d of 2 to the number: %v", i+1, err)
		}
	}
	_, err = p.Send(ctx, providers.Message{To: "+905321234567", Body: "kod"})
	pe := perr(t, err)
	if pe.Code != 85 || pe.Class != providers.Transient || !pe.RecipientLimited || pe.Throttled || pe.AsksToSlowDown() || pe.RetryAfter < time.Minute {
		t.Fatalf("a third message within the minute: %v (code %d, class %v, recipient limited %v, throttled %v, retry after %v); want code 85, transient, the recipient limited, nobody slowed, a minute's wait",
			err, pe.Code, pe.Class, pe.RecipientLimited, pe.Throttled, pe.RetryAfter)
	}
	if strings.Contains(err.Error(), "5321234567") {
		t.Fatalf("the number is in the error: %v", err)
	}
	if _, err := p.Send(ctx, providers.Message{To: "+905329876543", Body: "kod"}); err != nil {
		t.Fatalf("another number at the same time: %v", err)
	}
}
