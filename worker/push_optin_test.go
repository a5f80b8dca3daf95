package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/providers"
)

// A push recipient's opt-in lives in the customer's database, behind the audience query. One withdrawn
// after the launch (the app's switch turned off, the row gone from the audience) stops the send, as an
// İYS RET does for SMS: the worker runs the audience query again for the chunk it leases. Before, the
// opt-in was the one the launch saw, and every recipient was sent.
func TestAPushOptInWithdrawnAfterTheLaunchStopsTheSend(t *testing.T) {
	t.Parallel()
	for _, window := range []int{1, 8} {
		db, store, id, _ := pushPlan(t)
		ctx := context.Background()
		for _, sql := range []string{
			`UPDATE devices SET push_opt_in = false WHERE user_id IN ('u2', 'u3')`,
			`DELETE FROM devices WHERE user_id = 'u4'`,
		} {
			if _, err := db.Exec(ctx, sql); err != nil {
				t.Fatal(err)
			}
		}
		rdb, _ := testredis.New(t)
		h := NewHandler(Config{Store: store, Redis: rdb, Owner: "w", SendWindow: window,
			Providers:     map[campaign.Channel]providers.Provider{campaign.ChannelPush: pushProvider(t)},
			ProviderRates: map[string]float64{}})
		if err := h.RunBatch(ctx, id, 0); err != nil {
			t.Fatalf("window %d: %v", window, err)
		}
		got := map[string]string{}
		rows, err := db.Query(ctx, `SELECT user_id, status || coalesce(':' || reason, '') FROM campaign_recipients WHERE campaign_id = $1`, id)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var u, s string
			if err := rows.Scan(&u, &s); err != nil {
				t.Fatal(err)
			}
			got[u] = s
		}
		if rows.Err() != nil {
			t.Fatal(rows.Err())
		}
		for _, u := range []string{"u2", "u3", "u4"} {
			if got[u] != "skipped:"+campaign.ReasonRevoked {
				t.Errorf("window %d: %s is %q; its opt-in was withdrawn after the launch: want skipped:%s", window, u, got[u], campaign.ReasonRevoked)
			}
		}
		if got["u5"] != "sent" {
			t.Errorf("window %d: u5, still opted in, is %q; want sent", window, got["u5"])
		}
		var logged int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM send_log WHERE campaign_id = $1 AND user_id IN ('u2', 'u3', 'u4') AND status = 'sent'`, id).Scan(&logged); err != nil {
			t.Fatal(err)
		}
		if logged != 0 {
			t.Errorf("window %d: the audit shows %d sends to recipients who withdrew", window, logged)
		}
	}
}

// An audience database that cannot be read leaves the chunk unsent and the run waiting: an opt-in that
// cannot be read is no opt-in, and no recipient is skipped for it either.
func TestPushOptInsThatCannotBeReadSendNothing(t *testing.T) {
	t.Parallel()
	_, store, id, _ := pushPlan(t)
	ctx := context.Background()
	gone, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:1/nowhere?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gone.Close)
	rdb, _ := testredis.New(t)
	h := NewHandler(Config{Store: store, Redis: rdb, Owner: "w", OptIns: &campaign.OptIns{Pool: gone},
		Providers:     map[campaign.Channel]providers.Provider{campaign.ChannelPush: pushProvider(t)},
		ProviderRates: map[string]float64{}})
	err = h.RunBatch(ctx, id, 0)
	var re *RetryError
	if !errors.As(err, &re) || re.Failure {
		t.Fatalf("the run returned %v; want the batch back for later, not a failure", err)
	}
	c, err := store.Counts(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if c.Sent != 0 || c.Skipped != 0 || c.Failed != 0 || c.Pending != 5 {
		t.Fatalf("counts %+v; want all 5 pending: nothing sent or skipped without the opt-ins", c)
	}
	// status says why: the wait is noted, and cleared once the opt-ins are read.
	if w, _ := state.Waits(ctx, rdb, id); !strings.Contains(w[WaitOptInsUnreadable].Detail, "AUDIENCE_DATABASE_URL") {
		t.Fatalf("waiting notes %v; want %s naming AUDIENCE_DATABASE_URL", w, WaitOptInsUnreadable)
	}
	h.cfg.OptIns = store.OptIns()
	if err := h.RunBatch(ctx, id, 0); err != nil {
		t.Fatal(err)
	}
	if c, err := store.Counts(ctx, id); err != nil || c.Sent != 4 || c.Failed != 1 {
		t.Fatalf("counts %+v (%v) once the audience is readable; want the 4 tokens sent and u1 failed (unregistered)", c, err)
	}
	if w, _ := state.Waits(ctx, rdb, id); len(w) > 0 {
		t.Fatalf("waiting notes %v after the opt-ins were read; want none", w)
	}
}

// The same when the opt-in is withdrawn while the chunk waits for its provider (its first sends refused
// with a 429 asking for 2 s): when the chunk's messages go, more than a second after its opt-ins were
// read, the audience is read again with the consents, and the recipient who withdrew is not sent.
func TestAPushOptInWithdrawnWhileTheChunkWaitsStopsTheSend(t *testing.T) {
	t.Parallel()
	for _, window := range []int{1, 8} {
		t.Run(fmt.Sprintf("window %d", window), func(t *testing.T) {
			t.Parallel()
			db, store, id, _ := pushPlan(t)
			ctx := context.Background()
			rdb, _ := testredis.New(t)
			p := newProvider()
			var once sync.Once
			p.before = func(providers.Message) {
				once.Do(func() {
					if _, err := db.Exec(ctx, `UPDATE devices SET push_opt_in = false WHERE user_id = 'u5'`); err != nil {
						t.Error(err)
					}
				})
			}
			refused := 1
			if window > 1 {
				refused = 5 // the whole first window
			}
			p.fail = func(call int, _ providers.Message) error {
				if call <= refused {
					return &providers.Error{Provider: "test", Status: 429, Throttled: true, RetryAfter: 2 * time.Second, Class: providers.Transient}
				}
				return nil
			}
			h := NewHandler(Config{Store: store, Redis: rdb, Owner: "w", SendWindow: window,
				Providers:     map[campaign.Channel]providers.Provider{campaign.ChannelPush: p},
				ProviderRates: map[string]float64{}})
			start := time.Now()
			if err := h.RunBatch(ctx, id, 0); err != nil {
				t.Fatal(err)
			}
			if waited := time.Since(start); waited < 2*time.Second {
				t.Fatalf("the batch took %v: the refusal did not make the chunk wait, so this tests nothing", waited)
			}
			if n := len(p.sentTo("tok-5")); n != 0 {
				t.Fatalf("u5 withdrew while its chunk waited 2 s for the provider, and got %d pushes", n)
			}
			for _, tok := range []string{"unregistered-1", "tok-2", "tok-3", "tok-4"} {
				if n := len(p.sentTo(tok)); n != 1 {
					t.Errorf("%s got %d pushes, want 1", tok, n)
				}
			}
			var st, reason string
			if err := db.QueryRow(ctx, `SELECT status, coalesce(reason, '') FROM campaign_recipients WHERE campaign_id = $1 AND user_id = 'u5'`, id).Scan(&st, &reason); err != nil {
				t.Fatal(err)
			}
			if st != campaign.StatusSkipped || reason != campaign.ReasonRevoked {
				t.Fatalf("u5: %s (%s), want skipped (revoked)", st, reason)
			}
		})
	}
}
