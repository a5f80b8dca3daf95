package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/providers/netgsm"
	"github.com/campaignctl/campaignctl/providers/receipts"
)

// Numbers whose Netgsm report is not "delivered" (the sandbox's magic report numbers +9055501SSNNN).
const (
	iysRejectedNo = "+905550116001" // 16: İYS holds no consent
	iysRejected2  = "+905550116002" // 16 too
	consentedNo   = "+905550116003" // 16, but a consent given after the send is stored before the report
	deliveryErrNo = "+905550112001" // 12: the operator could not deliver it
)

// magicUsers are netgsmCampaignSent's recipients with a magic report number, by user ID.
var magicUsers = map[string]string{"iys16": iysRejectedNo, "iys16b": iysRejected2, "later16": consentedNo, "err12": deliveryErrNo}

// netgsmCampaignSent runs the built binary: a worker with Netgsm alone sends a commercial SMS campaign to
// n customers with ONAYs and the magic report numbers (magicUsers), against a sandbox whose reports are final
// 100 ms after acceptance and not rate limited. It returns the environment, the database, the sandbox's
// address and the campaign's ID once every recipient is sent.
func netgsmCampaignSent(t *testing.T, n int) (*e2eEnv, *pgxpool.Pool, string, int64) {
	t.Helper()
	db, dbURL := testdb.New(t)
	_, redisURL := testredis.New(t)
	ctx := context.Background()
	sb := freeAddr(t)
	e := &e2eEnv{t: t, bin: binary(t), env: append(os.Environ(),
		"DATABASE_URL="+dbURL, "REDIS_URL="+redisURL, "SENDER_IDENTITY="+testSender,
		"NETGSM_USERCODE=8503000000", "NETGSM_PASSWORD=netgsmpass", "NETGSM_HEADER=KAMPANYA",
		"NETGSM_BASE_URL=http://"+sb, "NETGSM_RATE=0",
	)}
	e.mustRun("migrate")
	for _, sql := range []string{
		fmt.Sprintf(`CREATE TABLE customers AS SELECT 'n' || lpad(i::text, 3, '0') AS user_id, '+90532300' || lpad(i::text, 4, '0') AS phone
			FROM generate_series(1, %d) i
			UNION ALL SELECT 'iys16', '%s' UNION ALL SELECT 'iys16b', '%s' UNION ALL SELECT 'later16', '%s' UNION ALL SELECT 'err12', '%s'`,
			n, iysRejectedNo, iysRejected2, consentedNo, deliveryErrNo),
		`GRANT SELECT ON customers TO campaignctl_audience`,
		`INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date)
			SELECT phone, 'MESAJ', 'BIREYSEL', 'ONAY', 'HS_WEB', now() - interval '1 day' FROM customers`,
		`INSERT INTO iys_sync_state (source, last_success_at) VALUES ('import', now())`,
	} {
		if _, err := db.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	e.start("sandbox", "sandbox", "--addr", sb, "--receipt-delay", "100ms", "--netgsm-reports-per-minute", "0")
	waitFor(t, 10*time.Second, func() bool { return listening(sb) })
	e.start("worker", "worker", "--concurrency", "4")
	out := e.mustRun("launch", "--name", "netgsm-reports", "--channel", "sms", "--yes", "--json", "--frequency-cap", "0",
		"--audience", writeFile(t, "audience.sql", "SELECT user_id, phone FROM customers"), "--message", testPrefix+"Size özel indirim")
	var rep struct {
		ID int64 `json:"id"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.ID == 0 {
		t.Fatalf("launch --json: %v\n%s", err, out)
	}
	waitFor(t, 60*time.Second, func() bool {
		var sent int
		db.QueryRow(ctx, `SELECT count(*) FROM campaign_recipients WHERE campaign_id = $1 AND status = 'sent' AND provider = 'netgsm'`, rep.ID).Scan(&sent) //nolint:errcheck
		return sent == n+len(magicUsers)
	})
	return e, db, sb, rep.ID
}

// deliveries returns each recipient's delivery status and error of campaign id ("" when none).
func deliveries(t *testing.T, db *pgxpool.Pool, id int64) map[string][2]string {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT user_id, coalesce(delivery, ''), coalesce(delivery_error, '') FROM campaign_recipients WHERE campaign_id = $1`, id)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][2]string{}
	for rows.Next() {
		var u, d, e string
		if err := rows.Scan(&u, &d, &e); err != nil {
			t.Fatal(err)
		}
		out[u] = [2]string{d, e}
	}
	return out
}

// consentOf is the stored MESAJ consent status of phone.
func consentOf(t *testing.T, db *pgxpool.Pool, phone string) string {
	t.Helper()
	var st string
	if err := db.QueryRow(context.Background(), `SELECT status FROM iys_consents WHERE recipient = $1 AND type = 'MESAJ'`, phone).Scan(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

// TestNetgsmReportsAreHeard runs `campaignctl webhooks` with Netgsm's credentials after a campaign went
// out through Netgsm alone (which posts no receipts): every recipient's delivery comes from Netgsm's
// reports, a report of İYS's refusal (status 16) turns that number's stored consent RET, so that the next
// launch excludes it, and /stats counts what the poller did.
func TestNetgsmReportsAreHeard(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("end-to-end run skipped in -short mode")
	}
	const n = 40
	e, db, _, id := netgsmCampaignSent(t, n)
	// This person gave consent again after the send: the report's refusal is of the consent before it. The
	// consent is stored now, as an import or a sync stores one (updated_at): one dated later but stored
	// before the send was not given after it.
	if _, err := db.Exec(context.Background(), `UPDATE iys_consents SET consent_date = now(), updated_at = now() WHERE recipient = $1`, consentedNo); err != nil {
		t.Fatal(err)
	}
	hooks := freeAddr(t)
	e.start("webhooks", "webhooks", "--addr", hooks, "--netgsm-report-interval", "100ms")
	waitFor(t, 30*time.Second, func() bool {
		for _, d := range deliveries(t, db, id) {
			if d[0] == "" {
				return false
			}
		}
		return true
	})
	ds := deliveries(t, db, id)
	for u, d := range ds {
		want := "delivered"
		if magicUsers[u] != "" {
			want = "undelivered"
		}
		if d[0] != want {
			t.Errorf("%s: delivery %q (%s), want %s", u, d[0], d[1], want)
		}
	}
	if d := ds["iys16"]; d[1] != "netgsm 16: İYS holds no consent for the number" {
		t.Errorf("İYS-rejected delivery error %q", d[1])
	}
	for no, want := range map[string]string{iysRejectedNo: "RET", iysRejected2: "RET", consentedNo: "ONAY", deliveryErrNo: "ONAY"} {
		if st := consentOf(t, db, no); st != want {
			t.Errorf("consent of %s: %s, want %s", no, st, want)
		}
	}
	// The report says why each was not delivered.
	var rows []map[string]any
	if err := json.Unmarshal([]byte(e.mustRun("report", fmt.Sprint(id), "--json", "--status", "sent")), &rows); err != nil {
		t.Fatal(err)
	}
	var saidWhy int
	for _, r := range rows {
		if r["user_id"] == "iys16" && r["delivery"] == "undelivered" && r["delivery_error"] == "netgsm 16: İYS holds no consent for the number" {
			saidWhy++
		}
		if r["delivery"] == "delivered" && r["delivery_error"] != "" {
			t.Errorf("a delivered row with a delivery error: %v", r)
		}
	}
	if saidWhy != 1 {
		t.Errorf("report --json does not say why the İYS-rejected message was not delivered")
	}
	// Each RET's history names its own message's job.
	for _, u := range []string{"iys16", "iys16b"} {
		var job, source string
		if err := db.QueryRow(context.Background(), `SELECT r.provider_message_id, h.source FROM campaign_recipients r
			JOIN iys_consent_history h ON h.recipient = r.address AND h.origin = 'provider'
			WHERE r.campaign_id = $1 AND r.user_id = $2`, id, u).Scan(&job, &source); err != nil {
			t.Fatalf("%s's consent history: %v", u, err)
		}
		if !strings.Contains(source, "job "+job+" ") {
			t.Errorf("%s's RET says %q, not its own job %s", u, source, job)
		}
	}
	// A delivery is dated when Netgsm says the handset got it (100 ms after the send here), not when the
	// report was read (seconds later).
	var late int
	db.QueryRow(context.Background(), `SELECT count(*) FROM campaign_recipients WHERE campaign_id = $1 AND delivery = 'delivered'
		AND delivery_at > sent_at + interval '1 second'`, id).Scan(&late) //nolint:errcheck
	if late != 0 {
		t.Errorf("%d deliveries dated more than a second after their send, want Netgsm's delivery dates", late)
	}
	// The next launch leaves the refused number out.
	out := e.mustRun("launch", "--name", "next", "--channel", "sms", "--yes", "--json", "--dry-run", "--frequency-cap", "0",
		"--audience", writeFile(t, "audience.sql", "SELECT user_id, phone FROM customers"), "--message", testPrefix+"Yine indirim")
	var rep struct {
		Eligible int64            `json:"eligible"`
		Excluded map[string]int64 `json:"excluded"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Eligible != n+2 || rep.Excluded["consent_ret"] != 2 {
		t.Errorf("next launch: %s (%v); want %d eligible, the 2 İYS-rejected numbers excluded as consent_ret", out, err, n+2)
	}
	resp, err := http.Get("http://" + hooks + "/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var stats map[string]receipts.Stats
	if err := json.Unmarshal(body, &stats); err != nil {
		t.Fatalf("/stats: %v\n%s", err, body)
	}
	if s := stats["netgsm"]; s.Receipts != n+4 || s.Refusals != 3 || s.Accepted == 0 {
		t.Errorf("/stats netgsm %+v, want %d receipts and 3 refusals (one of them of a consent since given again)", s, n+4)
	}
}

// A round whose consent write or receipt write fails records nothing it could lose: the same messages are
// asked about again, and the refusal and the receipts land on the next round, in that order.
func TestNetgsmReportRoundsSurviveFailedWrites(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("end-to-end run skipped in -short mode")
	}
	_, db, sb, id := netgsmCampaignSent(t, 3)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reporter, err := netgsm.NewReporter(netgsm.Config{UserCode: "8503000000", Password: "netgsmpass", BaseURL: "http://" + sb})
	if err != nil {
		t.Fatal(err)
	}
	store := campaign.NewStore(db)
	batched := &batchedDeliveries{batcher: newDeliveryBatcher(store)}
	go batched.batcher.run(ctx)
	var failConsent, failReceipts bool
	sink := receipts.SinkFunc(func(ctx context.Context, rs []receipts.Receipt) error {
		if failReceipts {
			return errors.New("postgres restarting")
		}
		return batched.Record(ctx, rs)
	})
	p := netgsmPoller(reporter, store, sink, time.Millisecond, slog.New(slog.DiscardHandler))
	noConsent := p.NoConsent
	p.NoConsent = func(ctx context.Context, cid int64, ns []receipts.NoConsent) error {
		if failConsent {
			return errors.New("postgres restarting")
		}
		return noConsent(ctx, cid, ns)
	}
	final := func() int {
		c := 0
		for _, d := range deliveries(t, db, id) {
			if d[0] != "" {
				c++
			}
		}
		return c
	}
	time.Sleep(200 * time.Millisecond) // the sandbox's reports are final

	failConsent = true
	p.Poll(ctx)
	if got := final(); got != 0 || consentOf(t, db, iysRejectedNo) != "ONAY" {
		t.Fatalf("after a failed consent write: %d deliveries, consent %s; want none written", got, consentOf(t, db, iysRejectedNo))
	}
	failConsent, failReceipts = false, true
	p.Poll(ctx)
	if got := final(); got != 0 || consentOf(t, db, iysRejectedNo) != "RET" {
		t.Fatalf("after a failed receipt write: %d deliveries, consent %s; want the refusal alone", got, consentOf(t, db, iysRejectedNo))
	}
	failReceipts = false
	p.Poll(ctx)
	if got := final(); got != 3+len(magicUsers) {
		t.Fatalf("after a good round: %d of %d deliveries known", got, 3+len(magicUsers))
	}
	if s := p.Stats(); s.SinkErrors != 2 || s.Receipts != int64(3+len(magicUsers)) || s.Refusals != 3 {
		t.Fatalf("stats %+v: want 2 failed rounds, then %d receipts with 3 refusals", s, 3+len(magicUsers))
	}
	// Nothing is due any more: the next round asks Netgsm nothing.
	before := p.Stats().Accepted
	p.Poll(ctx)
	if p.Stats().Accepted != before {
		t.Fatalf("a round with nothing due asked Netgsm")
	}
}

// Of two webhooks processes on one database, one polls Netgsm at a time; when the holder's session ends
// (its backend terminated, as in a Postgres restart), the holder stops and a new holder takes over (the
// other process, or this one on a new connection), never two at once.
func TestNetgsmReportsArePolledByOneProcess(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const key = 0x74657374 // this test's own lock: other tests' databases share the server's locks
	var mu sync.Mutex
	running := map[string]bool{}
	var both, runs []string
	poller := func(name string) func(context.Context) bool {
		return func(ctx context.Context) bool {
			mu.Lock()
			running[name] = true
			runs = append(runs, name)
			if len(running) > 1 {
				both = append(both, name)
			}
			mu.Unlock()
			<-ctx.Done()
			mu.Lock()
			delete(running, name)
			mu.Unlock()
			return false
		}
	}
	log := slog.New(slog.DiscardHandler)
	go pollAlone(ctx, db, poller("a"), key, 20*time.Millisecond, 50*time.Millisecond, log)
	go pollAlone(ctx, db, poller("b"), key, 20*time.Millisecond, 50*time.Millisecond, log)
	var first string
	waitFor(t, 5*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		if len(runs) > 0 {
			first = runs[0]
		}
		return first != ""
	})
	time.Sleep(200 * time.Millisecond)
	var holder int32
	if err := db.QueryRow(context.Background(), `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = $1 AND granted`, key).Scan(&holder); err != nil {
		t.Fatalf("the lock's holder: %v", err)
	}
	mu.Lock()
	before := len(runs)
	mu.Unlock()
	if _, err := db.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, holder); err != nil {
		t.Fatal(err)
	}
	// A new holder polls: usually the other process; the old one when its new connection came first (both
	// try every retry), which is as good: polling goes on, one process at a time.
	waitFor(t, 5*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(runs) > before && len(running) == 1
	})
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(both) > 0 {
		t.Fatalf("both processes polled at once (runs %v)", runs)
	}
}

// A holder whose rounds keep failing (its address not on Netgsm's allow-list) lets go, and another process
// polls; the lock takes no connection from the pool the poll needs (a pool of one connection).
func TestNetgsmReportsMoveToAProcessThatCanPoll(t *testing.T) {
	t.Parallel()
	_, dbURL := testdb.New(t)
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	db, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const key = 0x74657375
	var mu sync.Mutex
	var failing, polled int
	broken := func(ctx context.Context) bool {
		mu.Lock()
		failing++
		mu.Unlock()
		return true // gave up: every round failed
	}
	healthy := func(ctx context.Context) bool {
		// The poll reads Postgres through the pool while the lock is held.
		var one int
		if err := db.QueryRow(ctx, `SELECT 1`).Scan(&one); err == nil {
			mu.Lock()
			polled++
			mu.Unlock()
		}
		<-ctx.Done()
		return false
	}
	log := slog.New(slog.DiscardHandler)
	go pollAlone(ctx, db, broken, key, 30*time.Millisecond, 20*time.Millisecond, log)
	waitFor(t, 5*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return failing > 0 })
	go pollAlone(ctx, db, healthy, key, 30*time.Millisecond, 20*time.Millisecond, log)
	waitFor(t, 5*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return polled > 0 })
}
