package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/worker"
)

// heldSender accepts every message but holds the first until release is closed.
type heldSender struct {
	started, release chan struct{}
	once             sync.Once
	mu               sync.Mutex
	sent             []string
}

func (p *heldSender) Name() string { return "gated" }
func (p *heldSender) Send(ctx context.Context, m providers.Message) (providers.Result, error) {
	first := false
	p.once.Do(func() { first = true; close(p.started) })
	if first {
		select {
		case <-p.release:
		case <-ctx.Done():
			return providers.Result{}, ctx.Err()
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sent = append(p.sent, m.To)
	return providers.Result{MessageID: fmt.Sprintf("SM%d", len(p.sent)), Segments: 1}, nil
}
func (p *heldSender) calls() int { p.mu.Lock(); defer p.mu.Unlock(); return len(p.sent) }

// The UI runs on another host than the workers; its link to Redis is down (a partition, a firewall
// change, Redis's maxclients reached) while the workers still reach Redis. An operator presses Pause:
// Postgres records it, but the halt mark cannot be written, and a worker that holds a chunk goes on
// sending the rest of it. The page says so, and how to stop them at once. Before, it said "Paused: no
// new send starts on any worker."
func TestAPauseTheUICouldNotHaltInRedisSaysSo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, rdb, store, rep := launchThree(t)
	p := &heldSender{started: make(chan struct{}), release: make(chan struct{})}
	h := worker.NewHandler(worker.Config{Store: store, Redis: rdb, Owner: "live", SendWindow: 1,
		Providers: map[campaign.Channel]providers.Provider{campaign.ChannelSMS: p}, ProviderRates: map[string]float64{}})
	done := make(chan error, 1)
	go func() { done <- h.RunBatch(ctx, rep.ID, 0) }()
	select {
	case <-p.started:
	case <-time.After(30 * time.Second):
		t.Fatal("no first send")
	}

	// The UI's own Redis client: unreachable from the UI's host.
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { down.Close() })
	u := &uiCampaigns{open: func(context.Context) (*pgxpool.Pool, error) { return db, nil }, redis: down,
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	mux := http.NewServeMux()
	u.register(mux)
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, httptest.NewRequest("POST", fmt.Sprintf("/campaigns/%d/pause", rep.ID), nil))
	loc := w.Header().Get("Location")

	// The operator trusts the page; the worker goes on.
	close(p.release)
	select {
	case err := <-done:
		t.Logf("live batch run: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the live batch run did not end")
	}
	if w.Code != http.StatusSeeOther || !strings.HasSuffix(loc, "done=pause-late") {
		t.Fatalf("POST pause with the UI's Redis down: %d, Location %q; want 303 to done=pause-late", w.Code, loc)
	}
	if note := uiNotes["pause-late"]; strings.Contains(note, "no new send starts") || !strings.Contains(note, "next chunk") {
		t.Errorf("the page says %q after a pause not halted in Redis", note)
	}
	if p.calls() < 2 {
		t.Errorf("%d sent: the worker, which reaches Redis, was to go on with its chunk (the case the page warns of)", p.calls())
	}
	if st, err := store.Get(ctx, rep.ID); err != nil || st.State != campaign.StatePaused {
		t.Errorf("state %v (%v), want paused in Postgres", st.State, err)
	}
}

// A paused campaign; the UI's link to Redis is down when the operator presses Resume. The resume changes
// nothing and answers 503: once Redis is back the campaign is still paused, with its halt mark and its
// Resume button. Before, it moved the campaign to running in Postgres, then failed to clear the halt:
// running in Postgres and halted in Redis, every worker handed its batches back every 30 s for good, and
// the page had no Resume button to finish it.
func TestAResumeWithoutRedisChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, rdb, store, rep := launchThree(t)
	if _, err := worker.Pause(ctx, worker.PauseOptions{Store: store, Redis: rdb, CampaignID: rep.ID}); err != nil {
		t.Fatal(err)
	}

	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { down.Close() })
	open := func(context.Context) (*pgxpool.Pool, error) { return db, nil }
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	mux := http.NewServeMux()
	(&uiCampaigns{open: open, redis: down, log: log}).register(mux)
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, httptest.NewRequest("POST", fmt.Sprintf("/campaigns/%d/resume", rep.ID), nil))
	t.Logf("POST resume with the UI's Redis down: %d", w.Code)

	// Redis is back (the UI reaches it again).
	mux = http.NewServeMux()
	(&uiCampaigns{open: open, redis: rdb, log: log}).register(mux)
	w2 := httptest.NewRecorder()
	mux.ServeHTTP(w2, httptest.NewRequest("GET", fmt.Sprintf("/campaigns/%d", rep.ID), nil))
	page := w2.Body.String()
	st, _ := store.Get(ctx, rep.ID)
	halt, _ := rdb.Get(ctx, worker.HaltKey(rep.ID)).Result()
	s, _ := worker.Status(ctx, worker.StatusOptions{Store: store, Redis: rdb, CampaignID: rep.ID})
	t.Logf("after it: state %s in Postgres, halt mark %q in Redis, waiting %+v; Resume button: %v",
		st.State, halt, s.Waiting, strings.Contains(page, "/resume"))
	// A live worker now: it sends nothing and hands the batch back, again and again.
	p := &heldSender{started: make(chan struct{}), release: make(chan struct{})}
	close(p.release)
	h := worker.NewHandler(worker.Config{Store: store, Redis: rdb, Owner: "live", SendWindow: 1,
		Providers: map[campaign.Channel]providers.Provider{campaign.ChannelSMS: p}, ProviderRates: map[string]float64{}})
	runErr := h.RunBatch(ctx, rep.ID, 0)
	t.Logf("a worker's run of batch 0: %v; %d sent", runErr, p.calls())
	if w.Code != http.StatusServiceUnavailable || st.State != campaign.StatePaused || halt != "paused" || !strings.Contains(page, "/resume") || p.calls() != 0 {
		t.Fatalf("after a resume with Redis down (answered %d): state %s, halt %q, Resume button %v, %d sent; want 503, paused with its halt and its button, nothing sent",
			w.Code, st.State, halt, strings.Contains(page, "/resume"), p.calls())
	}
}

// launchThree launches an SMS campaign of three recipients in one batch, in a database and Redis of the
// test's own.
func launchThree(t *testing.T) (*pgxpool.Pool, *redis.Client, *campaign.Store, campaign.Report) {
	t.Helper()
	ctx := context.Background()
	db, _ := testdb.New(t)
	rdb, _ := testredis.New(t)
	for _, sql := range []string{
		`CREATE TABLE customers (user_id text, phone text, first_name text)`,
		`GRANT SELECT ON customers TO campaignctl_audience`,
		`INSERT INTO customers SELECT 'u' || i, '+90532' || lpad(i::text, 7, '0'), 'Name' || i FROM generate_series(1, 3) i`,
		`INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date)
		 SELECT phone, 'MESAJ', 'BIREYSEL', 'ONAY', 'HS_WEB', now() FROM customers`,
		`INSERT INTO code_pools (name) VALUES ('p')`,
		`INSERT INTO promo_codes (pool, code) SELECT 'p', 'C' || i FROM generate_series(1, 9) i`,
	} {
		if _, err := db.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	store := campaign.NewStore(db)
	rep, err := worker.Launch(ctx, worker.LaunchOptions{Planner: &campaign.Planner{Engine: db, Audience: db}, Redis: rdb,
		Spec: campaign.Spec{Name: "n", Channel: campaign.ChannelSMS, CodePool: "p", BatchSize: 3,
			AudienceSQL: `SELECT user_id, phone, first_name FROM customers`, Message: `Merhaba {{.first_name}}, kodunuz {{.code}}`}})
	if err != nil {
		t.Fatal(err)
	}
	return db, rdb, store, rep
}
