package netgsm_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/netgsm"
	"github.com/campaignctl/campaignctl/providers/sandbox"
)

func reportSetup(t *testing.T, opts sandbox.Options) (*netgsm.Provider, *sandbox.Server) {
	t.Helper()
	opts.NetgsmUserCode, opts.NetgsmPassword = "8503000000", password
	s := sandbox.New(opts)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	p, err := netgsm.New(netgsm.Config{UserCode: "8503000000", Password: password, Header: "KAMPANYA", BaseURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return p, s
}

// A report says nothing final before Netgsm knows, then each message's status: delivered, or why not,
// with İYS's refusal told apart.
func TestReportStatuses(t *testing.T) {
	t.Parallel()
	p, _ := reportSetup(t, sandbox.Options{ReceiptDelay: 300 * time.Millisecond})
	ctx := context.Background()
	from := time.Now().Add(-time.Minute)
	ids := map[string]string{}
	var jobs []string
	for _, to := range []string{"+905321234567", "+905550116001", "+905550112042", "+905550113000"} {
		res, err := p.Send(ctx, providers.Message{To: to, Body: "Kodunuz ABC123", Commercial: true})
		if err != nil {
			t.Fatalf("send to %s: %v", to, err)
		}
		ids[res.MessageID] = to
		jobs = append(jobs, res.MessageID)
	}
	got, err := p.Report(ctx, jobs, from, time.Now().Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 {
		t.Fatalf("report before the delay: %+v, want the 4 jobs", got)
	}
	for _, j := range got {
		if d, _, _ := j.Outcome(); j.Status != netgsm.ReportPending || d != "" {
			t.Errorf("before the delay %s: status %d (%q), want pending", j.JobID, j.Status, d)
		}
	}
	time.Sleep(400 * time.Millisecond)
	got, err = p.Report(ctx, jobs, from, time.Now().Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		status   int
		delivery string
		refusal  bool
	}{
		"+905321234567": {1, "delivered", false},
		"+905550116001": {16, "undelivered", true},
		"+905550112042": {12, "undelivered", false},
		"+905550113000": {13, "failed", false},
	}
	if len(got) != 4 {
		t.Fatalf("report: %+v, want 4 jobs", got)
	}
	for _, j := range got {
		to := ids[j.JobID]
		w := want[to]
		d, reason, refused := j.Outcome()
		if j.Number != to || j.Status != w.status || d != w.delivery || refused != w.refusal || (d != "delivered") != (reason != "") {
			t.Errorf("%s: number %s status %d outcome (%q, %q, %v), want status %d, %q, refusal %v",
				to, j.Number, j.Status, d, reason, refused, w.status, w.delivery, w.refusal)
		}
	}
	// Jobs Netgsm never had: no records, not an error.
	if got, err := p.Report(ctx, []string{"1234"}, from, time.Now()); err != nil || len(got) != 0 {
		t.Errorf("unknown job: %+v, %v; want nothing and no error", got, err)
	}
}

// Netgsm answers 10 report queries a minute: the next is a throttle with the minute to wait, not a failure.
func TestReportThrottled(t *testing.T) {
	t.Parallel()
	p, _ := reportSetup(t, sandbox.Options{NetgsmReportsPerMinute: 2})
	ctx := context.Background()
	for i := range 3 {
		_, err := p.Report(ctx, []string{"1"}, time.Now().Add(-time.Hour), time.Now())
		var pe *providers.Error
		switch {
		case i < 2 && err != nil:
			t.Fatalf("query %d: %v", i, err)
		case i == 2 && (!errors.As(err, &pe) || !pe.Throttled || pe.Class != providers.Transient || pe.RetryAfter < time.Minute):
			t.Fatalf("query over the limit: %#v, want a throttle with a minute's Retry-After", err)
		}
	}
}

// Wrong credentials are the account's fault, and the password is in no error.
func TestReportAccountError(t *testing.T) {
	t.Parallel()
	_, s := reportSetup(t, sandbox.Options{})
	srv := httptest.NewServer(s)
	defer srv.Close()
	p, err := netgsm.New(netgsm.Config{UserCode: "8503000000", Password: "wr0ngpassword", Header: "KAMPANYA", BaseURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Report(context.Background(), []string{"1"}, time.Now().Add(-time.Hour), time.Now())
	var pe *providers.Error
	if !errors.As(err, &pe) || !pe.Account || pe.Class != providers.Permanent {
		t.Fatalf("wrong password: %#v, want an account error", err)
	}
	if msg := err.Error(); strings.Contains(msg, "wr0ngpassword") {
		t.Errorf("the password is in the error: %s", msg)
	}
}

// A status Netgsm did not give (null, missing, not a number) or one not documented is not final: the
// message is asked about again rather than recorded as undelivered.
func TestReportOutcomeOfUnknownStatuses(t *testing.T) {
	t.Parallel()
	for _, st := range []int{-1, 0, 5, 99} {
		if d, reason, refused := (netgsm.ReportJob{JobID: "1", Status: st}).Outcome(); d != "" || reason != "" || refused {
			t.Errorf("status %d: (%q, %q, %v), want not final", st, d, reason, refused)
		}
	}
	for st, want := range map[int]string{1: "delivered", 2: "undelivered", 4: "failed", 14: "failed", 16: "undelivered"} {
		if d, _, _ := (netgsm.ReportJob{JobID: "1", Status: st}).Outcome(); d != want {
			t.Errorf("status %d: %q, want %s", st, d, want)
		}
	}
}
