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
	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/internal/testdb"
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
	store, id, rdb, h := unreadableOptIns(t)
	ctx := context.Background()
	err := h.RunBatch(ctx, id, 0)
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
	// A server out of reach (a restart, a failover, or a wrong address) is first said to end by itself: the
	// setting is named as what to check if it lasts, not as the fix.
	if w, _ := state.Waits(ctx, rdb, id); !strings.Contains(w[WaitOptInsUnreadable].Detail, "ends by itself") || strings.Contains(re.Error(), "(set AUDIENCE_DATABASE_URL") {
		t.Fatalf("unreachable audience: waiting note %q, error %q; want it said to end by itself", w[WaitOptInsUnreadable].Detail, re.Error())
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

// A user joined with its devices has a row a device: the launch plans one (the first) and excludes the
// others as duplicate_user. The re-read at send time judges the user by the row of the token it was
// planned with: still opted in, it is sent. Before, any user the query returned twice was skipped as
// revoked. A user whose planned token is gone from the audience (the device removed) is not sent, even
// with another token still there.
func TestAUserWithSeveralDevicesIsJudgedByItsPlannedToken(t *testing.T) {
	t.Parallel()
	db, store, _, launch := pushPlan(t)
	ctx := context.Background()
	if _, err := db.Exec(ctx, `INSERT INTO devices VALUES ('u2', 'tok-2b', true, 'Ad2'), ('u3', 'tok-3b', true, 'Ad3')`); err != nil {
		t.Fatal(err)
	}
	rep := launch("devices")
	if rep.Excluded[campaign.ReasonDuplicateUser] != 2 || rep.Eligible != 5 {
		t.Fatalf("launch: %d eligible, excluded %v; want 5, and the 2 second devices as duplicate_user", rep.Eligible, rep.Excluded)
	}
	var token3 string
	if err := db.QueryRow(ctx, `SELECT address FROM campaign_recipients WHERE campaign_id = $1 AND user_id = 'u3'`, rep.ID).Scan(&token3); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `DELETE FROM devices WHERE user_id = 'u3' AND push_token = $1`, token3); err != nil {
		t.Fatal(err)
	}
	rdb, _ := testredis.New(t)
	h := NewHandler(Config{Store: store, Redis: rdb, Owner: "w",
		Providers:     map[campaign.Channel]providers.Provider{campaign.ChannelPush: pushProvider(t)},
		ProviderRates: map[string]float64{}})
	if err := h.RunBatch(ctx, rep.ID, 0); err != nil {
		t.Fatal(err)
	}
	var st2, st3 string
	if err := db.QueryRow(ctx, `SELECT (SELECT status || coalesce(':' || reason, '') FROM campaign_recipients WHERE campaign_id = $1 AND user_id = 'u2'),
		(SELECT status || coalesce(':' || reason, '') FROM campaign_recipients WHERE campaign_id = $1 AND user_id = 'u3')`, rep.ID).Scan(&st2, &st3); err != nil {
		t.Fatal(err)
	}
	if st2 != campaign.StatusSent {
		t.Errorf("u2, two devices, still opted in: %s; want sent", st2)
	}
	if st3 != "skipped:"+campaign.ReasonRevoked {
		t.Errorf("u3, its planned device removed: %s; want skipped:revoked", st3)
	}
}

// An audience query that takes more than a second to run again for a chunk still lets the chunk go: its
// consents' age is counted from the lease that follows the read. Before, a read of a second or more was
// never fresh enough to send on, and the chunk read it again for ever (an outside run sent nothing for
// minutes with a query of 1.5 s).
func TestASlowAudienceStillSends(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	for _, sql := range []string{
		`CREATE TABLE devices AS SELECT 'u' || i AS user_id, 'tok-' || i AS push_token, true AS push_opt_in FROM generate_series(1, 6) i`,
		`GRANT SELECT ON devices TO campaignctl_audience`,
	} {
		if _, err := db.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	store := campaign.NewStore(db)
	rdb, _ := testredis.New(t)
	for _, window := range []int{1, 8} {
		rep, err := (&campaign.Planner{Engine: db, Audience: db}).Plan(ctx, campaign.Spec{Name: fmt.Sprint("slow-", window), Channel: campaign.ChannelPush, BatchSize: 10,
			AudienceSQL: `SELECT user_id, push_token, push_opt_in FROM devices WHERE (SELECT pg_sleep(1.3)) IS NOT NULL`,
			Subject:     `Merhaba`, Message: `Size özel bir fırsat`})
		if err != nil {
			t.Fatal(err)
		}
		h := NewHandler(Config{Store: store, Redis: rdb, Owner: "w", SendWindow: window,
			Providers:     map[campaign.Channel]providers.Provider{campaign.ChannelPush: pushProvider(t)},
			ProviderRates: map[string]float64{}})
		stop := time.AfterFunc(30*time.Second, h.Stop)
		start := time.Now()
		err = h.RunBatch(ctx, rep.ID, 0)
		stop.Stop()
		if err != nil {
			t.Fatalf("window %d: %v", window, err)
		}
		// A read a chunk, and one again if the chunk waited: a few seconds, not a read for ever.
		if took := time.Since(start); took > 12*time.Second {
			t.Fatalf("window %d: the batch took %v with an audience of 1.3 s a read", window, took.Round(time.Second))
		}
		if c, err := store.Counts(ctx, rep.ID); err != nil || c.Sent != 6 {
			t.Fatalf("window %d: counts %+v (%v); want all 6 sent", window, c, err)
		}
	}
}

// The opt-ins are read again only on the audience database the campaign was launched on. A worker whose
// AUDIENCE_DATABASE_URL reaches another one (the engine's, when the variable was left out) with a table of
// the same name reads nothing there: nothing is sent, and status names both databases. Before, it read
// that table: an outside run sent to people who had withdrawn in the shop's database and skipped others.
func TestOptInsAreReadOnlyOnTheLaunchsAudienceDatabase(t *testing.T) {
	t.Parallel()
	engine, _ := testdb.New(t)
	shop, _ := testdb.New(t)
	ctx := context.Background()
	for _, db := range []*pgxpool.Pool{engine, shop} {
		for _, sql := range []string{
			`CREATE TABLE devices AS SELECT 'u' || i AS user_id, 'tok-' || i AS push_token, true AS push_opt_in FROM generate_series(1, 4) i`,
			`GRANT SELECT ON devices TO campaignctl_audience`,
		} {
			if _, err := db.Exec(ctx, sql); err != nil {
				t.Fatal(err)
			}
		}
	}
	rep, err := (&campaign.Planner{Engine: engine, Audience: shop}).Plan(ctx, campaign.Spec{Name: "shop", Channel: campaign.ChannelPush, BatchSize: 10,
		AudienceSQL: `SELECT user_id, push_token, push_opt_in FROM devices`, Subject: `Merhaba`, Message: `Size özel bir fırsat`})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := shop.Exec(ctx, `UPDATE devices SET push_opt_in = false WHERE user_id = 'u1'`); err != nil {
		t.Fatal(err)
	}
	store := campaign.NewStore(engine)
	rdb, _ := testredis.New(t)
	h := NewHandler(Config{Store: store, Redis: rdb, Owner: "w", // opt-ins read on the engine's database
		Providers:     map[campaign.Channel]providers.Provider{campaign.ChannelPush: pushProvider(t)},
		ProviderRates: map[string]float64{}})
	err = h.RunBatch(ctx, rep.ID, 0)
	var re *RetryError
	if !errors.As(err, &re) || re.Failure {
		t.Fatalf("the run on the engine's database returned %v; want the batch back for later", err)
	}
	if c, _ := store.Counts(ctx, rep.ID); c.Sent != 0 || c.Skipped != 0 {
		t.Fatalf("counts %+v: the opt-ins were read on another database than the launch's", c)
	}
	if w, _ := state.Waits(ctx, rdb, rep.ID); !strings.Contains(w[WaitOptInsUnreadable].Detail, "launched on the audience database") {
		t.Fatalf("waiting notes %v; want %s naming the launch's audience database", w, WaitOptInsUnreadable)
	}
	h.cfg.OptIns = &campaign.OptIns{Pool: shop}
	if err := h.RunBatch(ctx, rep.ID, 0); err != nil {
		t.Fatal(err)
	}
	if c, _ := store.Counts(ctx, rep.ID); c.Sent != 3 || c.Skipped != 1 {
		t.Fatalf("counts %+v on the shop's database; want 3 sent and u1, who withdrew there, skipped", c)
	}
}

// A push campaign cancelled while its opt-ins cannot be read is closed all the same: a run of a cancelled
// campaign reads no opt-in (it sends nothing), and a failed read leaves nothing in hand for the cancel to
// wait on. An outside run's cancel waited for as long as the audience stayed unreadable.
func TestACancelDoesNotWaitForTheOptIns(t *testing.T) {
	t.Parallel()
	store, id, _, h := unreadableOptIns(t)
	ctx := context.Background()
	if err := h.RunBatch(ctx, id, 0); err == nil {
		t.Fatal("the run sent with the opt-ins unreadable")
	}
	if _, err := store.Transition(ctx, id, []campaign.State{campaign.StateRunning}, campaign.StateCancelled); err != nil {
		t.Fatal(err)
	}
	if err := h.RunBatch(ctx, id, 0); err != nil && !errors.Is(err, errCampaignOver) {
		t.Fatalf("the run of the cancelled campaign: %v", err)
	}
	if c, err := store.Counts(ctx, id); err != nil || c.Pending != 0 || c.Sent != 0 || c.Skipped != 5 {
		t.Fatalf("counts %+v (%v); want all 5 closed as cancelled, none sent", c, err)
	}
}

// unreachableAudience is an audience pool whose server refuses every connection.
// unreadableOptIns plans pushPlan's campaign and gives it a handler whose audience database refuses every
// connection, on a Redis DB of its own.
func unreadableOptIns(t *testing.T) (*campaign.Store, int64, *redis.Client, *Handler) {
	t.Helper()
	_, store, id, _ := pushPlan(t)
	rdb, _ := testredis.New(t)
	h := NewHandler(Config{Store: store, Redis: rdb, Owner: "w", OptIns: &campaign.OptIns{Pool: unreachableAudience(t)},
		Providers:     map[campaign.Channel]providers.Provider{campaign.ChannelPush: pushProvider(t)},
		ProviderRates: map[string]float64{}})
	return store, id, rdb, h
}

func unreachableAudience(t *testing.T) *pgxpool.Pool {
	t.Helper()
	gone, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/nowhere?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gone.Close)
	return gone
}

// An audience that fails on a row's value when it is read again quotes the value in Postgres's error
// ("invalid input syntax for type integer: \"…@example.com\""): the address is masked in the error the
// queue keeps and in the waiting note status and the UI show. It was shown in full.
func TestAnOptInReadThatFailsOnAnAddressDoesNotShowIt(t *testing.T) {
	t.Parallel()
	db, store, id, _ := pushPlan(t)
	ctx := context.Background()
	for _, sql := range []string{
		`ALTER TABLE devices RENAME TO devices_base`,
		`CREATE VIEW devices AS SELECT user_id, push_token, push_opt_in,
			(first_name || '.gizli@example.com')::int::text AS first_name FROM devices_base`,
		`GRANT SELECT ON devices TO campaignctl_audience`,
	} {
		if _, err := db.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	rdb, _ := testredis.New(t)
	h := NewHandler(Config{Store: store, Redis: rdb, Owner: "w", OptIns: store.OptIns(),
		Providers:     map[campaign.Channel]providers.Provider{campaign.ChannelPush: pushProvider(t)},
		ProviderRates: map[string]float64{}})
	err := h.RunBatch(ctx, id, 0)
	var re *RetryError
	if !errors.As(err, &re) {
		t.Fatalf("the run returned %v; want the batch back for later", err)
	}
	w, _ := state.Waits(ctx, rdb, id)
	detail := w[WaitOptInsUnreadable].Detail
	for _, text := range []string{re.Error(), detail} {
		if !strings.Contains(text, "invalid input syntax") || !strings.Contains(text, "***@example.com") || strings.Contains(text, "gizli@") {
			t.Errorf("%q: want Postgres's error with the address it quotes masked", text)
		}
	}
	if c, err := store.Counts(ctx, id); err != nil || c.Pending != 5 {
		t.Fatalf("counts %+v (%v); want all 5 pending", c, err)
	}
}
