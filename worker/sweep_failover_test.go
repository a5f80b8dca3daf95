package worker

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/internal/testredis"
)

// failOverOn is a hook that fails master over to replica (failOver) just before the first command that
// names key, so that the command and those after it reach the new master.
type failOverOn struct {
	t       *testing.T
	key     string
	fired   bool
	master  *testredis.Server
	replica *testredis.Replica
	addr    *atomic.Pointer[string]
}

func (h *failOverOn) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *failOverOn) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *failOverOn) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !h.fired {
			for _, a := range cmd.Args() {
				if s, ok := a.(string); ok && s == h.key {
					h.fired = true
					failOver(h.t, h.master, h.replica, h.addr)
					break
				}
			}
		}
		return next(ctx, cmd)
	}
}

// The sweeper reads the epoch and leases a dead run's chunk on the master; the master fails over to its
// lagging replica just before the sweeper reads the chunk's claims, which the replica never received. The
// sweeper must not take their absence for "never sent" and free the chunk: its read is refused (the epoch
// was renewed on the new master) and the chunk stays leased, so the run that takes it over later finds it
// under another epoch and settles it as unknown. Nobody is sent twice.
func TestSweepAcrossAFailoverFreesNothingItCouldNotRead(t *testing.T) {
	t.Parallel()
	f := plan(t, 10) // eligible in batch 0: u1 u2 u4 u7 u8
	ctx := context.Background()
	c := f.campaign(t)
	master := testredis.StartServer(t)
	replica := master.StartReplica(t)
	var addr atomic.Pointer[string]
	a := master.Addr()
	addr.Store(&a)
	rdb := followingClient(t, &addr, true)
	e0, err := Epoch(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	if err := replica.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	replica.Lag()
	users := f.batchUsers(t, 0)
	if _, err := f.store.LeaseChunk(ctx, c, users, campaign.Lease{Token: "dead", Epoch: e0, TTL: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	// The dead run had u1 sent and was waiting for the provider's answer for u2.
	n := Nonce(c) + "/"
	rdb.Set(ctx, ClaimKey(f.id, "u1"), n+state.SentValue("SMdead", 1), 0)
	rdb.Set(ctx, ClaimKey(f.id, "u2"), n+state.InFlightValue(time.Now(), "dead"), 0)
	time.Sleep(5 * time.Millisecond)

	rdb.AddHook(&failOverOn{t: t, key: ClaimKey(f.id, "u1"), master: master, replica: replica, addr: &addr})
	h := f.handler(rdb)
	h.cfg.LeaseTTL = 300 * time.Millisecond
	settled, err := h.Sweep(ctx)
	if err == nil {
		t.Errorf("the sweep settled %d recipients from claims read on the new master, under the epoch of the old one", settled)
	}
	var held int
	f.db.QueryRow(ctx, `SELECT coalesce(sum(cardinality(lease_users)), 0) FROM campaign_batches WHERE campaign_id = $1`, f.id).Scan(&held) //nolint:errcheck
	if held != len(users) {
		t.Errorf("%d recipients still leased after the sweep, want the %d of the dead run's chunk", held, len(users))
	}

	time.Sleep(h.cfg.LeaseTTL + 100*time.Millisecond)
	if err := f.handler(rdb).RunBatch(ctx, f.id, 0); err != nil {
		t.Fatal(err)
	}
	f.assertOnce(t)
	if got := f.provider.total(); got != 0 {
		t.Errorf("provider got %d messages for the dead run's chunk (u1 was sent, u2 maybe), want none", got)
	}
	for _, u := range users {
		if st, _, _ := f.status(t, u); st != campaign.StatusUnknown {
			t.Errorf("%s: %s, want unknown", u, st)
		}
	}
}

// A send a fallback accepted and that a run records from its claim alone (its worker died before it
// recorded it; the sweep or the batch's next run finds the answer in the claim) is the fallback's: its
// provider, and the reason that says so. Before, the claim held no provider, the row none, and the
// report named the channel's first provider; Netgsm's report polling never asked about it.
func TestASendTheFallbackAcceptedIsItsWhenReadFromTheClaim(t *testing.T) {
	t.Parallel()
	f := plan(t, 8) // eligible: u1, u2, u4, u7, u8
	ctx := context.Background()
	c, err := f.store.Get(ctx, f.id)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.rdb.Set(ctx, ClaimKey(f.id, "u1"), state.Nonce(c)+"/"+state.SentValueVia("JOB-77", 1, "netgsm"), time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if err := f.h.RunBatch(ctx, f.id, 0); err != nil {
		t.Fatal(err)
	}
	var status, provider, id, reason string
	if err := f.db.QueryRow(ctx, `SELECT status, coalesce(provider, ''), coalesce(provider_message_id, ''), coalesce(reason, '')
		FROM campaign_recipients WHERE campaign_id = $1 AND user_id = 'u1'`, f.id).Scan(&status, &provider, &id, &reason); err != nil {
		t.Fatal(err)
	}
	if status != campaign.StatusSent || provider != "netgsm" || id != "JOB-77" || !strings.Contains(reason, "the fallback") {
		t.Fatalf("u1: %s, provider %q, message %q, reason %q; want sent through netgsm, the fallback, as its claim says", status, provider, id, reason)
	}
	if c := f.counts(t); c.Sent != 5 {
		t.Fatalf("counts %+v; want the 5 eligible sent", c)
	}
	f.assertOnce(t)
}
