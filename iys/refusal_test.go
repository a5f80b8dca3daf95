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

// consentRows stores consents: recipient, type, recipient type, brand, status, consent date.
func consentRows(t *testing.T, pool *pgxpool.Pool, rows ...[6]any) {
	t.Helper()
	for _, r := range rows {
		if _, err := pool.Exec(context.Background(), `INSERT INTO iys_consents (recipient, type, recipient_type, brand_code, status, source, consent_date)
			VALUES ($1, $2, $3, $4, $5, 'HS_WEB', $6)`, r[0], r[1], r[2], r[3], r[4], r[5]); err != nil {
			t.Fatal(err)
		}
	}
}

func consentStatus(t *testing.T, pool *pgxpool.Pool, recipient, typ, rtype, brand string) string {
	t.Helper()
	var st string
	pool.QueryRow(context.Background(), `SELECT status FROM iys_consents WHERE recipient = $1 AND type = $2 AND recipient_type = $3 AND brand_code = $4`,
		recipient, typ, rtype, brand).Scan(&st) //nolint:errcheck
	return st
}

// A refusal turns every ONAY of its address and type to RET (every brand, both recipient types), once
// however often it arrives; an address with nothing stored gets a RET too, with nothing for İYS; a
// consent given after the refusal stands.
func TestRecordRefusalsMakesLocalRETsOnce(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.New(t)
	ctx := context.Background()
	day := time.Now().Add(-24 * time.Hour)
	consentRows(t, pool,
		[6]any{"+905321111111", "MESAJ", "BIREYSEL", "654321", "ONAY", day},
		[6]any{"+905321111111", "MESAJ", "TACIR", "654321", "ONAY", day},
		[6]any{"+905321111111", "MESAJ", "BIREYSEL", "", "ONAY", day},
		[6]any{"+905321111111", "EPOSTA", "BIREYSEL", "654321", "ONAY", day}, // another type: untouched
		[6]any{"late@example.com", "EPOSTA", "BIREYSEL", "654321", "ONAY", time.Now().Add(-time.Hour)},
	)
	var v0 int64
	pool.QueryRow(ctx, `SELECT version FROM iys_consents_version`).Scan(&v0) //nolint:errcheck
	sms := iys.Refusal{Via: iys.ViaTwilioInbound, EventID: "SM1", Kind: "inbound", Recipient: "0532 111 11 11", Type: "MESAJ", Evidence: "twilio inbound SM1 \"RET\"", At: time.Now()}
	rep, err := iys.RecordRefusals(ctx, pool, "654321", []iys.Refusal{sms, sms})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Recorded != 1 || rep.Repeats != 1 || rep.Revoked != 3 || rep.Outboxed != 3 {
		t.Fatalf("report %+v; want 1 recorded, 1 repeat, 3 consents revoked and queued", rep)
	}
	for _, k := range [][3]string{{"BIREYSEL", "654321"}, {"TACIR", "654321"}, {"BIREYSEL", ""}} {
		if st := consentStatus(t, pool, "+905321111111", "MESAJ", k[0], k[1]); st != "RET" {
			t.Errorf("MESAJ %s brand %q: %s, want RET", k[0], k[1], st)
		}
	}
	if st := consentStatus(t, pool, "+905321111111", "EPOSTA", "BIREYSEL", "654321"); st != "ONAY" {
		t.Errorf("an SMS refusal touched the e-mail consent: %s", st)
	}
	var v1 int64
	pool.QueryRow(ctx, `SELECT version FROM iys_consents_version`).Scan(&v1) //nolint:errcheck
	if v1 == v0 {
		t.Error("the consent version did not move: running campaigns would not read the RET")
	}
	// A second refusal of the same person, another event: recorded, nothing more to register.
	again := sms
	again.EventID = "SM2"
	if rep, err = iys.RecordRefusals(ctx, pool, "654321", []iys.Refusal{again}); err != nil || rep.Recorded != 1 || rep.Revoked != 0 || rep.Outboxed != 0 {
		t.Fatalf("second refusal: %+v %v; want recorded, nothing revoked or queued", rep, err)
	}
	// Nothing stored: a RET under the brand, nothing for İYS (it refuses a first add as RET).
	unknown := iys.Refusal{Via: iys.ViaSendGrid, EventID: "sg-1", Kind: "spamreport", Recipient: "New@Example.com", Type: "EPOSTA", Evidence: "sendgrid spamreport", At: time.Now()}
	// A late event: the unsubscribe came two hours ago, the ONAY an hour ago.
	late := iys.Refusal{Via: iys.ViaSendGrid, EventID: "sg-2", Kind: "unsubscribe", Recipient: "late@example.com", Type: "EPOSTA", Evidence: "sendgrid unsubscribe", At: time.Now().Add(-2 * time.Hour)}
	if rep, err = iys.RecordRefusals(ctx, pool, "654321", []iys.Refusal{unknown, late}); err != nil || rep.Recorded != 2 || rep.Outboxed != 0 {
		t.Fatalf("refusals of an unknown address and of a later consent: %+v %v", rep, err)
	}
	if st := consentStatus(t, pool, "new@example.com", "EPOSTA", "BIREYSEL", "654321"); st != "RET" {
		t.Errorf("an address with no consent: %q, want a stored RET", st)
	}
	if st := consentStatus(t, pool, "late@example.com", "EPOSTA", "BIREYSEL", "654321"); st != "ONAY" {
		t.Errorf("a consent given after the refusal: %s, want it kept", st)
	}
	var outbox, hist int
	pool.QueryRow(ctx, `SELECT count(*) FROM iys_outbox`).Scan(&outbox)                                 //nolint:errcheck
	pool.QueryRow(ctx, `SELECT count(*) FROM iys_consent_history WHERE origin = 'refusal'`).Scan(&hist) //nolint:errcheck
	if outbox != 3 || hist != 4 {
		t.Fatalf("outbox %d rows, history %d refusal rows; want 3 and 4", outbox, hist)
	}
	if _, err := iys.RecordRefusals(ctx, pool, "", []iys.Refusal{{Via: iys.ViaSendGrid, EventID: "x", Recipient: "not an address", Type: "EPOSTA"}}); err == nil {
		t.Fatal("a refusal of no address was recorded")
	}
}

// Push registers each RET once: one request each for a few, batches for many (results collected by a
// later run or --wait); İYS holding RET already is "already", a refusal by İYS is kept with its code and
// not sent again; a second push sends nothing.
func TestPushRegistersEachRETOnce(t *testing.T) {
	for _, batchFrom := range []int{50, 2} {
		t.Run(fmt.Sprintf("batch from %d", batchFrom), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, sandbox.Options{}, nil)
			pool, _ := testdb.New(t)
			ctx := context.Background()
			brand := fmt.Sprint(testBrand)
			two := time.Now().Add(-48 * time.Hour).In(iys.Istanbul()).Format(iys.DateLayout)
			e.seed(t,
				sandbox.IYSConsent{Recipient: "+905322222221", Type: "MESAJ", Status: "ONAY", Source: "HS_WEB", CreationDate: two},
				sandbox.IYSConsent{Recipient: "+905322222222", Type: "MESAJ", Status: "RET", Source: "HS_WEB", CreationDate: two},
				sandbox.IYSConsent{Recipient: "a@example.com", Type: "EPOSTA", Status: "ONAY", Source: "HS_WEB", CreationDate: two})
			day := time.Now().Add(-24 * time.Hour)
			consentRows(t, pool,
				[6]any{"+905322222221", "MESAJ", "BIREYSEL", brand, "ONAY", day},
				[6]any{"+905322222222", "MESAJ", "BIREYSEL", brand, "ONAY", day},  // İYS has RET already
				[6]any{"+905322222223", "MESAJ", "BIREYSEL", brand, "ONAY", day},  // unknown to İYS: H175
				[6]any{"a@example.com", "EPOSTA", "BIREYSEL", "", "ONAY", day},    // no brand: pushed under the client's
				[6]any{"b@example.com", "EPOSTA", "BIREYSEL", "999", "ONAY", day}, // another brand: waits
			)
			var rs []iys.Refusal
			for i, a := range []string{"+905322222221", "+905322222222", "+905322222223", "a@example.com", "b@example.com"} {
				typ := "MESAJ"
				if a[0] != '+' {
					typ = "EPOSTA"
				}
				rs = append(rs, iys.Refusal{Via: iys.ViaTwilioInbound, EventID: fmt.Sprint("ev", i), Kind: "inbound", Recipient: a, Type: typ, Evidence: "test", At: time.Now().Add(-time.Minute)})
			}
			if _, err := iys.RecordRefusals(ctx, pool, brand, rs); err != nil {
				t.Fatal(err)
			}
			c := e.client(t, nil)
			opts := iys.PushOptions{BatchFrom: batchFrom, ResultAfter: 300 * time.Millisecond, Wait: 10 * time.Second, PollEvery: 100 * time.Millisecond}
			rep, err := iys.Push(ctx, pool, c, opts)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Sent != 4 || rep.Accepted != 2 || rep.Already != 1 || rep.Refused != 1 || rep.OtherBrand != 1 || rep.Awaiting != 0 {
				t.Fatalf("push %+v; want 4 sent: 2 accepted, 1 already, 1 refused; 1 for another brand", rep)
			}
			if rep, err = iys.Push(ctx, pool, c, opts); err != nil || rep.Sent != 0 {
				t.Fatalf("second push %+v %v; want nothing sent", rep, err)
			}
			st := e.s.IYSStats()
			for _, k := range []string{sandbox.IYSAddKey("+905322222221", "MESAJ", "BIREYSEL"), sandbox.IYSAddKey("a@example.com", "EPOSTA", "BIREYSEL")} {
				if st.AddsAcceptedByKey[k] != 1 {
					t.Errorf("İYS registered %s %d times, want once", k, st.AddsAcceptedByKey[k])
				}
			}
			items, err := iys.OutboxItems(ctx, pool, time.Now(), 0)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, it := range items {
				got[it.Recipient] = it.State + " " + it.ErrorCode
			}
			want := map[string]string{"+905322222221": "accepted ", "+905322222222": "already H174", "+905322222223": "refused H175",
				"a@example.com": "accepted ", "b@example.com": "waiting "}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("outbox %v\nwant   %v", got, want)
			}
		})
	}
}

// A RET that İYS cannot take now (a 5xx) waits for its back-off, then goes. What İYS did not take is not
// counted as sent, alone or in a batch: before, every request tried was.
func TestPushRetriesTransientErrorsLater(t *testing.T) {
	for _, batchFrom := range []int{0, 1} {
		t.Run(fmt.Sprintf("batch from %d", batchFrom), func(t *testing.T) { pushRetriesTransientErrorsLater(t, batchFrom) })
	}
}

func pushRetriesTransientErrorsLater(t *testing.T, batchFrom int) {
	t.Parallel()
	e := newEnv(t, sandbox.Options{}, nil)
	pool, _ := testdb.New(t)
	ctx := context.Background()
	brand := fmt.Sprint(testBrand)
	e.seed(t, sandbox.IYSConsent{Recipient: "+905323333331", Type: "MESAJ", Status: "ONAY", Source: "HS_WEB", CreationDate: time.Now().Add(-48 * time.Hour).In(iys.Istanbul()).Format(iys.DateLayout)})
	consentRows(t, pool, [6]any{"+905323333331", "MESAJ", "BIREYSEL", brand, "ONAY", time.Now().Add(-24 * time.Hour)})
	if _, err := iys.RecordRefusals(ctx, pool, brand, []iys.Refusal{{Via: iys.ViaOneClick, EventID: "1:u", Kind: "one_click", Recipient: "+905323333331", Type: "MESAJ", Evidence: "t", At: time.Now().Add(-time.Minute)}}); err != nil {
		t.Fatal(err)
	}
	e.s.SetIYSFaults(sandbox.IYSFaults{Unavailable: 20})
	c := e.client(t, nil)
	opts := iys.PushOptions{BatchFrom: batchFrom}
	rep, err := iys.Push(ctx, pool, c, opts)
	if err != nil || rep.Retrying != 1 || rep.Accepted != 0 || rep.Sent != 0 {
		t.Fatalf("push during an outage: %+v %v; want 1 to retry, none sent", rep, err)
	}
	var next time.Time
	var attempts int
	pool.QueryRow(ctx, `SELECT next_at, attempts FROM iys_outbox`).Scan(&next, &attempts) //nolint:errcheck
	if attempts != 1 || time.Until(next) < 20*time.Second {
		t.Fatalf("after a 503: attempts %d, next try in %v; want 1 and a back-off", attempts, time.Until(next))
	}
	if batchFrom > 0 {
		return // a batch's results come later (TestPushRegistersEachRETOnce)
	}
	e.s.SetIYSFaults(sandbox.IYSFaults{})
	pool.Exec(ctx, `UPDATE iys_outbox SET next_at = now()`) //nolint:errcheck // the back-off is over
	if rep, err = iys.Push(ctx, pool, c, opts); err != nil || rep.Accepted != 1 || rep.Sent != 1 {
		t.Fatalf("push after the outage: %+v %v; want 1 sent and accepted", rep, err)
	}
}

// Two business days skip weekends and the fixed holidays (Istanbul days).
func TestAddBusinessDays(t *testing.T) {
	at := func(s string) time.Time {
		d, err := time.ParseInLocation("2006-01-02 15:04", s, iys.Istanbul())
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	for _, c := range [][2]string{
		{"2026-12-01 10:00", "2026-12-03 10:00"}, // Tuesday → Thursday
		{"2026-12-04 10:00", "2026-12-08 10:00"}, // Friday → Tuesday
		{"2026-10-27 10:00", "2026-10-30 10:00"}, // Tuesday, over Republic Day (Thursday 29th)
		{"2026-12-05 23:30", "2026-12-08 23:30"}, // Saturday → Tuesday
	} {
		if got := iys.AddBusinessDays(at(c[0]), 2); !got.Equal(at(c[1])) {
			t.Errorf("%s + 2 business days = %s, want %s", c[0], got.Format("2006-01-02 15:04 Mon"), c[1])
		}
	}
}

// A refusal recorded while a sync's page (ApplyChanges) is storing an ONAY, dated before the refusal, for
// an address that had no consent yet: the refusal waits for the sync, which then commits. The refusal must
// see the ONAY the sync inserted and turn it to RET; an older ONAY standing after it would let the next
// launch plan the person and send.
func TestARefusalWaitingForASyncTurnsTheONAYItStored(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.New(t)
	ctx := context.Background()
	const brand = "654321"
	onayAt := time.Now().Add(-24 * time.Hour)

	syncTx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer syncTx.Rollback(ctx) //nolint:errcheck
	if _, err := iys.ApplyChanges(ctx, syncTx, brand, []iys.Record{{Recipient: "+905321111111", Type: "MESAJ",
		RecipientType: "BIREYSEL", Status: "ONAY", Source: "HS_WEB", ConsentDate: onayAt, CreationDate: onayAt}}, iys.OriginPull); err != nil {
		t.Fatal(err)
	}

	done := make(chan error, 1)
	go func() {
		_, err := iys.RecordRefusals(ctx, pool, brand, []iys.Refusal{{Via: iys.ViaTwilioInbound, EventID: "SM1", Kind: "inbound",
			Recipient: "+905321111111", Type: "MESAJ", Evidence: "RET", At: time.Now()}})
		done <- err
	}()
	// Wait until the refusal's UPDATE waits on the version row the sync holds.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()`).Scan(&n) //nolint:errcheck
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the refusal never waited on the sync")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := syncTx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st := consentStatus(t, pool, "+905321111111", "MESAJ", "BIREYSEL", brand); st != "RET" {
		t.Fatalf("consent after a refusal given after the ONAY's date: %s, want RET (the refusal lost to an older ONAY)", st)
	}
}

// An ONAY dated after a refusal but stored before it (a file from a clock ahead of this one; import takes
// dates up to a quarter hour ahead) was not given after the refusal: the refusal turns it to RET and queues
// it for İYS. Before, the "later" ONAY stood, and the person who had replied RET got the campaign. So does
// İYS's own refusal through a provider (RecordNoConsent).
func TestAnONAYDatedAheadOfTheClockDoesNotOutliveARefusal(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.New(t)
	ctx := context.Background()
	ahead := time.Now().Add(10 * time.Minute)
	consentRows(t, pool,
		[6]any{"+905321110011", "MESAJ", "BIREYSEL", "111", "ONAY", ahead},
		[6]any{"+905321110012", "MESAJ", "BIREYSEL", "111", "ONAY", ahead},
	)
	rep, err := iys.RecordRefusals(ctx, pool, "111", []iys.Refusal{{Via: iys.ViaTwilioInbound, EventID: "SM1", Kind: "inbound",
		Recipient: "+905321110011", Type: "MESAJ", Evidence: "twilio inbound SM1 \"RET\"", At: time.Now()}})
	if err != nil {
		t.Fatal(err)
	}
	if st := consentStatus(t, pool, "+905321110011", "MESAJ", "BIREYSEL", "111"); st != "RET" || rep.Revoked != 1 || rep.Outboxed != 1 {
		t.Fatalf("an SMS RET after an ONAY dated ahead: consent %s, report %+v; want RET, revoked and queued for İYS", st, rep)
	}
	n, err := iys.RecordNoConsent(ctx, pool, "111", []iys.NoConsent{{Recipient: "+905321110012", Type: "MESAJ", RecipientType: "BIREYSEL", Source: "netgsm", At: time.Now()}})
	if err != nil {
		t.Fatal(err)
	}
	if st := consentStatus(t, pool, "+905321110012", "MESAJ", "BIREYSEL", "111"); st != "RET" || n != 1 {
		t.Fatalf("İYS's refusal through the provider after an ONAY dated ahead: consent %s, %d turned; want RET, 1", st, n)
	}
}

// A refusal of an address with no stored consent stores one RET (BIREYSEL). An ONAY of the same address
// and type given before the refusal, stored only after it under another key (TACIR, from a sync page or a
// CSV import, the first of its brand or not), is stored as the refusal's RET: a refusal turns every
// consent of its address and type, and one stored later must not stand as ONAY either. An ONAY given
// after the refusal is a new consent, and stands.
func TestAnONAYOlderThanARefusalStoredAfterItIsARET(t *testing.T) {
	t.Parallel()
	const addr = "+905321111111"
	for _, tc := range []struct {
		name  string
		store func(t *testing.T, pool *pgxpool.Pool, at time.Time)
	}{
		{"a sync page", func(t *testing.T, pool *pgxpool.Pool, at time.Time) {
			ctx := context.Background()
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx) //nolint:errcheck
			if _, err := iys.ApplyChanges(ctx, tx, "", []iys.Record{{Recipient: addr, Type: "MESAJ",
				RecipientType: "TACIR", Status: "ONAY", Source: "HS_WEB", ConsentDate: at, CreationDate: at}}, iys.OriginPull); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}},
		{"a first import", func(t *testing.T, pool *pgxpool.Pool, at time.Time) {
			mustImport(t, pool, iys.Header+"\n"+addr+",MESAJ,TACIR,ONAY,HS_WEB,"+at.In(iys.Istanbul()).Format(iys.DateLayout)+"\n")
		}},
		{"an import after others", func(t *testing.T, pool *pgxpool.Pool, at time.Time) {
			mustImport(t, pool, iys.Header+"\n+905329999999,MESAJ,BIREYSEL,ONAY,HS_WEB,2024-01-01 00:00:00\n")
			mustImport(t, pool, iys.Header+"\n"+addr+",MESAJ,TACIR,ONAY,HS_WEB,"+at.In(iys.Istanbul()).Format(iys.DateLayout)+"\n")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, later := range []bool{false, true} {
				pool, _ := testdb.New(t)
				refusedAt := time.Now().Add(-time.Hour).Truncate(time.Second)
				// Under another brand: the import below is then the first of its own (brand "").
				if _, err := iys.RecordRefusals(context.Background(), pool, "654321", []iys.Refusal{{Via: iys.ViaTwilioInbound, EventID: "SM1",
					Kind: "inbound", Recipient: addr, Type: "MESAJ", Evidence: "RET", At: refusedAt}}); err != nil {
					t.Fatal(err)
				}
				onayAt, want := refusedAt.Add(-24*time.Hour), "RET"
				if later {
					onayAt, want = refusedAt.Add(time.Minute), "ONAY"
				}
				tc.store(t, pool, onayAt)
				if st := consentStatus(t, pool, addr, "MESAJ", "TACIR", ""); st != want {
					t.Errorf("a TACIR ONAY given %v the refusal, stored after it: %s, want %s", map[bool]string{false: "before", true: "after"}[later], st, want)
				}
			}
		})
	}
}

// A provider's post is text from outside: a NUL or invalid UTF-8 in a refusal's event ID, kind or evidence
// is stored as U+FFFD, and neither it nor the refusals recorded with it are refused by Postgres.
func TestARefusalWithANulInItsTextIsRecorded(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.New(t)
	ctx := context.Background()
	consentRows(t, pool, [6]any{"a@example.com", "EPOSTA", "BIREYSEL", "654321", "ONAY", time.Now().Add(-time.Hour)})
	rs := []iys.Refusal{
		{Via: iys.ViaSendGrid, EventID: "ev\x001", Kind: "unsub\xffscribe", Recipient: "b@example.com", Type: "EPOSTA", UserID: "u\x00", Evidence: "sendgrid \x00 unsubscribe", At: time.Now()},
		{Via: iys.ViaSendGrid, EventID: "ev2", Kind: "unsubscribe", Recipient: "a@example.com", Type: "EPOSTA", Evidence: "sendgrid unsubscribe", At: time.Now()},
	}
	rep, err := iys.RecordRefusals(ctx, pool, "654321", rs)
	if err != nil || rep.Recorded != 2 {
		t.Fatalf("record: %+v %v, want both recorded", rep, err)
	}
	if st := consentStatus(t, pool, "a@example.com", "EPOSTA", "BIREYSEL", "654321"); st != "RET" {
		t.Errorf("a@example.com: %s, want RET", st)
	}
	var ev string
	if err := pool.QueryRow(ctx, `SELECT event_id FROM refusals WHERE recipient = 'b@example.com'`).Scan(&ev); err != nil || ev != "ev\uFFFD1" {
		t.Errorf("event ID stored %q (%v), want %q", ev, err, "ev\uFFFD1")
	}
}

// A refusal that names its brand (a one-click link, a group unsubscribe) turns that brand's consents RET
// and queues them for İYS, and leaves the other brands' alone; one of an address with nothing stored under
// that brand stores its RET there.
func TestARefusalOfOneBrandLeavesTheOthers(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.New(t)
	ctx := context.Background()
	day := time.Now().Add(-24 * time.Hour)
	consentRows(t, pool,
		[6]any{"ayse@example.com", "EPOSTA", "BIREYSEL", "111111", "ONAY", day},
		[6]any{"ayse@example.com", "EPOSTA", "TACIR", "111111", "ONAY", day},
		[6]any{"ayse@example.com", "EPOSTA", "BIREYSEL", "222222", "ONAY", day},
		[6]any{"mehmet@example.com", "EPOSTA", "BIREYSEL", "222222", "ONAY", day},
	)
	rs := []iys.Refusal{
		{Via: iys.ViaOneClick, EventID: "1:u1:1", Kind: iys.ViaOneClick, Recipient: "ayse@example.com", Type: "EPOSTA", Brand: "111111", At: time.Now()},
		{Via: iys.ViaSendGrid, EventID: "sg-g1", Kind: "group_unsubscribe", Recipient: "mehmet@example.com", Type: "EPOSTA", Brand: "111111", At: time.Now()},
	}
	rep, err := iys.RecordRefusals(ctx, pool, "999999", rs)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Recorded != 2 || rep.Revoked != 2 || rep.Outboxed != 2 {
		t.Fatalf("report %+v; want 2 recorded, brand 111111's 2 consents revoked and queued", rep)
	}
	for _, c := range []struct{ who, rtype, brand, want string }{
		{"ayse@example.com", "BIREYSEL", "111111", "RET"},
		{"ayse@example.com", "TACIR", "111111", "RET"},
		{"ayse@example.com", "BIREYSEL", "222222", "ONAY"},
		{"mehmet@example.com", "BIREYSEL", "222222", "ONAY"},
		{"mehmet@example.com", "BIREYSEL", "111111", "RET"}, // nothing stored under the brand: a RET stored there
		{"mehmet@example.com", "BIREYSEL", "999999", ""},
	} {
		if st := consentStatus(t, pool, c.who, "EPOSTA", c.rtype, c.brand); st != c.want {
			t.Errorf("%s %s brand %s: %q, want %q", c.who, c.rtype, c.brand, st, c.want)
		}
	}
	var other int
	pool.QueryRow(ctx, `SELECT count(*) FROM iys_outbox WHERE brand_code <> '111111'`).Scan(&other) //nolint:errcheck
	if other != 0 {
		t.Fatalf("%d RETs queued for İYS under another brand than the one refused", other)
	}
}
