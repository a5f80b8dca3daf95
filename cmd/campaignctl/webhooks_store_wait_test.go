package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/campaignctl/campaignctl/internal/testdb"
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
	var dbName string
	if err := pool.QueryRow(ctx, `SELECT current_database()`).Scan(&dbName); err != nil {
		t.Fatal(err)
	}
	const brand, from = "654321", "+905551239999"
	if _, err := pool.Exec(ctx, `INSERT INTO iys_consents (recipient, type, recipient_type, brand_code, status, source, consent_date)
		VALUES ($1, 'MESAJ', 'BIREYSEL', $2, 'ONAY', 'HS_WEB', now() - interval '1 day')`, from, brand); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"DATABASE_URL": dbURL, "TWILIO_AUTH_TOKEN": hooksToken, "IYS_BRAND_CODE": brand}
	hooks := serveInProcess(t, env, hooksURLRe, "webhooks", "--addr", "127.0.0.1:0") // the default --store-wait
	admin, err := pgx.Connect(ctx, testdb.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(context.Background()) })
	allow := func(ok bool) {
		if _, err := admin.Exec(context.Background(), fmt.Sprintf(`ALTER DATABASE %s ALLOW_CONNECTIONS %t`, dbName, ok)); err != nil {
			t.Error(err)
		}
	}
	// Postgres goes: no new connection to the database, and every open one is cut. It comes back 2 s later
	// (admin is one connection: only that goroutine uses it from now on, and the test waits for it).
	allow(false)
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, dbName); err != nil {
		allow(true)
		t.Fatal(err)
	}
	pool.Reset()
	back := make(chan struct{})
	go func() {
		defer close(back)
		time.Sleep(2 * time.Second)
		allow(true)
	}()
	t.Cleanup(func() { <-back })

	sid := "SMin0000000000000000000000000000099"
	form := url.Values{"MessageSid": {sid}, "SmsMessageSid": {sid}, "AccountSid": {"ACtest"}, "From": {from}, "To": {"+908501234567"},
		"Body": {"RET"}, "NumMedia": {"0"}, "SmsStatus": {"received"}, "ApiVersion": {"2010-04-01"}}
	target := hooks.base + twilioInboundPath
	hdr := map[string]string{"Content-Type": "application/x-www-form-urlencoded", "X-Twilio-Signature": twilioSig(hooksToken, target, form)}
	start := time.Now()
	code := hooksPost(t, target, strings.NewReader(form.Encode()), hdr)
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
