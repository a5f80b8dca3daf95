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

// A launch that gives no batch size spreads a small campaign of a one-message channel over
// campaign.SpreadBatches batches (at least campaign.MinSpreadBatch recipients each): each batch is a run,
// and four batches of 500 sent a 2,000-SMS campaign at a low cap through four runs, one message in flight
// each. A large campaign keeps batches of 500, and e-mail keeps its 1000 (one request): its batches are
// not spread. The campaign row and the dry run say the same as the batches written.
func TestASmallCampaignSpreadsOverBatches(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	mustExec(t, db, `CREATE TABLE aud (ord int, user_id text, phone text, email text, first_name text)`)
	mustExec(t, db, `GRANT SELECT ON aud TO campaignctl_audience`)
	mustExec(t, db, `INSERT INTO aud SELECT i, 'u' || i, '+90532' || lpad(i::text, 7, '0'), 'm' || i || '@example.com', 'N' || i
		FROM generate_series(1, 40000) i`)
	mustExec(t, db, `INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date)
		SELECT phone, 'MESAJ', 'BIREYSEL', 'ONAY', 'HS_WEB', now() FROM aud
		UNION ALL SELECT email, 'EPOSTA', 'BIREYSEL', 'ONAY', 'HS_WEB', now() FROM aud`)
	p := &campaign.Planner{Engine: db, Audience: db}
	for i, tc := range []struct {
		channel     campaign.Channel
		n, size     int
		wantBatches int
		wantSize    int // the campaign's batch size; the largest batch holds as many or all
	}{
		{campaign.ChannelSMS, 2000, 0, 63, 32},     // 2000 / 64 = 31.25: 32 a batch
		{campaign.ChannelSMS, 100, 0, 10, 10},      // no fewer than 10 a batch
		{campaign.ChannelSMS, 5, 0, 1, 10},         // one batch
		{campaign.ChannelSMS, 40000, 0, 80, 500},   // large: batches of 500
		{campaign.ChannelSMS, 2000, 500, 4, 500},   // --batch-size given
		{campaign.ChannelEmail, 2000, 0, 2, 1000},  // e-mail: one request a batch
		{campaign.ChannelEmail, 2000, 250, 8, 250}, // e-mail, --batch-size given
	} {
		s := spec(fmt.Sprintf("spread-%d", i))
		s.Channel, s.BatchSize, s.CodePool = tc.channel, tc.size, ""
		s.AudienceSQL = fmt.Sprintf(`SELECT user_id, phone, first_name FROM aud WHERE ord <= %d`, tc.n)
		s.Message = `Merhaba {{.first_name}}`
		if tc.channel == campaign.ChannelEmail {
			s.AudienceSQL = fmt.Sprintf(`SELECT user_id, email, first_name FROM aud WHERE ord <= %d`, tc.n)
			s.Subject = "Merhaba"
		}
		s.DryRun = true
		dry, err := p.Plan(ctx, s)
		if err != nil {
			t.Fatalf("%s of %d, --batch-size %d, dry run: %v", tc.channel, tc.n, tc.size, err)
		}
		s.DryRun = false
		rep, err := p.Plan(ctx, s)
		if err != nil {
			t.Fatalf("%s of %d, --batch-size %d: %v", tc.channel, tc.n, tc.size, err)
		}
		var batches, biggest, rowSize, rowBatches int
		if err := db.QueryRow(ctx, `SELECT count(*), coalesce(max(size), 0) FROM campaign_batches WHERE campaign_id = $1`, rep.ID).Scan(&batches, &biggest); err != nil {
			t.Fatal(err)
		}
		if err := db.QueryRow(ctx, `SELECT batch_size, batches FROM campaigns WHERE id = $1`, rep.ID).Scan(&rowSize, &rowBatches); err != nil {
			t.Fatal(err)
		}
		if batches != tc.wantBatches || biggest != min(tc.wantSize, tc.n) || rep.Batches != batches || dry.Batches != batches || rowBatches != batches || rowSize != tc.wantSize {
			t.Errorf("%s of %d, --batch-size %d: %d batches of up to %d (report %d, dry run %d, campaign row %d of %d); want %d of up to %d",
				tc.channel, tc.n, tc.size, batches, biggest, rep.Batches, dry.Batches, rowBatches, rowSize, tc.wantBatches, tc.wantSize)
		}
	}
}
