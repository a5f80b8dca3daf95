package iys_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/iys"
	"github.com/campaignctl/campaignctl/providers/sandbox"
)

// A person with an ONAY in İYS (and here) refuses by SMS: the local consent becomes RET and the RET waits
// in the outbox for İYS (due two business days later). Before the push runs, the daily
// `iys sync --reverify` asks İYS, which still says ONAY (its record is older than the refusal). The
// local refusal is newer than İYS's decision: the consent stays RET. Before, the answer was dated now and
// turned the RET back into ONAY.
func TestAReverificationKeepsARefusalIYSHasNotTakenYet(t *testing.T) {
	const addr = "+905324444449"
	_, pool, brand, base, c := onayOnBothSides(t, addr)
	ctx := context.Background()

	rep, err := iys.RecordRefusals(ctx, pool, brand, []iys.Refusal{{Via: iys.ViaTwilioInbound, EventID: "SMrv1", Kind: "inbound",
		Recipient: addr, Type: "MESAJ", Evidence: "RET", At: base}})
	if err != nil || rep.Revoked != 1 || rep.Outboxed != 1 {
		t.Fatalf("refusal: %+v %v", rep, err)
	}
	if st := consentStatus(t, pool, addr, "MESAJ", "BIREYSEL", brand); st != "RET" {
		t.Fatalf("after the refusal: %s, want RET", st)
	}
	rv, err := iys.Reverify(ctx, pool, c, "MESAJ", "BIREYSEL")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("reverify: %+v", rv)
	if st := consentStatus(t, pool, addr, "MESAJ", "BIREYSEL", brand); st != "RET" {
		t.Fatalf("after a re-verification the local consent is %s, want RET: the refusal at %s (newer than İYS's ONAY of %s) was undone",
			st, base.In(iys.Istanbul()).Format(iys.DateLayout), base.Add(-48*time.Hour).In(iys.Istanbul()).Format(iys.DateLayout))
	}
	// The RET reaches İYS; later the person gives consent again there. Now İYS's ONAY is newer than the
	// refusal, and a re-verification takes it.
	if prep, err := iys.Push(ctx, pool, c, iys.PushOptions{}); err != nil || prep.Accepted != 1 {
		t.Fatalf("push: %+v %v", prep, err)
	}
	if _, err := c.AddConsent(ctx, iys.ConsentChange{Recipient: addr, Type: "MESAJ", RecipientType: "BIREYSEL", Status: "ONAY",
		Source: "HS_WEB", ConsentDate: base.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if _, err := iys.Reverify(ctx, pool, c, "MESAJ", "BIREYSEL"); err != nil {
		t.Fatal(err)
	}
	if st := consentStatus(t, pool, addr, "MESAJ", "BIREYSEL", brand); st != "ONAY" {
		t.Fatalf("after the RET was registered and consent given again in İYS, a re-verification left %s, want ONAY", st)
	}
}

// The stored consent is RET (an old one), İYS holds a newer ONAY the pull never brought (the pull window
// of 7 days passed: what the re-verification is for). The re-verification stores İYS's ONAY, dated now.
// Minutes later the brand's call centre registers in İYS a RET the person gave half an hour before the
// re-verification (İYS accepts consent dates up to 3 business days back, and it is later than the ONAY
// İYS holds). The next sync pulls that RET: it is İYS's latest decision and becomes the local one. Before,
// the re-verification's ONAY was dated now and the pulled RET, dated before now, lost to it.
func TestAPullAfterAReverificationTakesIYSsLatestRET(t *testing.T) {
	e := newEnv(t, sandbox.Options{IYSPullLag: -1}, nil)
	pool, _ := testdb.New(t)
	ctx := context.Background()
	brand := fmt.Sprint(testBrand)
	const addr = "+905324444448"
	now := time.Now().Truncate(time.Second)
	// İYS: ONAY given 10 days ago (outside the pull's 7-day window); here: an older RET.
	e.seed(t, sandbox.IYSConsent{Recipient: addr, Type: "MESAJ", Status: "ONAY", Source: "HS_WEB",
		CreationDate: now.Add(-10 * 24 * time.Hour).In(iys.Istanbul()).Format(iys.DateLayout)})
	consentRows(t, pool, [6]any{addr, "MESAJ", "BIREYSEL", brand, "RET", now.Add(-20 * 24 * time.Hour)})
	c := e.client(t, nil)
	if _, err := iys.Sync(ctx, pool, c); err != nil {
		t.Fatal(err)
	}
	rv, err := iys.Reverify(ctx, pool, c, "MESAJ", "BIREYSEL")
	if err != nil || rv.Corrected != 1 {
		t.Fatalf("reverify: %+v %v", rv, err)
	}
	if st := consentStatus(t, pool, addr, "MESAJ", "BIREYSEL", brand); st != "ONAY" {
		t.Fatalf("after the re-verification: %s, want İYS's ONAY", st)
	}
	// The call centre's RET, taken 30 minutes ago, registered now.
	if _, err := c.AddConsent(ctx, iys.ConsentChange{Recipient: addr, Type: "MESAJ", RecipientType: "BIREYSEL", Status: "RET",
		Source: "HS_CAGRI_MERKEZI", ConsentDate: now.Add(-30 * time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if got := iysStatus(e, addr); got[:3] != "RET" {
		t.Fatalf("İYS holds %q", got)
	}
	rep, err := iys.Sync(ctx, pool, c)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sync: %+v", rep)
	if st := consentStatus(t, pool, addr, "MESAJ", "BIREYSEL", brand); st != "RET" {
		t.Fatalf("after the sync the local consent is %s while İYS holds %q: the pulled RET lost to the re-verification's ONAY dated %s",
			st, iysStatus(e, addr), "now")
	}
}

// İYS's dates are whole seconds, and a sync pulls the brand's source, then the citizens': two decisions of
// one second (a citizen's ONAY through İYS, the brand's RET) come in an order that is not İYS's. The one
// pulled second won: the local consent stayed ONAY while İYS held RET, and 500 of 500 such people were
// sent a commercial SMS (an outside run). A pulled ONAY of the same second as a stored RET no longer
// replaces it; a later ONAY does, and a same-second RET replaces an ONAY.
func TestAPulledONAYOfTheSameSecondAsAStoredRETDoesNotReplaceIt(t *testing.T) {
	pool, _ := testdb.New(t)
	ctx := context.Background()
	brand := fmt.Sprint(testBrand)
	at := time.Date(2026, 12, 5, 9, 8, 15, 0, time.UTC)
	apply := func(addr, status, source string, date time.Time, origin string) {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		if _, err := iys.ApplyChanges(ctx, tx, brand, []iys.Record{{Recipient: addr, Type: "MESAJ", RecipientType: "BIREYSEL",
			Status: status, Source: source, ConsentDate: date, CreationDate: date}}, origin); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	const a, b = "+905324444401", "+905324444402"
	apply(a, "RET", "HS_WEB", at, iys.OriginPull)     // the brand's source first
	apply(a, "ONAY", "IYS_MESAJ", at, iys.OriginPull) // then the citizens', same second
	if st := consentStatus(t, pool, a, "MESAJ", "BIREYSEL", brand); st != "RET" {
		t.Fatalf("a stored RET, then a pulled ONAY of the same second: %s, want RET", st)
	}
	apply(b, "ONAY", "HS_WEB", at, iys.OriginPull)
	apply(b, "RET", "IYS_MESAJ", at, iys.OriginPull)
	if st := consentStatus(t, pool, b, "MESAJ", "BIREYSEL", brand); st != "RET" {
		t.Fatalf("a stored ONAY, then a pulled RET of the same second: %s, want RET", st)
	}
	apply(a, "ONAY", "IYS_MESAJ", at.Add(time.Second), iys.OriginPull)
	if st := consentStatus(t, pool, a, "MESAJ", "BIREYSEL", brand); st != "ONAY" {
		t.Fatalf("a pulled ONAY a second after the RET: %s, want ONAY", st)
	}
}
