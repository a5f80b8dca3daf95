package receipts_test

import (
	"context"
	"net"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/netgsm"
	"github.com/campaignctl/campaignctl/providers/receipts"
	"github.com/campaignctl/campaignctl/providers/sandbox"
)

// A poller that cannot reach Netgsm round after round gives up after GiveUpAfter rounds (so that its
// process lets another poll), and counts the refused queries; a poller that may never give up does not.
func TestNetgsmPollerGivesUpAfterFailedRounds(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there: every query fails before it is sent
	rep, err := netgsm.NewReporter(netgsm.Config{UserCode: "u", Password: "p", BaseURL: "http://" + addr, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	due := func(context.Context, int64, string, int) ([]receipts.DueMessage, error) {
		return []receipts.DueMessage{{CampaignID: 1, UserID: "u", Address: "+905321234567", MessageID: "123", SentAt: time.Now()}}, nil
	}
	p := &receipts.NetgsmPoller{Reporter: rep, Due: due, Every: time.Millisecond, GiveUpAfter: 3,
		Sink: receipts.SinkFunc(func(context.Context, []receipts.Receipt) error { return nil })}
	done := make(chan bool)
	go func() { done <- p.Run(context.Background()) }()
	select {
	case gaveUp := <-done:
		if !gaveUp {
			t.Fatal("Run returned without giving up")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a poller failing every round did not give up")
	}
	if s := p.Stats(); s.Rejected["provider_transient"] < 2 || s.Accepted != 0 {
		t.Fatalf("stats %+v: want the refused queries counted", s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	p2 := &receipts.NetgsmPoller{Reporter: rep, Due: due, Every: time.Millisecond}
	if p2.Run(ctx) {
		t.Fatal("a poller without GiveUpAfter gave up")
	}
}

// Netgsm's limit of 10 report queries a minute holds: a query it refuses as over the limit (code 80)
// makes the poller wait the minute out before its next, whatever its interval, and is counted apart.
func TestNetgsmPollerWaitsOutTheReportLimit(t *testing.T) {
	t.Parallel()
	sb := sandbox.New(sandbox.Options{NetgsmReportsPerMinute: 2})
	srv := httptest.NewServer(sb)
	defer srv.Close()
	rep, err := netgsm.NewReporter(netgsm.Config{UserCode: "u", Password: "p", BaseURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	due := func(context.Context, int64, string, int) ([]receipts.DueMessage, error) {
		return []receipts.DueMessage{{CampaignID: 1, UserID: "u", Address: "+905321234567", MessageID: "123", SentAt: time.Now()}}, nil
	}
	p := &receipts.NetgsmPoller{Reporter: rep, Due: due, Every: time.Millisecond,
		Sink: receipts.SinkFunc(func(context.Context, []receipts.Receipt) error { return nil })}
	for i := range 3 {
		wait, ok := p.Poll(context.Background())
		switch {
		case i < 2 && (!ok || wait != time.Millisecond):
			t.Fatalf("query %d within the limit: wait %v, ok %v", i, wait, ok)
		case i == 2 && (ok || wait < time.Minute):
			t.Fatalf("query over the limit: wait %v, ok %v; want a minute's wait", wait, ok)
		}
	}
	if s := p.Stats(); s.Accepted != 2 || s.Rejected["throttled"] != 1 {
		t.Fatalf("stats %+v: want 2 queries answered, 1 throttled", s)
	}
}

// A report that names another number than the recipient's (a job ID recorded against the wrong row) is
// not applied: counted as unmatched, nothing recorded; the right number's is.
func TestNetgsmPollerAppliesAReportToItsNumberOnly(t *testing.T) {
	t.Parallel()
	sb := sandbox.New(sandbox.Options{ReceiptDelay: time.Millisecond, NetgsmReportsPerMinute: -1})
	srv := httptest.NewServer(sb)
	defer srv.Close()
	cfg := netgsm.Config{UserCode: "u", Password: "p", Header: "KAMPANYA", BaseURL: srv.URL}
	sender, err := netgsm.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	res, err := sender.Send(context.Background(), providers.Message{To: "+905321234567", Body: "kod"})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // the sandbox's report is final
	rep, _ := netgsm.NewReporter(cfg)
	var got []receipts.Receipt
	poll := func(addr string) receipts.Stats {
		p := &receipts.NetgsmPoller{Reporter: rep, Every: time.Millisecond,
			Due: func(context.Context, int64, string, int) ([]receipts.DueMessage, error) {
				return []receipts.DueMessage{{CampaignID: 1, UserID: "u", Address: addr, MessageID: res.MessageID, SentAt: time.Now().Add(-time.Second)}}, nil
			},
			Sink: receipts.SinkFunc(func(_ context.Context, rs []receipts.Receipt) error { got = append(got, rs...); return nil })}
		p.Poll(context.Background())
		return p.Stats()
	}
	if s := poll("+905329999999"); s.Unmatched != 1 || s.Receipts != 0 || len(got) != 0 {
		t.Fatalf("another number's report: stats %+v, recorded %+v; want it unmatched and nothing recorded", s, got)
	}
	if s := poll("+905321234567"); s.Receipts != 1 || len(got) != 1 || got[0].Status != "delivered" {
		t.Fatalf("its own number's report: stats %+v, recorded %+v", s, got)
	}
}
