package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testdb"
)

// A signed SendGrid post holds an unsubscribe and a bounce whose reason (the receiving mail server's
// text, which SendGrid only relays) carries a NUL character, which Postgres refuses in text. The post is
// recorded whole: the refusal makes the consent RET, and the post is answered 204. Before, every repeat
// of it was answered 500 and the unsubscribe never recorded, until SendGrid gave up on it.
func TestARefusalIsRecordedBesideAReceiptWithANulInItsText(t *testing.T) {
	t.Parallel()
	pool, dbURL := testdb.New(t)
	key := newHooksKey(t)
	env := map[string]string{"DATABASE_URL": dbURL, "TWILIO_AUTH_TOKEN": hooksToken, "SENDGRID_WEBHOOK_PUBLIC_KEY": key.public, "IYS_BRAND_CODE": "654321"}
	hooks := serveInProcess(t, env, hooksURLRe, "webhooks", "--addr", "127.0.0.1:0")
	if _, err := pool.Exec(t.Context(), `INSERT INTO iys_consents (recipient, type, recipient_type, brand_code, status, source, consent_date)
		VALUES ('refuser@example.com', 'EPOSTA', 'BIREYSEL', '654321', 'ONAY', 'HS_WEB', now() - interval '1 day')`); err != nil {
		t.Fatal(err)
	}
	now := time.Now().Unix()
	events := []map[string]any{
		{"event": "bounce", "email": "other@example.com", "timestamp": now, "sg_event_id": "ev-bounce-1", "sg_message_id": "msg1.filter",
			"reason": "550 5.1.1 mailbox \u0000 unavailable", "type": "bounce", "campaign_id": "1", "user_id": "u2"},
		{"event": "unsubscribe", "email": "refuser@example.com", "timestamp": now, "sg_event_id": "ev-unsub-1", "sg_message_id": "msg2.filter",
			"campaign_id": "1", "user_id": "u1"},
	}
	body, _ := json.Marshal(events)
	var codes []int
	for range 3 { // SendGrid posts a failed batch again
		codes = append(codes, hooksPost(t, hooks.base+sendgridReceiptPath, bytes.NewReader(body), key.headers(t, body)))
	}
	var status string
	if err := pool.QueryRow(t.Context(), `SELECT status FROM iys_consents WHERE recipient = 'refuser@example.com'`).Scan(&status); err != nil {
		t.Fatal(err)
	}
	refusals := countRows(t, pool, `SELECT count(*) FROM refusals`)
	t.Logf("answers to the three posts: %v; refusals recorded %d; consent %s", codes, refusals, status)
	if refusals != 1 || status != "RET" || codes[0] != http.StatusNoContent {
		t.Fatalf("after 3 posts of a signed batch: answers %v, refusals recorded %d, consent of refuser@example.com %s; want 204, the refusal recorded and the consent RET",
			codes, refusals, status)
	}
}

// A receipt Postgres refuses (here a time beyond its range) fails the statement that writes the requests
// gathered with it; each is then written alone, so only its own request fails, not the Twilio callbacks of
// other messages that happened to wait at that moment.
func TestOneBadReceiptDoesNotFailTheRequestsWrittenWithIt(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	if _, err := db.Exec(t.Context(), `INSERT INTO campaign_recipients (campaign_id, user_id, address, batch, status)
		SELECT 1, 'u' || i, '+90555000000' || i, 0, 'sent' FROM generate_series(0, 5) i`); err != nil {
		t.Fatal(err)
	}
	b := newDeliveryBatcher(campaign.NewStore(db))
	rcpt := func(user, errText string) campaign.Delivery {
		return campaign.Delivery{Provider: "twilio", CampaignID: 1, UserID: user, MessageID: "SM" + user, Status: campaign.DeliveryDelivered,
			Error: errText, EventID: "SM" + user + ":delivered", At: time.Now()}
	}
	bad := rcpt("u2", "")
	bad.At = time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC)
	requests := [][]campaign.Delivery{
		{rcpt("u0", ""), rcpt("u1", "")},
		{bad},
		{rcpt("u3", ""), rcpt("u4", "")},
	}
	errs := make([]error, len(requests))
	var wg sync.WaitGroup
	for i, ds := range requests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = b.record(t.Context(), ds)
		}()
	}
	waitFor(t, 5*time.Second, func() bool { return len(b.in) == len(requests) })
	go b.run(t.Context())
	wg.Wait()
	t.Logf("errors: %v", errs)
	for _, i := range []int{0, 2} {
		if errs[i] != nil {
			t.Errorf("request %d (good receipts) failed because another request's receipt was bad: %v", i, errs[i])
		}
	}
	if errs[1] == nil {
		t.Errorf("the request with a time Postgres cannot store was recorded")
	}
	if n := countRows(t, db, `SELECT count(*) FROM campaign_recipients WHERE delivery IS NOT NULL`); n != 4 {
		t.Errorf("%d recipients have a receipt, want the 4 of the good requests", n)
	}
}
