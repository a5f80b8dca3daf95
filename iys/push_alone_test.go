package iys_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/iys"
	"github.com/campaignctl/campaignctl/providers/sandbox"
)

// Two pushes at once (cron's and an operator's, or two cron runs when one is slow) read the same
// waiting refusal. Without turns, the second sends it while the first's request is on the way: İYS gets
// the RET twice. A push started while another runs waits for it, and finds nothing left to send.
func TestTwoPushesAtOnceSendARefusalOnce(t *testing.T) {
	const addr = "+905324444471"
	e, pool, brand, base, plain := onayOnBothSides(t, addr)
	ctx := context.Background()
	if rep, err := iys.RecordRefusals(ctx, pool, brand, []iys.Refusal{{Via: iys.ViaTwilioInbound, EventID: "SM71", Kind: "inbound",
		Recipient: addr, Type: "MESAJ", Evidence: "RET", At: base}}); err != nil || rep.Outboxed != 1 {
		t.Fatalf("refusal: %+v %v", rep, err)
	}

	var secondRep iys.PushReport
	b := beside(func() (err error) { secondRep, err = iys.Push(ctx, pool, plain, iys.PushOptions{}); return err })
	// The first push's request is on its way: a second push starts.
	hook := &hookTransport{method: http.MethodPost, pathSuffix: "/consents", before: b.start}
	first := e.client(t, func(cfg *iys.Config) { cfg.HTTPClient = &http.Client{Transport: hook} })
	rep, err := iys.Push(ctx, pool, first, iys.PushOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b.wait(t)
	t.Logf("first push: %+v; second: %+v", rep, secondRep)
	key := sandbox.IYSAddKey(addr, "MESAJ", "BIREYSEL")
	st := e.s.IYSStats()
	if st.AddsReceived != 1 || rep.Sent != 1 || secondRep.Sent != 0 {
		t.Fatalf("İYS received %d adds (accepted for the key: %d, replayed %d); pushes sent %d and %d: want the refusal sent once, by the first",
			st.AddsReceived, st.AddsAcceptedByKey[key], st.AddsReplayed, rep.Sent, secondRep.Sent)
	}
}

// A push waiting for another gives up when its context ends, and says what it waited for.
func TestAPushWaitingForAnotherStopsWithItsContext(t *testing.T) {
	const addr = "+905324444472"
	e, pool, brand, base, plain := onayOnBothSides(t, addr)
	ctx := context.Background()
	if _, err := iys.RecordRefusals(ctx, pool, brand, []iys.Refusal{{Via: iys.ViaTwilioInbound, EventID: "SM72", Kind: "inbound",
		Recipient: addr, Type: "MESAJ", Evidence: "RET", At: base}}); err != nil {
		t.Fatal(err)
	}
	var waitErr error
	hook := &hookTransport{method: http.MethodPost, pathSuffix: "/consents", before: func() {
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		_, waitErr = iys.Push(wctx, pool, plain, iys.PushOptions{})
	}}
	first := e.client(t, func(cfg *iys.Config) { cfg.HTTPClient = &http.Client{Transport: hook} })
	if _, err := iys.Push(ctx, pool, first, iys.PushOptions{}); err != nil {
		t.Fatal(err)
	}
	if waitErr == nil {
		t.Fatal("the push started during another ended without error within 300 ms: want it waiting, then stopped by its context")
	}
	t.Logf("waiting push: %v", waitErr)
	if st := e.s.IYSStats(); st.AddsReceived != 1 {
		t.Fatalf("İYS received %d adds, want 1", st.AddsReceived)
	}
	// The lock went with the first push: a third one runs at once.
	done := make(chan error, 1)
	go func() { _, err := iys.Push(ctx, pool, plain, iys.PushOptions{}); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a push after the others waited more than 10 s: the lock was left held")
	}
}

// Two syncs at once: the second, started while the first pulls its first page of the citizens' changes,
// waits for it and pulls from where it stopped. Without turns both pull and apply the same pages.
func TestTwoSyncsAtOncePullEachChangeOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sandbox.Options{IYSPullLag: -1}, nil)
	pool, _ := testdb.New(t)
	ctx := context.Background()
	base := time.Now().Add(-time.Hour)
	for i := 1; i <= 5; i++ {
		e.seed(t, sandbox.IYSConsent{Recipient: fmt.Sprintf("+90532300000%d", i), Type: "MESAJ", RecipientType: "BIREYSEL",
			Status: "ONAY", Source: "IYS_MESAJ", ConsentDate: base.Add(time.Duration(i) * time.Minute).In(iys.Istanbul()).Format(iys.DateLayout)})
	}
	plain := e.client(t, func(cfg *iys.Config) { cfg.PageSize = 2 })
	var secondRep iys.SyncReport
	b := beside(func() (err error) { secondRep, err = iys.Sync(ctx, pool, plain); return err })
	hook := &hookTransport{method: http.MethodGet, pathSuffix: "/changes", query: "source=IYS", before: b.start}
	first := e.client(t, func(cfg *iys.Config) { cfg.PageSize = 2; cfg.HTTPClient = &http.Client{Transport: hook} })
	rep, err := iys.Sync(ctx, pool, first)
	if err != nil {
		t.Fatal(err)
	}
	b.wait(t)
	pulled := func(r iys.SyncReport) int { return r.Changes[iys.PullHS] + r.Changes[iys.PullIYS] }
	if pulled(rep) != 5 || pulled(secondRep) != 0 {
		t.Fatalf("the first sync pulled %d changes and the second %d: want 5 and 0 (each change pulled once)", pulled(rep), pulled(secondRep))
	}
}

// besideRun is a second run started while a first one is under way (from the first's request hook).
type besideRun struct {
	run  func() error
	done chan error
}

func beside(run func() error) *besideRun { return &besideRun{run: run, done: make(chan error, 1)} }

// start starts the second run and gives it 1.5 s: time to run to its end, unless it waits for the first.
func (b *besideRun) start() {
	go func() { b.done <- b.run() }()
	select {
	case err := <-b.done:
		b.done <- err // it ran to its end while the first was under way
	case <-time.After(1500 * time.Millisecond): // it waits for the first
	}
}

// wait waits for the second run's end, after the first's.
func (b *besideRun) wait(t *testing.T) {
	t.Helper()
	select {
	case err := <-b.done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the second run did not end within 30 s of the first")
	}
}
