package iys_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/iys"
	"github.com/campaignctl/campaignctl/providers/sandbox"
)

// Sync stores each page with its cursor: a malformed page stops it with nothing of that page written, the
// next run goes on from the stored cursor, and the consents count as up to date only when both pulls
// reached the end. A later decision is never overwritten by an earlier one.
func TestSyncResumesAfterABadPageAndKeepsTheLatestDecision(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	fake := sandbox.New(sandbox.Options{IYSPullLag: -1})
	srv := httptest.NewServer(fake)
	defer srv.Close()
	client, err := iys.NewClient(iys.Config{BaseURL: srv.URL, Username: "u", Password: "p", IYSCode: "1", BrandCode: "2",
		PageSize: 2, RatePerSecond: 1000, MaxRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	base := time.Now().Add(-time.Hour)
	var cs []sandbox.IYSConsent
	for i := 1; i <= 5; i++ {
		cs = append(cs, sandbox.IYSConsent{Recipient: fmt.Sprintf("+90532200000%d", i), Type: "MESAJ", RecipientType: "BIREYSEL",
			Status: "ONAY", Source: "IYS_MESAJ", ConsentDate: base.Add(time.Duration(i) * time.Minute).Format("2006-01-02 15:04:05")})
	}
	if _, err := fake.AddIYSConsents(cs...); err != nil {
		t.Fatal(err)
	}
	count := func(sql string) int {
		var n int
		if err := db.QueryRow(ctx, sql).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// Pages of 2: the first sync takes 3 pages of the citizens' source.
	if rep, err := iys.Sync(ctx, db, client); err != nil || rep.Changes[iys.PullIYS] != 5 || rep.Applied != 5 {
		t.Fatalf("first sync: %+v, %v", rep, err)
	}
	if got := count(`SELECT count(*) FROM iys_consents`); got != 5 {
		t.Fatalf("%d consents after a full sync, want 5", got)
	}
	// A RET older than the stored ONAY (a late delivery of an old decision) does not overwrite it; a newer
	// one does.
	if _, err := fake.AddIYSConsents(
		sandbox.IYSConsent{Recipient: "+905322000001", Type: "MESAJ", RecipientType: "BIREYSEL", Status: "RET", Source: "IYS_MESAJ",
			ConsentDate: base.Add(-time.Hour).Format("2006-01-02 15:04:05")},
		sandbox.IYSConsent{Recipient: "+905322000002", Type: "MESAJ", RecipientType: "BIREYSEL", Status: "RET", Source: "IYS_MESAJ",
			ConsentDate: base.Add(30 * time.Minute).Format("2006-01-02 15:04:05")},
	); err != nil {
		t.Fatal(err)
	}
	fake.SetIYSFaults(sandbox.IYSFaults{Malformed: 1})
	if _, err := iys.Sync(ctx, db, client); err == nil {
		t.Fatal("a malformed page did not stop the sync")
	}
	if got := count(`SELECT count(*) FROM iys_consent_history`); got != 5 {
		t.Fatalf("history has %d rows after a broken page, want the 5 of the first sync only", got)
	}
	rep, err := iys.Sync(ctx, db, client)
	if err != nil || rep.Changes[iys.PullIYS] != 2 {
		t.Fatalf("resumed sync: %+v, %v; want the 2 new changes", rep, err)
	}
	if got := count(`SELECT count(*) FROM iys_consents WHERE status = 'RET'`); got != 1 {
		t.Fatalf("%d RETs stored, want 1 (the older RET must not replace a later ONAY)", got)
	}
	if got := count(`SELECT count(*) FROM iys_consents WHERE recipient = '+905322000002' AND status = 'RET' AND transaction_id IS NOT NULL`); got != 1 {
		t.Fatal("the newer RET was not stored with its transaction ID")
	}
	if got := count(`SELECT count(*) FROM iys_sync_state WHERE source IN ('pull:HS', 'pull:IYS') AND last_success_at IS NOT NULL AND cursor <> ''`); got != 1 {
		// HS had no changes: its cursor stays empty, its success is recorded.
		t.Fatalf("sync state: %d sources with a cursor and a success", got)
	}
}

// An import appends what it changed to the consent history, under its brand; an import that changes
// nothing appends nothing.
func TestImportKeepsTheHistory(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	const head = "recipient,type,recipient_type,status,source,consent_date\n"
	imp := func(body string) {
		t.Helper()
		if _, err := iys.Import(ctx, db, strings.NewReader(head+body), iys.ImportOptions{BrandCode: "42"}); err != nil {
			t.Fatal(err)
		}
	}
	first := "+905321000001,MESAJ,BIREYSEL,ONAY,HS_WEB,2026-01-15 10:30:00\n+905321000002,MESAJ,BIREYSEL,ONAY,HS_WEB,2026-01-15 10:30:00\n"
	imp(first)
	imp(first)
	imp("+905321000002,MESAJ,BIREYSEL,RET,IYS_MESAJ,2026-02-01 09:00:00\n+905321000003,MESAJ,BIREYSEL,ONAY,HS_WEB,2026-02-01 09:00:00\n")
	var n, brand42, rets int
	db.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE brand_code = '42' AND origin = 'import'), count(*) FILTER (WHERE status = 'RET')
		FROM iys_consent_history`).Scan(&n, &brand42, &rets) //nolint:errcheck
	if n != 4 || brand42 != 4 || rets != 1 {
		t.Fatalf("history: %d rows (%d of brand 42 from imports, %d RET); want 4: two new, none for the repeat, one change and one new", n, brand42, rets)
	}
	if _, err := iys.LookupBrand(ctx, db, "42", "+905321000002", "MESAJ", "BIREYSEL"); err != nil {
		t.Fatal(err)
	}
	if _, err := iys.Lookup(ctx, db, "+905321000002", "MESAJ", "BIREYSEL"); !errors.Is(err, iys.ErrNoConsent) {
		t.Fatalf("a brand 42 consent was found without a brand: %v", err)
	}
}
