package campaign_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/campaignctl/campaignctl/campaign"

	"github.com/campaignctl/campaignctl/internal/testdb"
)

// A plan's batches are what its recipients' batch numbers say: each batch of the campaign holds as many
// recipients as its size records, and no recipient is in a batch the campaign does not have. The batches
// are computed from the count (no scan of the rows); eligible counts that are and are not a multiple of
// the batch size, with and without a code pool, and an audience with some rows excluded before the
// eligible ones.
func TestAPlansBatchesMatchItsRecipients(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	mustExec(t, db, `CREATE TABLE aud (ord int, user_id text, phone text, first_name text)`)
	mustExec(t, db, `GRANT SELECT ON aud TO campaignctl_audience`)
	// 23 rows: every fifth has no consent (excluded), 19 are eligible.
	mustExec(t, db, `INSERT INTO aud SELECT i, 'u' || i, '+90532' || lpad(i::text, 7, '0'), 'N' || i FROM generate_series(1, 23) i`)
	mustExec(t, db, `INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date)
		SELECT phone, 'MESAJ', 'BIREYSEL', 'ONAY', 'HS_WEB', now() FROM aud WHERE ord % 5 <> 0`)
	mustExec(t, db, `INSERT INTO code_pools (name) VALUES ('p')`)
	mustExec(t, db, `INSERT INTO promo_codes (pool, code) SELECT 'p', 'C' || i FROM generate_series(1, 200) i`)
	p := &campaign.Planner{Engine: db, Audience: db}

	type batch struct{ Batch, Size int64 }
	for i, tc := range []struct {
		pool      string
		batchSize int
	}{{"p", 1}, {"p", 4}, {"p", 19}, {"p", 500}, {"", 3}, {"", 19}, {"", 7}} {
		s := spec(fmt.Sprintf("batches-%d", i))
		s.CodePool, s.BatchSize = tc.pool, tc.batchSize
		if tc.pool == "" {
			s.Message = `Merhaba {{.first_name}}`
		}
		rep, err := p.Plan(ctx, s)
		if err != nil {
			t.Fatalf("pool %q, batches of %d: %v", tc.pool, tc.batchSize, err)
		}
		if rep.Eligible != 19 {
			t.Fatalf("pool %q, batches of %d: %d eligible, want 19", tc.pool, tc.batchSize, rep.Eligible)
		}
		read := func(sql string) []batch {
			rows, err := db.Query(ctx, sql, rep.ID)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			var out []batch
			for rows.Next() {
				var b batch
				if err := rows.Scan(&b.Batch, &b.Size); err != nil {
					t.Fatal(err)
				}
				out = append(out, b)
			}
			return out
		}
		have := read(`SELECT batch, size FROM campaign_batches WHERE campaign_id = $1 ORDER BY batch`)
		want := read(`SELECT batch, count(*) FROM campaign_recipients WHERE campaign_id = $1 GROUP BY batch ORDER BY batch`)
		if diff := cmp.Diff(want, have); diff != "" {
			t.Errorf("pool %q, batches of %d: the campaign's batches (-recipients' +campaign_batches):\n%s", tc.pool, tc.batchSize, diff)
		}
		if n := int64((19 + tc.batchSize - 1) / tc.batchSize); int64(len(have)) != n || rep.Batches != int(n) {
			t.Errorf("pool %q, batches of %d: %d batches (report %d), want %d", tc.pool, tc.batchSize, len(have), rep.Batches, n)
		}
	}
}
