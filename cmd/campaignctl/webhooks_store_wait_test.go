package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/internal/testlog"
	"github.com/campaignctl/campaignctl/internal/unsubscribe"
	"github.com/campaignctl/campaignctl/providers/receipts"
)

// An "RET" answered to a campaign SMS while Postgres refuses connections (a restart, a failover) is held
// by campaignctl webhooks and recorded once Postgres takes connections again, 2 s later: the person's
// consent is RET, the refusal and its İYS outbox row are written once, and Twilio gets its 200. Before,
// the post was answered 500 at once, and Twilio does not post an incoming message again: the refusal was
// lost, and the next campaign messaged someone who had said no.
func TestAnRETDuringAPostgresRestartIsRecordedWhenPostgresIsBack(t *testing.T) {
	t.Parallel()
	pool, dbURL := testdb.New(t)
	ctx := t.Context()
	const brand, from = "654321", "+905551239999"
	smsConsent(t, pool, brand, from)
	env := map[string]string{"DATABASE_URL": dbURL, "TWILIO_AUTH_TOKEN": hooksToken, "IYS_BRAND_CODE": brand}
	hooks := serveInProcess(t, env, hooksURLRe, "webhooks", "--addr", "127.0.0.1:0") // the default --store-wait
	back := refuseConnectionsFor(t, pool, 2*time.Second)

	start := time.Now()
	code := postRET(t, hooks.base, from, "SMin0000000000000000000000000000099")
	took := time.Since(start)
	<-back
	if code != http.StatusOK {
		t.Fatalf("the RET posted while Postgres refused connections was answered %d after %v; want 200 once Postgres is back (Twilio does not post it again)", code, took)
	}
	if took < 1500*time.Millisecond {
		t.Fatalf("answered %d after %v, before Postgres took connections again (2 s)", code, took)
	}
	var status string
	if err := pool.QueryRow(ctx, `SELECT status FROM iys_consents WHERE recipient = $1 AND type = 'MESAJ'`, from).Scan(&status); err != nil {
		t.Fatal(err)
	}
	refusals := countRows(t, pool, `SELECT count(*) FROM refusals WHERE recipient = '`+from+`'`)
	outbox := countRows(t, pool, `SELECT count(*) FROM iys_outbox WHERE recipient = '`+from+`'`)
	if status != "RET" || refusals != 1 || outbox != 1 {
		t.Fatalf("after the post (200 in %v): consent %s, %d refusals, %d İYS outbox rows; want RET, 1, 1", took, status, refusals, outbox)
	}
}

// refuseConnectionsFor makes pool's database refuse every connection, cuts the open ones, and takes
// connections again after d (a Postgres restart, as one database sees it). The channel is closed once it
// takes them again; the test's cleanup waits for it.
func refuseConnectionsFor(t *testing.T, pool *pgxpool.Pool, d time.Duration) <-chan struct{} {
	t.Helper()
	ctx := t.Context()
	var dbName string
	if err := pool.QueryRow(ctx, `SELECT current_database()`).Scan(&dbName); err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, testdb.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	allow := func(ok bool) error {
		_, err := admin.Exec(context.Background(), fmt.Sprintf(`ALTER DATABASE %s ALLOW_CONNECTIONS %t`, dbName, ok))
		return err
	}
	if err := allow(false); err != nil {
		admin.Close(context.Background())
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, dbName); err != nil {
		allow(true) //nolint:errcheck
		admin.Close(context.Background())
		t.Fatal(err)
	}
	pool.Reset()
	// admin is one connection: only this goroutine uses it from now on.
	back := make(chan struct{})
	go func() {
		defer close(back)
		defer admin.Close(context.Background())
		time.Sleep(d)
		if err := allow(true); err != nil {
			t.Error(err)
		}
	}()
	t.Cleanup(func() { <-back })
	return back
}

// A one-click unsubscribe POSTed (by the mail client, RFC 8058) while Postgres refuses connections is held
// and recorded once Postgres is back, 2 s later: 200 and the consent RET. Before, it was answered 503 at
// once, and a mail client's POST may never come again.
func TestAOneClickDuringAPostgresRestartIsRecordedWhenPostgresIsBack(t *testing.T) {
	t.Parallel()
	db, id, signer, _ := oneClickSetup(t)
	log := slog.New(slog.DiscardHandler)
	h := unsubscribeHandler(signer.Signer, campaign.NewStore(db), &refusalSink{pool: db, brand: "654321", log: log}, receipts.DefaultStoreWait, log)
	// A link of a user the campaign never had is an answer (404), not a failure to wait out.
	nobody := httptest.NewRequest(http.MethodPost, unsubscribe.Path+signer.Token(id, "nobody"), strings.NewReader("List-Unsubscribe=One-Click"))
	nobody.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	nw := httptest.NewRecorder()
	began := time.Now()
	if h.ServeHTTP(nw, nobody); nw.Code != http.StatusNotFound || time.Since(began) > 2*time.Second {
		t.Fatalf("a POST of a link of no recipient: %d after %v; want 404 at once", nw.Code, time.Since(began))
	}
	back := refuseConnectionsFor(t, db, 2*time.Second)
	req := httptest.NewRequest(http.MethodPost, unsubscribe.Path+signer.Token(id, "u1"), strings.NewReader("List-Unsubscribe=One-Click"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	w := httptest.NewRecorder()
	start := time.Now()
	h.ServeHTTP(w, req)
	took := time.Since(start)
	<-back
	if w.Code != http.StatusOK || took < 1500*time.Millisecond {
		t.Fatalf("the one-click POST while Postgres refused connections: %d after %v; want 200 once Postgres is back (2 s)", w.Code, took)
	}
	var status string
	if err := db.QueryRow(t.Context(), `SELECT status FROM iys_consents WHERE recipient = $1 AND type = 'EPOSTA'`, oneClickAddr).Scan(&status); err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, db, `SELECT count(*) FROM refusals WHERE recipient = '`+oneClickAddr+`'`); status != "RET" || n != 1 {
		t.Fatalf("after the click (200 in %v): consent %s, %d refusals; want RET, 1", took, status, n)
	}
}

// The process itself, stopped (SIGTERM) while it holds a request whose RET Postgres cannot take yet (no
// spool: it is held for --store-wait): the request is answered before the process ends, here 200 once
// Postgres takes connections again 4 s later, and the RET is recorded. Before, the process ended as soon
// as its server began to shut down, and the post got no answer at all: the provider's connection was cut,
// Twilio does not post an incoming SMS again, and the refusal was lost.
func TestAStoppedWebhooksAnswersTheRequestsItHolds(t *testing.T) {
	t.Parallel()
	pool, dbURL := testdb.New(t)
	const brand, from = "654321", "+905551238893"
	smsConsent(t, pool, brand, from)
	addr := freeAddr(t)
	cmd := exec.Command(binary(t), "webhooks", "--addr", addr, "--spool-dir", "", "--store-wait", "8s")
	cmd.Env = []string{"DATABASE_URL=" + dbURL, "TWILIO_AUTH_TOKEN=" + hooksToken, "IYS_BRAND_CODE=" + brand, "HOME=" + t.TempDir()}
	logs := &testlog.Buffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }() //nolint:errcheck // how it ended is not the question
	t.Cleanup(func() {
		cmd.Process.Kill() //nolint:errcheck // ended already, unless the test failed
		<-exited
	})
	waitFor(t, 10*time.Second, func() bool { return listening(addr) })
	back := refuseConnectionsFor(t, pool, 4*time.Second) // long enough for the post to arrive under load
	answered := make(chan int, 1)
	go func() { answered <- postRETOnce("http://"+addr, from, "SMin0000000000000000000000000000093") }()
	// The request is held: its write failed once and is tried again, Postgres still refusing.
	waitFor(t, 10*time.Second, func() bool { return strings.Contains(logs.String(), "record refusals failed; trying again") })
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := <-answered; code != http.StatusOK {
		t.Fatalf("the RET held when the process was stopped: answer %d (0: none, the connection cut), want 200 once Postgres took it\n%s", code, logs.String())
	}
	<-back
	select {
	case <-exited:
	case <-time.After(20 * time.Second):
		t.Fatalf("the stopped process did not end once its requests were answered\n%s", logs.String())
	}
	if got := countRows(t, pool, `SELECT count(*) FROM refusals WHERE recipient = '`+from+`'`); got != 1 {
		t.Fatalf("%d refusals recorded, want 1", got)
	}
}

// postRETOnce is postRET from a goroutine: no test failure, the status, or 0 when no answer came.
func postRETOnce(base, from, sid string) int {
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(retRequest(base, from, sid))
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
