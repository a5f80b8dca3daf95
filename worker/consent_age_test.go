package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/providers"
)

// A campaign launched with --max-consent-age 24h on consents synced a moment before. Its batch fails and
// waits (its retries, the DLQ) for three days with no sync or import; then it runs again (asynqmon's run,
// `dlq retry`, `resume`). It must not send on consents older than the launch allowed: a RET given in İYS
// meanwhile would be missed. It hands itself to the DLQ naming the sync, and sends once the consents are
// brought up to date. A campaign launched with --allow-stale-consent goes on.
func TestABatchRunLongAfterItsLaunchKeepsTheMaxConsentAge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := planAround(t, 10, func(s *campaign.Spec) { s.MaxConsentAge = 24 * time.Hour }, syncedNow(t))
	if _, err := f.db.Exec(ctx, `UPDATE iys_sync_state SET last_success_at = now() - interval '3 days'`); err != nil {
		t.Fatal(err)
	}
	err := f.h.RunBatch(ctx, f.id, 0)
	if err == nil || !errors.Is(err, asynq.SkipRetry) || !strings.Contains(err.Error(), "iys sync") {
		t.Fatalf("batch on consents synced 3 days ago (launched with --max-consent-age 24h): %v; want it handed to the DLQ, naming `campaignctl iys sync`", err)
	}
	// What `dlq list` and `status` show: the commands as they run, and no words of Asynq's.
	if retry := fmt.Sprintf("`campaignctl dlq retry --campaign %d`", f.id); !strings.HasSuffix(err.Error(), retry) || strings.Contains(err.Error(), asynq.SkipRetry.Error()) {
		t.Fatalf("the DLQ's last error %q: want it to end with %s, and nothing of Asynq's", err, retry)
	}
	if n := f.provider.total(); n != 0 {
		t.Fatalf("%d messages sent on consents synced 3 days ago (launched with --max-consent-age 24h)", n)
	}
	if _, err := f.db.Exec(ctx, `UPDATE iys_sync_state SET last_success_at = now()`); err != nil {
		t.Fatal(err)
	}
	f.runAll(t)
	if n := f.provider.total(); n == 0 {
		t.Fatal("nothing sent once the consents were brought up to date")
	}

	// Launched with --allow-stale-consent: the launch recorded it, and the batches go on.
	g := planAround(t, 10, func(s *campaign.Spec) { s.MaxConsentAge, s.AllowStaleConsent = 24*time.Hour, true }, nil)
	g.runAll(t)
	if n := g.provider.total(); n == 0 {
		t.Fatal("a campaign launched with --allow-stale-consent sent nothing")
	}
}

// --max-consent-age holds for every chunk, not only at a batch's start: a batch that started on consents
// young enough, and outlives their age, stops at its next chunk and hands itself to the DLQ naming the
// sync (outside, 74 % of a slow run's messages went after the limit). Synced again, the rest goes, once.
func TestABatchThatOutlivesItsConsentsAgeStops(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := planAround(t, 10, func(s *campaign.Spec) { s.MaxConsentAge = 2 * time.Second }, syncedNow(t))
	h := NewHandler(Config{Store: f.store, Redis: f.rdb, Owner: "test", SendWindow: 1, ChunkSize: 1,
		Providers: map[campaign.Channel]providers.Provider{campaign.ChannelSMS: f.provider}, ProviderRates: map[string]float64{}})
	// Five eligible recipients, a chunk each, 700 ms a send: the consents' 2 s run out after the third.
	f.provider.before = func(providers.Message) { time.Sleep(700 * time.Millisecond) }
	err := h.RunBatch(ctx, f.id, 0)
	if err == nil || !errors.Is(err, asynq.SkipRetry) || !strings.Contains(err.Error(), "iys sync") {
		t.Fatalf("a batch outliving its consents' age: %v; want it handed to the DLQ, naming `campaignctl iys sync`", err)
	}
	sent := f.provider.total()
	if sent == 0 || sent >= 5 {
		t.Fatalf("%d of 5 sent before the consents' age ran out; want some, not all", sent)
	}
	if c := f.counts(t); c.Pending != int64(5-sent) {
		t.Fatalf("counts %+v; want the %d not sent pending", c, 5-sent)
	}
	if _, err := f.db.Exec(ctx, `UPDATE iys_sync_state SET last_success_at = now()`); err != nil {
		t.Fatal(err)
	}
	f.provider.before = nil
	if err := h.RunBatch(ctx, f.id, 0); err != nil {
		t.Fatalf("the batch once synced again: %v", err)
	}
	if c := f.counts(t); c.Sent != 5 || c.Pending != 0 || f.provider.total() != 5 {
		t.Fatalf("counts %+v, %d messages; want the 5 sent once each", c, f.provider.total())
	}
}

// syncedNow is a planAround hook that records a consent import as of now before the launch: the consents
// are up to date when the campaign is planned.
func syncedNow(t *testing.T) func(db *pgxpool.Pool, launch func()) {
	return func(db *pgxpool.Pool, launch func()) {
		if _, err := db.Exec(context.Background(), `INSERT INTO iys_sync_state (source, last_success_at) VALUES ('import', now())`); err != nil {
			t.Fatal(err)
		}
		launch()
	}
}

// --max-consent-age holds for a chunk that waits for its tokens too: eight batch runs share a --rate of 2,
// each holding a leased one-recipient chunk while it waits its turn (about 4 s). Checked at each chunk's
// start only, the chunks leased just before the consents' age ran out went seconds after it (outside, under
// --rate 1: 9 messages in the 9 s after); now each run stops at its next send past the age, and hands
// its batch to the DLQ naming the sync.
func TestAChunkWaitingForItsTokensStopsWhenTheConsentsAgeRunsOut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const maxAge = 3 * time.Second
	f := planAround(t, 60, func(s *campaign.Spec) { s.MaxConsentAge, s.Rate, s.BatchSize = maxAge, 2, 6 }, syncedNow(t))
	var synced time.Time
	if err := f.db.QueryRow(ctx, `SELECT last_success_at FROM iys_sync_state`).Scan(&synced); err != nil {
		t.Fatal(err)
	}
	expiry := synced.Add(maxAge)
	var mu sync.Mutex
	var last time.Time
	f.provider.before = func(providers.Message) {
		mu.Lock()
		defer mu.Unlock()
		if now := time.Now(); now.After(last) {
			last = now
		}
	}
	h := NewHandler(Config{Store: f.store, Redis: f.rdb, Owner: "test", SendWindow: 1,
		Providers: map[campaign.Channel]providers.Provider{campaign.ChannelSMS: f.provider}, ProviderRates: map[string]float64{}})
	errs := make(chan error, 8)
	for b := range 8 {
		go func() { errs <- h.RunBatch(ctx, f.id, b) }()
	}
	stopped := 0
	for range 8 {
		err := <-errs
		switch {
		case err == nil:
		case errors.Is(err, asynq.SkipRetry) && strings.Contains(err.Error(), "iys sync"):
			stopped++
		default:
			t.Fatalf("a batch run returned %v; want it done, or handed to the DLQ naming `campaignctl iys sync`", err)
		}
	}
	if stopped == 0 {
		t.Fatal("no batch run stopped for the consents' age")
	}
	mu.Lock()
	defer mu.Unlock()
	late := last.Sub(expiry)
	t.Logf("%d runs stopped; the last message went %v after the consents' age ran out", stopped, late)
	if late > 2*time.Second {
		t.Fatalf("the last message went %v after the consents' age ran out (%v); want at most about a second (a chunk's consents are read again when a second old)", late, expiry)
	}
}
