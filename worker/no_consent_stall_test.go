package worker

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/providers"
)

// Order: an `iys import` (or a long sync page) holds the consents' turn (iys_consents_version FOR UPDATE,
// for its whole merge) while a commercial campaign runs; the provider refuses three recipients of a chunk
// for want of consent (Netgsm 50). Each refusal's write waited for the turn in the send loop (10 s each,
// then lost); written in the background, writes waiting on the turn held the pool's connections and the
// sends with them. The writes go one at a time, each attempt bounded and retried: the batch goes on, and
// the RETs are recorded once the import is over. With pgx's default pool, and with a worker process's
// (EngineConns), where a write waiting on the turn holds one connection of two.
func TestAProvidersNoConsentDoesNotStallTheBatchBehindAnImport(t *testing.T) {
	t.Parallel()
	for _, conns := range []int32{0, EngineConns} {
		name := "pgx's default pool"
		if conns > 0 {
			name = fmt.Sprintf("a worker's pool of %d", conns)
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			noConsentBehindAnImport(t, conns)
		})
	}
}

func noConsentBehindAnImport(t *testing.T, conns int32) {
	ctx := context.Background()
	f := plan(t, 10)
	if conns > 0 {
		cfg, err := pgxpool.ParseConfig(f.db.Config().ConnString())
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = conns
		small, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(small.Close)
		f.store = campaign.NewStore(small)
		f.h = f.handler(f.rdb)
	}
	refused := map[string]bool{phone(1): true, phone(2): true, phone(4): true}
	f.provider.fail = func(_ int, m providers.Message) error {
		if refused[m.To] {
			return &providers.Error{Provider: "netgsm", Status: 200, Code: 50, Class: providers.Permanent, NoConsent: true,
				Message: "İYS kontrollü gönderim"}
		}
		return nil
	}
	// The import's merge holds the turn.
	endImport := f.holdConsentsTurn(t)
	start := time.Now()
	f.runAll(t)
	took := time.Since(start)
	endImport()
	for u := range map[string]bool{"u1": true, "u2": true, "u4": true} {
		if st, _, _ := f.status(t, u); st != campaign.StatusFailed {
			t.Fatalf("%s %s, want failed", u, st)
		}
	}
	if took > 5*time.Second {
		t.Fatalf("a campaign of 10 with 3 provider no-consent refusals took %v while an import held the consents' turn: the consent writes held up the sends", took.Round(time.Second))
	}
	// Once the import is over, the refusals are recorded all the same (in the background, retried).
	for end := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var ret int
		if err := f.db.QueryRow(ctx, `SELECT count(*) FROM iys_consents WHERE recipient = ANY($1) AND status = 'RET'`,
			[]string{phone(1), phone(2), phone(4)}).Scan(&ret); err != nil {
			t.Fatal(err)
		}
		if ret == 3 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("%d of the 3 consents RET 15 s after the import ended: the refusals were lost", ret)
		}
	}
}

// holdConsentsTurn takes the consents' turn as an import's merge does (iys_consents_version FOR UPDATE)
// and returns what ends it (the test's end ends it too).
func (f *fixture) holdConsentsTurn(t *testing.T) (end func()) {
	t.Helper()
	tx, err := f.db.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	end = func() { once.Do(func() { tx.Rollback(context.Background()) }) } //nolint:errcheck
	t.Cleanup(end)
	if _, err := tx.Exec(context.Background(), `SELECT 1 FROM iys_consents_version FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	return end
}
