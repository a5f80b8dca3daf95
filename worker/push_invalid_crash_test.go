package worker

import (
	"context"
	"errors"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/faults"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/push"
	"github.com/campaignctl/campaignctl/providers/sandbox"
)

// pushPlan seeds five opted-in devices (u1's token is one FCM no longer knows) and launches a push
// campaign over them; it returns the launch function for a later campaign over the same audience.
func pushPlan(t *testing.T) (db *pgxpool.Pool, store *campaign.Store, id int64, launch func(name string) campaign.Report) {
	t.Helper()
	ctx := context.Background()
	db, _ = testdb.New(t)
	for _, sql := range []string{
		`CREATE TABLE devices AS SELECT 'u' || i AS user_id,
			CASE WHEN i = 1 THEN 'unregistered-1' ELSE 'tok-' || i END AS push_token,
			true AS push_opt_in, 'Ad' || i AS first_name FROM generate_series(1, 5) i`,
		`GRANT SELECT ON devices TO campaignctl_audience`,
	} {
		if _, err := db.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	launch = func(name string) campaign.Report {
		t.Helper()
		rep, err := (&campaign.Planner{Engine: db, Audience: db}).Plan(ctx, campaign.Spec{
			Name: name, Channel: campaign.ChannelPush, BatchSize: 10,
			AudienceSQL: `SELECT user_id, push_token, push_opt_in, first_name FROM devices`,
			Subject:     `Merhaba {{.first_name}}`, Message: `Size özel bir fırsat`,
		})
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	return db, campaign.NewStore(db), launch("push-1").ID, launch
}

// pushProvider is the real FCM adapter against the sandbox's FCM.
func pushProvider(t *testing.T) providers.Provider {
	t.Helper()
	srv := httptest.NewServer(sandbox.New(sandbox.Options{}))
	t.Cleanup(srv.Close)
	sa := filepath.Join(t.TempDir(), "sa.json")
	if err := sandbox.WriteServiceAccount(sa, srv.URL, "demo-project"); err != nil {
		t.Fatal(err)
	}
	p, err := push.New(push.Config{CredentialsFile: sa, BaseURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// FCM answers UNREGISTERED for u1's token; the worker writes "failed" into u1's claim, and then Postgres
// goes away (or the worker is killed) before it has marked the token invalid and recorded the outcome.
// The batch's next run (redelivery, `resume`) finds u1's claim answered and records u1 failed from it. The
// token is dead all the same: the next launch over the same audience must exclude it as invalid_address,
// not send to it again. Before, the mark was a call of its own after the claim's answer, whose failure was
// only logged, and a failure read back from a claim did not say the address was condemned.
func TestUnregisteredTokenIsMarkedInvalidWhenTheRunDiesAfterFCMsAnswer(t *testing.T) {
	t.Parallel()
	t.Run("postgres gone from the answer on, then redelivery", func(t *testing.T) {
		t.Parallel()
		db, store, id, launch := pushPlan(t)
		rdb, _ := testredis.New(t)
		fcm := pushProvider(t)
		ms := faults.NewStore(store)
		cfg := func(s Store, ttl time.Duration) Config {
			return Config{Store: s, Redis: rdb, Owner: "w", SendWindow: 1, LeaseTTL: ttl,
				Providers:     map[campaign.Channel]providers.Provider{campaign.ChannelPush: fcm},
				ProviderRates: map[string]float64{}}
		}
		// From u1's answer on, Postgres refuses the worker: the outcome (with the mark), the lease's release.
		rule := ms.Add(&faults.Rule{Match: func(c faults.Call) bool {
			return c.Name == "Record" || c.Name == "ReleaseBatch" || c.Name == "RenewLease"
		}, Kind: faults.Fail})
		first := NewHandler(cfg(ms, 300*time.Millisecond))
		notFailure(t, first.RunBatch(context.Background(), id, 0))
		if rule.Hits() == 0 {
			t.Fatal("the fault never hit the outcome's write")
		}
		v := rdb.Get(context.Background(), ClaimKey(id, "u1")).Val()
		if !strings.Contains(v, "UNREGISTERED") {
			t.Fatalf("u1's claim %q, want FCM's UNREGISTERED answer written into it", v)
		}
		// Postgres is back; the batch runs again on a clean worker once the first run's lease expired.
		ms.Clear()
		waitUntil(t, 10*time.Second, "the lease to expire", func() bool {
			var n int
			err := db.QueryRow(context.Background(), `SELECT count(*) FROM campaign_batches
				WHERE campaign_id = $1 AND lease_token IS NOT NULL AND lease_until > now()`, id).Scan(&n)
			return err == nil && n == 0
		})
		second := NewHandler(cfg(store, 0))
		for i := 0; i < 3; i++ {
			if err := second.RunBatch(context.Background(), id, 0); err == nil {
				break
			} else if i == 2 {
				t.Fatal(err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		checkInvalidAfter(t, db, id, launch)
	})
	t.Run("worker killed after the answer, chunk taken over", func(t *testing.T) {
		t.Parallel()
		db, store, id, launch := pushPlan(t)
		rdb, _ := testredis.New(t)
		fcm := pushProvider(t)
		ctx := context.Background()
		c, err := store.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		// The answer the dead worker got from FCM for u1's token, as it wrote it into the claim (a reason
		// that says the address is condemned).
		_, serr := fcm.Send(ctx, providers.Message{To: "unregistered-1", Subject: "Merhaba Ad1", Body: "Size özel bir fırsat"})
		var pe *providers.Error
		if !errors.As(serr, &pe) || !pe.BadAddress {
			t.Fatalf("sandbox FCM answered %v, want UNREGISTERED (bad address)", serr)
		}
		epoch, err := Epoch(ctx, rdb)
		if err != nil {
			t.Fatal(err)
		}
		rs, err := store.LoadBatch(ctx, id, 0)
		if err != nil {
			t.Fatal(err)
		}
		var users []string
		for _, r := range rs {
			users = append(users, r.UserID)
		}
		if _, err := store.LeaseChunk(ctx, c, users, campaign.Lease{Token: "dead", Epoch: epoch, TTL: time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		rdb.Set(ctx, ClaimKey(id, "u1"), Nonce(c)+"/"+state.ReasonValue(state.Failed, campaign.InvalidAddressReason(pe.Reason())), 0)
		time.Sleep(5 * time.Millisecond)
		h := NewHandler(Config{Store: store, Redis: rdb, Owner: "w2", SendWindow: 1,
			Providers:     map[campaign.Channel]providers.Provider{campaign.ChannelPush: fcm},
			ProviderRates: map[string]float64{}})
		if err := h.RunBatch(ctx, id, 0); err != nil {
			t.Fatal(err)
		}
		checkInvalidAfter(t, db, id, launch)
	})
}

// checkInvalidAfter checks that u1 failed as unregistered, the others were sent, and that a new launch
// over the same audience leaves u1's dead token out as invalid_address.
func checkInvalidAfter(t *testing.T, db *pgxpool.Pool, id int64, launch func(string) campaign.Report) {
	t.Helper()
	ctx := context.Background()
	var st, reason string
	if err := db.QueryRow(ctx, `SELECT status, coalesce(reason, '') FROM campaign_recipients WHERE campaign_id = $1 AND user_id = 'u1'`,
		id).Scan(&st, &reason); err != nil {
		t.Fatal(err)
	}
	if st != campaign.StatusFailed || !strings.Contains(reason, "UNREGISTERED") {
		t.Fatalf("u1: %s (%q), want failed as UNREGISTERED", st, reason)
	}
	var sent int
	db.QueryRow(ctx, `SELECT count(*) FROM campaign_recipients WHERE campaign_id = $1 AND status = 'sent'`, id).Scan(&sent) //nolint:errcheck
	if sent != 4 {
		t.Fatalf("%d sent, want u2..u5", sent)
	}
	var marked int
	db.QueryRow(ctx, `SELECT count(*) FROM invalid_addresses WHERE channel = 'push' AND address = 'unregistered-1'`).Scan(&marked) //nolint:errcheck
	rep := launch("push-2")
	if marked != 1 || rep.Excluded[campaign.ReasonInvalidAddress] != 1 {
		t.Fatalf("after FCM answered UNREGISTERED for u1's token: %d invalid_addresses rows for it, next launch excluded %v;"+
			" want the token marked invalid and the next launch to exclude it as invalid_address (it plans u1 to the dead token again)",
			marked, rep.Excluded)
	}
}
