package demo_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/demo"
	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/iys"
)

// The seed stands for a complete İYS export and marks the consents up to date. A partial import after it
// (a one-row correction) must not: it made every seeded consent look fresh to the launches'
// --max-consent-age, since the seed's consents had no history that said they came from İYS's data.
func TestAPartialImportAfterASeedDoesNotMakeTheConsentsFresh(t *testing.T) {
	pool, _ := testdb.New(t)
	ctx := context.Background()
	if _, err := demo.Seed(ctx, pool, demo.SeedOptions{Users: 20, Pool: "demo"}); err != nil {
		t.Fatal(err)
	}
	syncedAt := func() time.Time {
		t.Helper()
		var at time.Time
		if err := pool.QueryRow(ctx, `SELECT last_success_at FROM iys_sync_state WHERE brand_code = '' AND source = $1`, iys.SourceImport).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
	seeded := syncedAt()
	time.Sleep(10 * time.Millisecond)
	csv := iys.Header + "\n+905559990001,MESAJ,BIREYSEL,ONAY,HS_WEB,2026-01-02 10:00:00\n"
	rep, err := iys.Import(ctx, pool, strings.NewReader(csv), iys.ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Missing == 0 {
		t.Errorf("a one-row import after a seed of 20 users misses none of their consents; want them all missing from the file")
	}
	if at := syncedAt(); !at.Equal(seeded) {
		t.Errorf("the consents were marked up to date at %v by a one-row import (the seed's %v)", at, seeded)
	}
}
