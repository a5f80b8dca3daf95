package worker_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/worker"
)

// A Redis that stops answering between the command's check and the cancel's halt mark (it answered the
// ping, then froze): the cancel is recorded in Postgres, closes what no run holds, and returns at once
// with what is left, rather than read the held batches' claims from a Redis that does not answer, one
// timeout after another for each, until its --wait is over. With no halt mark, the run sends the rest of
// the chunk it holds and stops there; a cancel once Redis answers closes the rest.
func TestACancelWhoseHaltMarkRedisDoesNotAnswerLeavesTheHeldBatchesToTheWorkers(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t, 6, nil)
	ctx := context.Background()
	c := e.plan(t, "frozen-halt", 3)
	p := newGatedProvider()
	done := e.liveWorker(c.ID, 0, p)
	wait(t, p.started, "the first send")

	// A server that takes connections and never answers: a frozen Redis.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var (
		mu   sync.Mutex
		held []net.Conn
	)
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, conn)
			mu.Unlock()
		}
	}()
	frozen := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), DialTimeout: 500 * time.Millisecond,
		ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { frozen.Close() })

	start := time.Now()
	rep, err := worker.Cancel(ctx, worker.CancelOptions{Store: e.store, Redis: frozen, CampaignID: c.ID, Wait: 30 * time.Second})
	took := time.Since(start)
	if err == nil || !strings.Contains(err.Error(), "not closed yet") {
		t.Fatalf("cancel with Redis not answering its halt mark: %+v, %v; want the recipients runs hold said not closed yet", rep, err)
	}
	if took > 10*time.Second {
		t.Fatalf("cancel with Redis not answering its halt mark took %v: it waited on Redis for the batch a run holds", took)
	}
	if rep.Was != campaign.StateRunning || rep.Halted || rep.Cancelled != 3 || rep.Counts.Pending != 3 {
		t.Fatalf("cancel: %+v; want recorded from running, no halt mark, batch 1 cancelled, batch 0 (3 held) left", rep)
	}
	if got, err := e.store.Get(ctx, c.ID); err != nil || got.State != campaign.StateCancelled {
		t.Fatalf("campaign after the cancel: %+v, %v; want cancelled", got, err)
	}

	close(p.release)
	if err := wait(t, done, "the live batch run"); err != nil {
		t.Fatalf("live batch run: %v", err)
	}
	again, err := worker.Cancel(ctx, worker.CancelOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID, Wait: 5 * time.Second})
	if err != nil || again.Counts.Pending != 0 {
		t.Fatalf("cancel once Redis answers: %+v, %v; want nothing left pending", again, err)
	}
	// Without the halt mark, the run sends the rest of the chunk it holds (batch 0's three), and nothing else.
	if got := p.calls(); got != 3 {
		t.Fatalf("%d messages sent, want the chunk the run held at the cancel (3)", got)
	}
	if got := e.counts(t, c.ID); got.Sent != 3 || got.Skipped != 3 || got.Pending != 0 {
		t.Fatalf("counts %+v; want 3 sent (the chunk held), 3 skipped (cancelled)", got)
	}
}
