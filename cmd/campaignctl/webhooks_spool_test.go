package main

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/internal/unsubscribe"
	"github.com/campaignctl/campaignctl/providers/receipts"
)

// An RET answered while Postgres refuses connections for longer than --store-wait is held in the refusal
// spool and answered 200, and is recorded once Postgres is back, in both orders of what comes next: the
// process that held it is stopped before Postgres is back and another starts on the same spool (a
// restart), or it runs on and records it itself. Each time: the consent RET, one refusal, one İYS outbox
// row, and nothing left in the spool. Before, the post was answered 500 when the wait ran out, and Twilio
// does not post an incoming SMS again: the refusal was lost.
func TestAnRETPostgresCannotTakeForLongIsSpooledAndRecordedWhenItIsBack(t *testing.T) {
	t.Parallel()
	pool, dbURL := testdb.New(t)
	ctx := t.Context()
	const brand = "654321"
	froms := []string{"+905551238881", "+905551238882"}
	smsConsent(t, pool, brand, froms...)
	spool := t.TempDir()
	rdb, redisURL := testredis.New(t)
	env := map[string]string{"DATABASE_URL": dbURL, "TWILIO_AUTH_TOKEN": hooksToken, "IYS_BRAND_CODE": brand, "REDIS_URL": redisURL}
	args := []string{"webhooks", "--addr", "127.0.0.1:0", "--store-wait", "300ms", "--spool-dir", spool}
	held := func() int {
		t.Helper()
		n := 0
		filepathWalk(t, spool, func(name string) {
			if strings.HasSuffix(name, ".json") {
				n++
			}
		})
		return n
	}
	recorded := func(from string) (status string, refusals, outbox int64) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT status FROM iys_consents WHERE recipient = $1 AND type = 'MESAJ'`, from).Scan(&status); err != nil {
			t.Fatal(err)
		}
		return status, countRows(t, pool, `SELECT count(*) FROM refusals WHERE recipient = '`+from+`'`),
			countRows(t, pool, `SELECT count(*) FROM iys_outbox WHERE recipient = '`+from+`'`)
	}
	waitRecorded := func(from, order string) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			status, refusals, outbox := recorded(from)
			if status == "RET" && refusals == 1 && outbox == 1 && held() == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: 15 s after Postgres was back: consent %s, %d refusals, %d İYS outbox rows, %d posts in the spool; want RET, 1, 1, 0",
					order, status, refusals, outbox, held())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	// Held, then the process stops before Postgres is back; the next one records it.
	first := serveInProcess(t, env, hooksURLRe, args...)
	back := refuseConnectionsFor(t, pool, 4*time.Second)
	start := time.Now()
	if code := postRET(t, first.base, froms[0], "SMin0000000000000000000000000000081"); code != http.StatusOK {
		t.Fatalf("an RET posted while Postgres refused connections past --store-wait: %d after %v, want 200 (held in the spool)\n%s", code, time.Since(start), first.stderr)
	}
	if n := held(); n != 1 {
		t.Fatalf("the spool holds %d posts, want 1", n)
	}
	// The workers are told before the post is answered: they lease nothing while it waits.
	if on, err := state.RefusalsHeldNow(ctx, rdb); err != nil || !on.Held {
		t.Fatalf("the workers are not told that a refusal waits in the spool (%v, %v)", on, err)
	}
	// And who it refuses, a name that outlives this process's note (it dies below with its spool full).
	spooled := func() map[string]bool {
		m, err := state.SpooledRefusals(ctx, rdb)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	if m := spooled(); !m[state.SpooledAddress("sms", froms[0])] {
		t.Fatalf("the spooled refusals name %v; want %s, refused on sms", m, froms[0])
	}
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}
	<-back
	if status, _, _ := recorded(froms[0]); status != "ONAY" {
		t.Fatalf("consent %s before any process ran on the spool, want still ONAY", status)
	}
	second := serveInProcess(t, env, hooksURLRe, args...)
	waitRecorded(froms[0], "held, the process stopped, another started")
	// The process that recorded it takes its name back.
	waitFor(t, 10*time.Second, func() bool { return len(spooled()) == 0 })

	// Held, and the same process records it when Postgres is back.
	back = refuseConnectionsFor(t, pool, 3*time.Second)
	if code := postRET(t, second.base, froms[1], "SMin0000000000000000000000000000082"); code != http.StatusOK {
		t.Fatalf("the second RET: %d, want 200 (held in the spool)\n%s", code, second.stderr)
	}
	<-back
	waitRecorded(froms[1], "held, the process ran on")
	waitFor(t, 10*time.Second, func() bool { on, err := state.RefusalsHeldNow(ctx, rdb); return err == nil && !on.Held })
	if !strings.Contains(second.stderr.String(), "refusals held in the spool recorded") {
		t.Errorf("the process that recorded the spool did not log it:\n%s", second.stderr)
	}
}

// noRedis is a Redis URL nothing answers: a spool's note for the workers fails (and is logged), and no
// test writes to a Redis DB it has not leased.
const noRedis = "redis://127.0.0.1:1/0"

// smsConsent gives each of froms an SMS consent (ONAY, a day old) of brand.
func smsConsent(t *testing.T, pool *pgxpool.Pool, brand string, froms ...string) {
	t.Helper()
	for _, from := range froms {
		if _, err := pool.Exec(t.Context(), `INSERT INTO iys_consents (recipient, type, recipient_type, brand_code, status, source, consent_date)
			VALUES ($1, 'MESAJ', 'BIREYSEL', $2, 'ONAY', 'HS_WEB', now() - interval '1 day')`, from, brand); err != nil {
			t.Fatal(err)
		}
	}
}

// postRET posts, signed, Twilio's incoming SMS "RET" from from (message sid) to the webhooks at base and
// returns the answer's status.
func postRET(t *testing.T, base, from, sid string) int {
	t.Helper()
	req := retRequest(base, from, sid)
	return hooksPost(t, req.URL.String(), req.Body, map[string]string{"Content-Type": req.Header.Get("Content-Type"),
		"X-Twilio-Signature": req.Header.Get("X-Twilio-Signature")})
}

// retRequest is Twilio's incoming SMS "RET" from from (message sid) to the webhooks at base, signed.
func retRequest(base, from, sid string) *http.Request {
	form := url.Values{"MessageSid": {sid}, "SmsMessageSid": {sid}, "AccountSid": {"ACtest"}, "From": {from}, "To": {"+908501234567"},
		"Body": {"RET"}, "NumMedia": {"0"}, "SmsStatus": {"received"}, "ApiVersion": {"2010-04-01"}}
	target := base + twilioInboundPath
	req, err := http.NewRequest(http.MethodPost, target, strings.NewReader(form.Encode()))
	if err != nil {
		panic(err) // a URL of the test's own making
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("X-Twilio-Signature", twilioSig(hooksToken, target, form))
	return req
}

// filepathWalk calls f with the name of every file under dir.
func filepathWalk(t *testing.T, dir string, f func(name string)) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() {
			filepathWalk(t, dir+"/"+e.Name(), f)
			continue
		}
		f(e.Name())
	}
}

// A one-click unsubscribe POSTed while Postgres refuses connections for longer than --store-wait is held
// in the refusal spool and answered with the page that says it is done; it is recorded (the consent RET,
// one refusal) once Postgres is back, and the spool is empty again. The page a person opens with GET
// still answers 503 at once meanwhile. Before, the POST was answered 503 when the wait ran out, and a mail
// client's one-click POST may never come again.
func TestAOneClickPostgresCannotTakeForLongIsSpooledAndRecordedWhenItIsBack(t *testing.T) {
	t.Parallel()
	db, id, signer, _ := oneClickSetup(t)
	log := slog.New(slog.DiscardHandler)
	sink := &refusalSink{pool: db, brand: "654321", log: log}
	store := campaign.NewStore(db)
	dir := t.TempDir()
	sink.spool = receipts.NewSpool(dir, sink, log)
	handleOneClicks(sink.spool, store, sink, log)
	h := unsubscribeHandler(signer.Signer, store, sink, 300*time.Millisecond, log)
	back := refuseConnectionsFor(t, db, 3*time.Second)
	get := httptest.NewRecorder()
	h.ServeHTTP(get, httptest.NewRequest(http.MethodGet, unsubscribe.Path+signer.Token(id, "u1"), nil))
	if get.Code != http.StatusServiceUnavailable {
		t.Fatalf("the page (GET) while Postgres refused connections: %d, want 503", get.Code)
	}
	req := httptest.NewRequest(http.MethodPost, unsubscribe.Path+signer.Token(id, "u1"), strings.NewReader("List-Unsubscribe=One-Click"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != http.StatusOK {
		t.Fatalf("the one-click POST while Postgres refused connections past --store-wait: %d, want 200 (held in the spool)", w.Code)
	}
	if n, _ := sink.spool.Held(); n != 1 {
		t.Fatalf("the spool holds %d requests, want 1", n)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); sink.spool.Run(ctx) }()
	defer func() { cancel(); <-done }()
	<-back
	deadline := time.Now().Add(15 * time.Second)
	for {
		var status string
		if err := db.QueryRow(t.Context(), `SELECT status FROM iys_consents WHERE recipient = $1 AND type = 'EPOSTA'`, oneClickAddr).Scan(&status); err != nil {
			t.Fatal(err)
		}
		n := countRows(t, db, `SELECT count(*) FROM refusals WHERE recipient = '`+oneClickAddr+`' AND via = 'one_click'`)
		held, _ := sink.spool.Held()
		if status == "RET" && n == 1 && held == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("15 s after Postgres was back: consent %s, %d refusals, %d requests in the spool; want RET, 1, 0", status, n, held)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// campaignctl webhooks started while Postgres refuses connections serves anyway when it has a refusal
// spool: an RET posted then is held and answered 200, and recorded once Postgres is back. Without a spool
// it refuses to start, as before (a provider's post to a server that is not there is lost).
func TestWebhooksStartedWhilePostgresIsAwayHoldsRefusalsUntilItIsBack(t *testing.T) {
	t.Parallel()
	pool, dbURL := testdb.New(t)
	ctx := t.Context()
	const brand, from = "654321", "+905551238883"
	smsConsent(t, pool, brand, from)
	env := map[string]string{"DATABASE_URL": dbURL, "TWILIO_AUTH_TOKEN": hooksToken, "IYS_BRAND_CODE": brand, "REDIS_URL": noRedis}
	back := refuseConnectionsFor(t, pool, 4*time.Second)
	if _, _, code := cli(t, env, "webhooks", "--addr", "127.0.0.1:0", "--spool-dir", ""); code != 1 {
		t.Fatalf("webhooks without a spool while Postgres refused connections: exit %d, want 1 (it cannot serve)", code)
	}
	hooks := serveInProcess(t, env, hooksURLRe, "webhooks", "--addr", "127.0.0.1:0", "--store-wait", "300ms", "--spool-dir", t.TempDir())
	if !strings.Contains(hooks.stderr.String(), "serving while Postgres is away") {
		t.Errorf("no warning that it serves while Postgres is away:\n%s", hooks.stderr)
	}
	if code := postRET(t, hooks.base, from, "SMin0000000000000000000000000000083"); code != http.StatusOK {
		t.Fatalf("an RET posted before Postgres was ever reached: %d, want 200 (held in the spool)\n%s", code, hooks.stderr)
	}
	<-back
	deadline := time.Now().Add(15 * time.Second)
	for {
		var status string
		if err := pool.QueryRow(ctx, `SELECT status FROM iys_consents WHERE recipient = $1 AND type = 'MESAJ'`, from).Scan(&status); err != nil {
			t.Fatal(err)
		}
		n := countRows(t, pool, `SELECT count(*) FROM refusals WHERE recipient = '`+from+`'`)
		if status == "RET" && n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("15 s after Postgres was back: consent %s, %d refusals; want RET, 1\n%s", status, n, hooks.stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A delivery receipt posted while Postgres refuses connections for longer than --store-wait is held in the
// spool too, answered 204, and recorded once Postgres is back: for a recipient whose outcome was unknown
// (its answer lost), it is what proves the message went, so `resume --resend-unknown` does not send it
// again. Before, the callback was answered 500 and Twilio did not post it again.
func TestAReceiptPostgresCannotTakeForLongIsSpooledAndSettlesAnUnknownRecipient(t *testing.T) {
	t.Parallel()
	db, dbURL := testdb.New(t)
	if _, err := db.Exec(t.Context(), `INSERT INTO campaign_recipients (campaign_id, user_id, address, batch, status, provider_message_id)
		VALUES (1, 'u1', '+905551234567', 0, 'unknown', 'SM7')`); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"DATABASE_URL": dbURL, "TWILIO_AUTH_TOKEN": hooksToken, "REDIS_URL": noRedis}
	hooks := serveInProcess(t, env, hooksURLRe, "webhooks", "--addr", "127.0.0.1:0", "--store-wait", "300ms", "--spool-dir", t.TempDir())
	back := refuseConnectionsFor(t, db, 3*time.Second)
	target := hooks.base + twilioReceiptPath + "?campaign_id=1&user_id=u1"
	form := hooksCallback("SM7")
	if code := hooksPost(t, target, strings.NewReader(form.Encode()), map[string]string{"Content-Type": "application/x-www-form-urlencoded",
		"X-Twilio-Signature": twilioSig(hooksToken, target, form)}); code != http.StatusNoContent {
		t.Fatalf("a delivered callback while Postgres refused connections past --store-wait: %d, want 204 (held in the spool)\n%s", code, hooks.stderr)
	}
	<-back
	deadline := time.Now().Add(15 * time.Second)
	for {
		var status, delivery string
		if err := db.QueryRow(t.Context(), `SELECT status, coalesce(delivery, '') FROM campaign_recipients WHERE user_id = 'u1'`).Scan(&status, &delivery); err != nil {
			t.Fatal(err)
		}
		if status == "sent" && delivery == "delivered" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("15 s after Postgres was back: status %s, delivery %q; want sent, delivered\n%s", status, delivery, hooks.stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// An RET posted while Postgres refuses connections goes to the spool after one failed attempt, with the
// default --store-wait of 10 s: the post is answered 200 at once, with the refusal on disk. A process
// stopped right after (a SIGTERM, a deploy; a kill -9 alike) loses nothing, and the next one records it.
// Before, the request was held in memory for the whole store wait before it was spooled: a stop or kill
// meanwhile dropped the connection unanswered, Twilio does not post an incoming SMS again, and the refusal
// was lost (the consent stayed ONAY).
func TestAnRETPostgresCannotTakeIsOnDiskBeforeItsAnswer(t *testing.T) {
	t.Parallel()
	pool, dbURL := testdb.New(t)
	const brand, from = "654321", "+905551238891"
	smsConsent(t, pool, brand, from)
	spool := t.TempDir()
	env := map[string]string{"DATABASE_URL": dbURL, "TWILIO_AUTH_TOKEN": hooksToken, "IYS_BRAND_CODE": brand, "REDIS_URL": noRedis}
	args := []string{"webhooks", "--addr", "127.0.0.1:0", "--spool-dir", spool} // the default --store-wait
	first := serveInProcess(t, env, hooksURLRe, args...)
	back := refuseConnectionsFor(t, pool, 6*time.Second)
	start := time.Now()
	code := postRET(t, first.base, from, "SMin0000000000000000000000000000091")
	took := time.Since(start)
	held := 0
	filepathWalk(t, spool, func(name string) {
		if strings.HasSuffix(name, ".json") {
			held++
		}
	})
	if code != http.StatusOK || took > 4*time.Second || held != 1 {
		t.Fatalf("an RET posted while Postgres refused connections: %d after %v, %d posts in the spool; want 200 within 4 s, with the post in the spool (not held in memory for the store wait)\n%s",
			code, took.Round(time.Millisecond), held, first.stderr)
	}
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}
	<-back
	serveInProcess(t, env, hooksURLRe, args...)
	waitFor(t, 15*time.Second, func() bool { // the spooled RET recorded by the next process
		var status string
		if err := pool.QueryRow(t.Context(), `SELECT status FROM iys_consents WHERE recipient = $1 AND type = 'MESAJ'`, from).Scan(&status); err != nil {
			t.Fatal(err)
		}
		return status == "RET" && countRows(t, pool, `SELECT count(*) FROM refusals WHERE recipient = '`+from+`'`) == 1
	})
}

// An RET whose write to Postgres waits for the consents' turn (an `iys import` merging, here a
// transaction holding the turn) names its sender in Redis before the write (state.RefusalsAnnouncedKey):
// the workers skip them from their next chunk while the write waits, not once it lands. Once the write is
// done the name is taken back; when the wait outlasts --store-wait, the request is held in the spool,
// which names it for as long as it waits, and the announcement is taken back all the same. Before, an
// outside run posted 40 refusals during an import: nothing named them for the 3 s of the wait, and 25 to 31
// of them were still sent.
func TestARefusalWaitingBehindAnImportIsNamedToTheWorkersAtOnce(t *testing.T) {
	t.Parallel()
	pool, dbURL := testdb.New(t)
	ctx := t.Context()
	const brand = "654321"
	froms := []string{"+905551238891", "+905551238892"}
	smsConsent(t, pool, brand, froms...)
	spool := t.TempDir()
	rdb, redisURL := testredis.New(t)
	env := map[string]string{"DATABASE_URL": dbURL, "TWILIO_AUTH_TOKEN": hooksToken, "IYS_BRAND_CODE": brand, "REDIS_URL": redisURL}
	hooks := serveInProcess(t, env, hooksURLRe, "webhooks", "--addr", "127.0.0.1:0", "--store-wait", "3s", "--spool-dir", spool)
	named := func(from string) bool {
		t.Helper()
		m, err := state.SpooledRefusals(ctx, rdb)
		if err != nil {
			t.Fatal(err)
		}
		held, err := state.RefusalsHeldNow(ctx, rdb)
		if err != nil {
			t.Fatal(err)
		}
		return m[state.SpooledAddress("sms", from)] && held.Spooled > 0
	}
	announced := func() int64 {
		t.Helper()
		n, err := rdb.ZCard(ctx, state.RefusalsAnnouncedKey).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	consent := func(from string) string {
		t.Helper()
		var st string
		if err := pool.QueryRow(ctx, `SELECT status FROM iys_consents WHERE recipient = $1 AND type = 'MESAJ'`, from).Scan(&st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	// turn holds the consents' turn, as an import's merge does, until the returned function ends it.
	turn := func() func() {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		end := func() { tx.Rollback(context.WithoutCancel(ctx)) } //nolint:errcheck // a second call finds it closed
		t.Cleanup(end)                                            // a failed check must not leave the webhooks waiting for the turn
		if _, err := tx.Exec(ctx, `SELECT 1 FROM iys_consents_version FOR UPDATE`); err != nil {
			t.Fatal(err)
		}
		return end
	}
	// namedSoon fails unless from is named to the workers within 2 s of the post, well inside the 3 s
	// --store-wait after which the spool would name it anyway.
	namedSoon := func(from string) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Second)
		for !named(from) {
			if time.Now().After(deadline) {
				t.Fatalf("%s's RET is not named to the workers 2 s after it was posted, while its write waits for the consents' turn", from)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	post := func(from, sid string) <-chan int {
		code := make(chan int, 1)
		go func() { code <- postRET(t, hooks.base, from, sid) }()
		return code
	}

	// The write waits less than --store-wait: recorded, never spooled.
	end := turn()
	code := post(froms[0], "SMin0000000000000000000000000000091")
	namedSoon(froms[0])
	if st := consent(froms[0]); st != "ONAY" {
		t.Fatalf("consent %s while the import holds the turn; want still ONAY (the test's premise)", st)
	}
	end()
	if c := <-code; c != http.StatusOK {
		t.Fatalf("the RET: %d, want 200\n%s", c, hooks.stderr)
	}
	if st := consent(froms[0]); st != "RET" {
		t.Fatalf("consent %s once the turn came; want RET", st)
	}
	if n := announced(); n != 0 || named(froms[0]) {
		t.Fatalf("%d names still announced once the refusal was recorded; want none", n)
	}

	// The write waits past --store-wait: held in the spool, named by it until it is recorded.
	end = turn()
	code = post(froms[1], "SMin0000000000000000000000000000092")
	namedSoon(froms[1])
	if c := <-code; c != http.StatusOK {
		t.Fatalf("the second RET: %d, want 200 (held in the spool)\n%s", c, hooks.stderr)
	}
	if n := announced(); n != 0 || !named(froms[1]) {
		t.Fatalf("held in the spool: %d names announced, named %v; want none announced, named by the spool", n, named(froms[1]))
	}
	end()
	waitFor(t, 10*time.Second, func() bool { return consent(froms[1]) == "RET" && !named(froms[1]) })
}

// The same for an e-mail's one-click unsubscribe: while its write waits for the consents' turn, its user
// is named to the workers (state.SpooledUser), and the name is taken back once it is recorded.
func TestAOneClickWaitingBehindAnImportIsNamedToTheWorkersAtOnce(t *testing.T) {
	t.Parallel()
	db, id, signer, _ := oneClickSetup(t)
	rdb, _ := testredis.New(t)
	ctx := t.Context()
	log := slog.New(slog.DiscardHandler)
	sink := &refusalSink{pool: db, brand: "654321", log: log}
	store := campaign.NewStore(db)
	sink.spool = receipts.NewSpool(t.TempDir(), sink, log)
	sink.spool.OnAnnounce = func(ctx context.Context, ids []string, on bool) error {
		if on {
			return state.AnnounceRefusals(ctx, rdb, ids, time.Minute)
		}
		return state.WithdrawRefusals(ctx, rdb, ids)
	}
	handleOneClicks(sink.spool, store, sink, log)
	h := unsubscribeHandler(signer.Signer, store, sink, 3*time.Second, log)
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	end := func() { tx.Rollback(context.WithoutCancel(ctx)) } //nolint:errcheck // a second call finds it closed
	t.Cleanup(end)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM iys_consents_version FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	answered := make(chan int, 1)
	go func() {
		req := httptest.NewRequest(http.MethodPost, unsubscribe.Path+signer.Token(id, "u1"), strings.NewReader("List-Unsubscribe=One-Click"))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		answered <- w.Code
	}()
	named := func() bool {
		m, err := state.SpooledRefusals(ctx, rdb)
		if err != nil {
			t.Fatal(err)
		}
		return m[state.SpooledUser("u1")]
	}
	deadline := time.Now().Add(2 * time.Second)
	for !named() {
		if time.Now().After(deadline) {
			t.Fatal("the one-click's user is not named to the workers 2 s after the POST, while its write waits for the consents' turn")
		}
		time.Sleep(50 * time.Millisecond)
	}
	end()
	if code := <-answered; code != http.StatusOK {
		t.Fatalf("the one-click POST: %d, want 200", code)
	}
	var status string
	if err := db.QueryRow(ctx, `SELECT status FROM iys_consents WHERE recipient = $1 AND type = 'EPOSTA'`, oneClickAddr).Scan(&status); err != nil {
		t.Fatal(err)
	}
	if status != "RET" || named() {
		t.Fatalf("once recorded: consent %s, still named %v; want RET, not named", status, named())
	}
	if n, _ := sink.spool.Held(); n != 0 {
		t.Fatalf("the spool holds %d requests; want none (recorded within --store-wait)", n)
	}
}
