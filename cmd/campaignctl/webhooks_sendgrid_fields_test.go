package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/campaignctl/campaignctl/internal/testdb"
)

// A signed unsubscribe whose custom arg is not a string or a number (another sender of the SendGrid
// account set an object there) is still the person's refusal: it is recorded and the consent turns RET.
// It was counted invalid and answered 204, so SendGrid never posted it again and the next launch sent.
func TestASignedUnsubscribeWithAnObjectForACustomArgRevokesConsent(t *testing.T) {
	t.Parallel()
	pool, dbURL := testdb.New(t)
	key := newHooksKey(t)
	env := map[string]string{"DATABASE_URL": dbURL, "SENDGRID_WEBHOOK_PUBLIC_KEY": key.public, "IYS_BRAND_CODE": "654321"}
	hooks := serveInProcess(t, env, hooksURLRe, "webhooks", "--addr", "127.0.0.1:0")
	if _, err := pool.Exec(t.Context(), `INSERT INTO iys_consents (recipient, type, recipient_type, brand_code, status, source, consent_date)
		VALUES ('refuser@example.com', 'EPOSTA', 'BIREYSEL', '654321', 'ONAY', 'HS_WEB', now() - interval '1 day')`); err != nil {
		t.Fatal(err)
	}
	now := time.Now().Unix()
	events := []map[string]any{
		{"event": "unsubscribe", "email": "refuser@example.com", "timestamp": now, "sg_event_id": "ev-unsub-x", "sg_message_id": "msg2.filter",
			"campaign_id": map[string]any{"id": 1}, "user_id": "u1"},
	}
	body, _ := json.Marshal(events)
	code := hooksPost(t, hooks.base+sendgridReceiptPath, bytes.NewReader(body), key.headers(t, body))
	var status string
	if err := pool.QueryRow(t.Context(), `SELECT status FROM iys_consents WHERE recipient = 'refuser@example.com'`).Scan(&status); err != nil {
		t.Fatal(err)
	}
	refusals := countRows(t, pool, `SELECT count(*) FROM refusals`)
	if code != http.StatusNoContent || refusals != 1 || status != "RET" {
		t.Fatalf("signed unsubscribe answered %d (SendGrid will not post it again) but refusals recorded %d, consent %s; want 1 refusal and RET",
			code, refusals, status)
	}
}

// A batch posted while Postgres refuses connections is answered non-2xx (SendGrid posts it again), and the
// posts that follow apply each of its events once: the refusal, its İYS outbox row, the receipt of an
// unknown recipient and its audit row.
func TestASendGridPostWhilePostgresRefusesIsAppliedOnceWhenPostedAgain(t *testing.T) {
	t.Parallel()
	pool, dbURL := testdb.New(t)
	var dbName string
	if err := pool.QueryRow(t.Context(), `SELECT current_database()`).Scan(&dbName); err != nil {
		t.Fatal(err)
	}
	key := newHooksKey(t)
	env := map[string]string{"DATABASE_URL": dbURL, "SENDGRID_WEBHOOK_PUBLIC_KEY": key.public, "IYS_BRAND_CODE": "654321"}
	// An outage longer than the wait: the post is answered 500.
	hooks := serveInProcess(t, env, hooksURLRe, "webhooks", "--addr", "127.0.0.1:0", "--store-wait", "1s")
	if _, err := pool.Exec(t.Context(), `
		INSERT INTO iys_consents (recipient, type, recipient_type, brand_code, status, source, consent_date)
		VALUES ('refuser@example.com', 'EPOSTA', 'BIREYSEL', '654321', 'ONAY', 'HS_WEB', now() - interval '1 day');
		INSERT INTO campaigns (id, name, channel, state, message, audience_sql, batch_size, brand_code)
			OVERRIDING SYSTEM VALUE VALUES (1, 'm', 'email', 'running', 'x', 'SELECT 1', 100, '654321');
		INSERT INTO campaign_recipients (campaign_id, user_id, address, batch, status) VALUES (1, 'u2', 'other@example.com', 0, 'unknown')`); err != nil {
		t.Fatal(err)
	}
	now := time.Now().Unix()
	events := []map[string]any{
		{"event": "delivered", "email": "other@example.com", "timestamp": now, "sg_event_id": "ev-d", "sg_message_id": "msg1.filter", "campaign_id": "1", "user_id": "u2"},
		{"event": "unsubscribe", "email": "refuser@example.com", "timestamp": now, "sg_event_id": "ev-u", "sg_message_id": "msg2.filter", "campaign_id": "1", "user_id": "u1"},
	}
	body, _ := json.Marshal(events)
	admin, err := pgx.Connect(t.Context(), testdb.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(context.Background()) })
	allow := func(ok bool) {
		if _, err := admin.Exec(t.Context(), fmt.Sprintf(`ALTER DATABASE %s ALLOW_CONNECTIONS %t`, dbName, ok)); err != nil {
			t.Fatal(err)
		}
	}
	pool.Reset()
	allow(false)
	t.Cleanup(func() {
		admin.Exec(context.Background(), fmt.Sprintf(`ALTER DATABASE %s ALLOW_CONNECTIONS true`, dbName))
	}) //nolint:errcheck
	if _, err := admin.Exec(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, dbName); err != nil {
		t.Fatal(err)
	}
	code := hooksPost(t, hooks.base+sendgridReceiptPath, bytes.NewReader(body), key.headers(t, body))
	allow(true)
	if code/100 == 2 {
		t.Fatalf("post while Postgres refused connections answered %d: SendGrid will not retry", code)
	}
	codes := []int{code}
	for range 2 {
		codes = append(codes, hooksPost(t, hooks.base+sendgridReceiptPath, bytes.NewReader(body), key.headers(t, body)))
	}
	var status, rstatus, delivery string
	pool.QueryRow(t.Context(), `SELECT status FROM iys_consents WHERE recipient = 'refuser@example.com'`).Scan(&status)                         //nolint:errcheck
	pool.QueryRow(t.Context(), `SELECT status, coalesce(delivery, '') FROM campaign_recipients WHERE user_id = 'u2'`).Scan(&rstatus, &delivery) //nolint:errcheck
	refusals := countRows(t, pool, `SELECT count(*) FROM refusals`)
	logs := countRows(t, pool, `SELECT count(*) FROM send_log WHERE user_id = 'u2'`)
	outbox := countRows(t, pool, `SELECT count(*) FROM iys_outbox`)
	t.Logf("answers %v; consent %s; refusals %d; outbox %d; u2 %s/%s; send_log %d", codes, status, refusals, outbox, rstatus, delivery, logs)
	if codes[1] != http.StatusNoContent || status != "RET" || refusals != 1 || outbox != 1 || rstatus != "sent" || delivery != "delivered" || logs != 1 {
		t.Fatalf("after the retries: answers %v; consent %s, refusals %d, outbox %d, u2 %s/%s, send_log %d; want 204, RET, 1, 1, sent/delivered, 1",
			codes, status, refusals, outbox, rstatus, delivery, logs)
	}
}

// An unsubscribe (or a spam report) comes through the message: the message reached the person. A
// recipient recorded unknown (its worker killed before the answer) whose unsubscribe arrives is sent,
// delivered, and `resume --resend-unknown` leaves it alone. It stayed unknown, and the resend then found
// the refusal and recorded it skipped (revoked): never sent, for a person who had read the message.
func TestAnUnsubscribeThroughTheMessageProvesItWasDelivered(t *testing.T) {
	t.Parallel()
	pool, dbURL := testdb.New(t)
	key := newHooksKey(t)
	env := map[string]string{"DATABASE_URL": dbURL, "SENDGRID_WEBHOOK_PUBLIC_KEY": key.public, "IYS_BRAND_CODE": "654321"}
	hooks := serveInProcess(t, env, hooksURLRe, "webhooks", "--addr", "127.0.0.1:0")
	if _, err := pool.Exec(t.Context(), `
		INSERT INTO iys_consents (recipient, type, recipient_type, brand_code, status, source, consent_date)
		VALUES ('reader@example.com', 'EPOSTA', 'BIREYSEL', '654321', 'ONAY', 'HS_WEB', now() - interval '1 day');
		INSERT INTO campaigns (id, name, channel, state, message, audience_sql, batch_size, brand_code)
			OVERRIDING SYSTEM VALUE VALUES (1, 'm', 'email', 'running', 'x', 'SELECT 1', 100, '654321');
		INSERT INTO campaign_recipients (campaign_id, user_id, address, batch, status) VALUES (1, 'u1', 'reader@example.com', 0, 'unknown')`); err != nil {
		t.Fatal(err)
	}
	events := []map[string]any{
		{"event": "unsubscribe", "email": "reader@example.com", "timestamp": time.Now().Unix(), "sg_event_id": "ev-unsub-read",
			"sg_message_id": "msgR.filter", "campaign_id": "1", "user_id": "u1"},
	}
	body, _ := json.Marshal(events)
	if code := hooksPost(t, hooks.base+sendgridReceiptPath, bytes.NewReader(body), key.headers(t, body)); code != http.StatusNoContent {
		t.Fatalf("signed unsubscribe answered %d, want 204", code)
	}
	var status, consent string
	var delivery *string
	if err := pool.QueryRow(t.Context(), `SELECT status, delivery FROM campaign_recipients WHERE campaign_id = 1 AND user_id = 'u1'`).Scan(&status, &delivery); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(t.Context(), `SELECT status FROM iys_consents WHERE recipient = 'reader@example.com'`).Scan(&consent); err != nil {
		t.Fatal(err)
	}
	if status != "sent" || delivery == nil || *delivery != "delivered" || consent != "RET" {
		t.Fatalf("after an unsubscribe through its message: recipient %s (delivery %v), consent %s; want sent, delivered, and the consent RET", status, fmt.Sprint(delivery), consent)
	}
}
