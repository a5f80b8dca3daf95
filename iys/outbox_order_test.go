package iys_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/iys"
	"github.com/campaignctl/campaignctl/providers/sandbox"
)

// a second refusal of the same person, recorded while the first one's RET still waits in the
// outbox, and after the person gave a new ONAY between the two (the RET of the first refusal is then
// older than İYS's ONAY), must still reach İYS: İYS must end RET.
func TestASecondRefusalWhileTheFirstsResultIsAwaitedReachesIYS(t *testing.T) {
	const addr = "+905324444441"
	e, pool, brand, base, c := onayOnBothSides(t, addr)
	ctx := context.Background()

	// 1. The person refuses (SMS "RET") at t1: local RET, queued for İYS. The push sends it in a batch
	//    (many refusals waiting; here BatchFrom 1): İYS registers it; the row is 'sent' until a later run
	//    collects the batch's result (İYS: no sooner than five minutes).
	t1 := base
	if rep, err := iys.RecordRefusals(ctx, pool, brand, []iys.Refusal{{Via: iys.ViaTwilioInbound, EventID: "SM1", Kind: "inbound",
		Recipient: addr, Type: "MESAJ", Evidence: "RET", At: t1}}); err != nil || rep.Outboxed != 1 {
		t.Fatalf("first refusal: %+v %v", rep, err)
	}
	if prep, err := iys.Push(ctx, pool, c, iys.PushOptions{BatchFrom: 1}); err != nil || prep.Awaiting != 1 {
		t.Fatalf("first push: %+v %v", prep, err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		st := ""
		for _, k := range e.s.IYSConsents() {
			if k.Recipient == addr {
				st = k.Status
			}
		}
		if st == "RET" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("İYS never processed the batch")
		}
	}
	// 2. At t2 the person gives consent again on the brand's web site: registered in İYS, and the
	//    sync's pull stores it locally (ONAY dated after the refusal: a new consent, it stands).
	t2 := base.Add(time.Hour)
	if _, err := c.AddConsent(ctx, iys.ConsentChange{Recipient: addr, Type: "MESAJ", RecipientType: "BIREYSEL", Status: "ONAY",
		Source: "HS_WEB", ConsentDate: t2}); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := iys.ApplyChanges(ctx, tx, brand, []iys.Record{{Recipient: addr, Type: "MESAJ", RecipientType: "BIREYSEL",
		Status: "ONAY", Source: "HS_WEB", ConsentDate: t2, CreationDate: t2}}, iys.OriginPull); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if st := consentStatus(t, pool, addr, "MESAJ", "BIREYSEL", brand); st != "ONAY" {
		t.Fatalf("after the new consent: %s, want ONAY", st)
	}
	// 3. At t3 the person refuses again: local RET again.
	t3 := base.Add(2 * time.Hour)
	rep, err := iys.RecordRefusals(ctx, pool, brand, []iys.Refusal{{Via: iys.ViaTwilioInbound, EventID: "SM2", Kind: "inbound",
		Recipient: addr, Type: "MESAJ", Evidence: "RET", At: t3}})
	if err != nil || rep.Revoked != 1 {
		t.Fatalf("second refusal: %+v %v", rep, err)
	}
	t.Logf("second refusal: %+v", rep)
	// 4. The next push runs: it collects the batch's result and sends what waits.
	opts := iys.PushOptions{ResultAfter: time.Millisecond}
	prep, err := iys.Push(ctx, pool, c, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("push: %+v", prep)
	if prep, err = iys.Push(ctx, pool, c, opts); err != nil {
		t.Fatal(err)
	}
	items, _ := iys.OutboxItems(ctx, pool, time.Now(), 0)
	for _, it := range items {
		t.Logf("outbox row %d: state %s code %s consent_date %s", it.ID, it.State, it.ErrorCode, it.RefusedAt.In(iys.Istanbul()).Format(iys.DateLayout))
	}
	inIYS := ""
	for _, k := range e.s.IYSConsents() {
		if k.Recipient == addr && k.Type == "MESAJ" && k.RecipientType == "BIREYSEL" {
			inIYS = k.Status + " " + k.ConsentDate
		}
	}
	if inIYS[:3] != "RET" {
		// What follows: a re-verification asks İYS, which says ONAY, and the local RET becomes ONAY.
		if _, err := iys.Reverify(ctx, pool, c, "MESAJ", "BIREYSEL"); err == nil {
			t.Logf("after a re-verification, the local consent is %s", consentStatus(t, pool, addr, "MESAJ", "BIREYSEL", brand))
		}
		t.Fatalf("İYS holds %q after the push: the second refusal (at %s) never reached İYS", inIYS, t3.In(iys.Istanbul()).Format(iys.DateLayout))
	}
}

// a sync page's statement (ApplyChanges) that starts while a refusal's transaction is under way
// (it holds the consents' version row) stores, for a key the refusal did not see (a TACIR record of the
// address), an ONAY dated before the refusal. The refusal turns every consent of its address and type,
// and one stored later must not stand as ONAY (afterRefusalSQL): here the sync's statement took its
// snapshot before the refusal committed, so it sees no refusal and stores ONAY.
func TestASyncPageStartedDuringARefusalStoresItsOlderONAYAsRET(t *testing.T) {
	pool, _ := testdb.New(t)
	ctx := context.Background()
	const brand = "654321"
	const addr = "+905321111112"
	consentRows(t, pool, [6]any{addr, "MESAJ", "BIREYSEL", brand, "ONAY", time.Now().Add(-72 * time.Hour)})
	onayAt := time.Now().Add(-24 * time.Hour).Truncate(time.Second)

	// Any writer of consents holds the version row a moment (here: a stand-in transaction), so that the
	// refusal is inside its transaction, waiting, when the sync's statement starts.
	hold, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback(ctx) //nolint:errcheck
	if _, err := hold.Exec(ctx, `SELECT 1 FROM iys_consents_version FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	waiters := func(n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			var got int
			pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
				AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()`).Scan(&got) //nolint:errcheck
			if got >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d waiters, want %d", got, n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	refused := make(chan error, 1)
	go func() {
		_, err := iys.RecordRefusals(ctx, pool, brand, []iys.Refusal{{Via: iys.ViaTwilioInbound, EventID: "SM1", Kind: "inbound",
			Recipient: addr, Type: "MESAJ", Evidence: "RET", At: time.Now()}})
		refused <- err
	}()
	waiters(1)
	synced := make(chan error, 1)
	go func() {
		synced <- func() error {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx) //nolint:errcheck
			if _, err := iys.ApplyChanges(ctx, tx, brand, []iys.Record{{Recipient: addr, Type: "MESAJ", RecipientType: "TACIR",
				Status: "ONAY", Source: "HS_WEB", ConsentDate: onayAt, CreationDate: onayAt}}, iys.OriginPull); err != nil {
				return err
			}
			return tx.Commit(ctx)
		}()
	}()
	waiters(2)
	if err := hold.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-refused; err != nil {
		t.Fatal(err)
	}
	if err := <-synced; err != nil {
		t.Fatal(err)
	}
	if st := consentStatus(t, pool, addr, "MESAJ", "BIREYSEL", brand); st != "RET" {
		t.Fatalf("BIREYSEL: %s, want RET", st)
	}
	if st := consentStatus(t, pool, addr, "MESAJ", "TACIR", brand); st != "RET" {
		t.Fatalf("TACIR ONAY dated %s, before the refusal, stored by a sync page that ran alongside it: %s, want RET", onayAt, st)
	}
}

// iysStatus is what the sandbox's İYS holds for addr's MESAJ BIREYSEL consent: "<status> <date>".
func iysStatus(e *env, addr string) string {
	for _, k := range e.s.IYSConsents() {
		if k.Recipient == addr && k.Type == "MESAJ" && k.RecipientType == "BIREYSEL" {
			return k.Status + " " + k.ConsentDate
		}
	}
	return ""
}

// Two orders of a refusal, a consent given again, and a second refusal. In the first, the second refusal
// finds the consent RET here (the new ONAY is not pulled yet) and turns nothing; the pull then brings İYS's
// ONAY, older than the refusal: the refusal's RET is queued then. In the second, the first RET still waits
// to be sent when the second refusal turns the new consent: the waiting RET takes the newer date. İYS
// ends with the second refusal either way.
func TestARefusalOverrulingAnONAYGivenInIYSReachesIYS(t *testing.T) {
	for _, order := range []string{"the sync brings the new ONAY after the second refusal", "the first RET still waits"} {
		t.Run(order, func(t *testing.T) {
			e := newEnv(t, sandbox.Options{}, nil)
			pool, _ := testdb.New(t)
			ctx := context.Background()
			brand := fmt.Sprint(testBrand)
			const addr = "+905324444442"
			base := time.Now().Add(-3 * time.Hour).Truncate(time.Second)
			e.seed(t, sandbox.IYSConsent{Recipient: addr, Type: "MESAJ", Status: "ONAY", Source: "HS_WEB",
				CreationDate: base.Add(-48 * time.Hour).In(iys.Istanbul()).Format(iys.DateLayout)})
			consentRows(t, pool, [6]any{addr, "MESAJ", "BIREYSEL", brand, "ONAY", base.Add(-48 * time.Hour)})
			c := e.client(t, nil)
			refuse := func(id string, at time.Time) iys.RefusalReport {
				t.Helper()
				rep, err := iys.RecordRefusals(ctx, pool, brand, []iys.Refusal{{Via: iys.ViaTwilioInbound, EventID: id, Kind: "inbound",
					Recipient: addr, Type: "MESAJ", Evidence: "RET", At: at}})
				if err != nil {
					t.Fatal(err)
				}
				return rep
			}
			push := func() {
				t.Helper()
				if _, err := iys.Push(ctx, pool, c, iys.PushOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			sync := func(status string, at time.Time) {
				t.Helper()
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback(ctx) //nolint:errcheck
				if _, err := iys.ApplyChanges(ctx, tx, brand, []iys.Record{{Recipient: addr, Type: "MESAJ", RecipientType: "BIREYSEL",
					Status: status, Source: "HS_WEB", ConsentDate: at, CreationDate: at}}, iys.OriginPull); err != nil {
					t.Fatal(err)
				}
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
			}
			t1, t2, t3 := base, base.Add(time.Hour), base.Add(2*time.Hour)
			refuse("SM1", t1)
			if order == "the sync brings the new ONAY after the second refusal" {
				push() // İYS: RET t1
			}
			if order == "the first RET still waits" {
				// A consent given again at t2 is stored here (İYS, still ONAY, refuses it as the same
				// status); the second refusal turns it, and the waiting RET takes its date.
				sync("ONAY", t2)
				refuse("SM2", t3)
			} else {
				// The person gives consent again on the brand's site at t2: İYS holds ONAY t2.
				if _, err := c.AddConsent(ctx, iys.ConsentChange{Recipient: addr, Type: "MESAJ", RecipientType: "BIREYSEL", Status: "ONAY",
					Source: "HS_WEB", ConsentDate: t2}); err != nil {
					t.Fatal(err)
				}
				// Not pulled yet: the second refusal finds RET here and turns nothing; the pull then
				// brings the ONAY, older than the refusal.
				if rep := refuse("SM2", t3); rep.Revoked != 0 {
					t.Fatalf("second refusal turned %d consents, want none (the consent is RET here)", rep.Revoked)
				}
				sync("ONAY", t2)
			}
			if st := consentStatus(t, pool, addr, "MESAJ", "BIREYSEL", brand); st != "RET" {
				t.Fatalf("here: %s, want RET", st)
			}
			push()
			want := "RET " + t3.In(iys.Istanbul()).Format(iys.DateLayout)
			if got := iysStatus(e, addr); got != want {
				t.Fatalf("İYS holds %q, want %q (the second refusal)", got, want)
			}
		})
	}
}

// onayOnBothSides makes an İYS sandbox and a database that both hold an ONAY of addr (MESAJ, BIREYSEL) given
// 48 hours before base (three hours ago, to the second), and returns them with the brand and a client.
func onayOnBothSides(t *testing.T, addr string) (*env, *pgxpool.Pool, string, time.Time, *iys.Client) {
	t.Helper()
	e := newEnv(t, sandbox.Options{}, nil)
	pool, _ := testdb.New(t)
	brand := fmt.Sprint(testBrand)
	base := time.Now().Add(-3 * time.Hour).Truncate(time.Second)
	e.seed(t, sandbox.IYSConsent{Recipient: addr, Type: "MESAJ", Status: "ONAY", Source: "HS_WEB",
		CreationDate: base.Add(-48 * time.Hour).In(iys.Istanbul()).Format(iys.DateLayout)})
	consentRows(t, pool, [6]any{addr, "MESAJ", "BIREYSEL", brand, "ONAY", base.Add(-48 * time.Hour)})
	return e, pool, brand, base, e.client(t, nil)
}
