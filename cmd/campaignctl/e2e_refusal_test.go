package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/internal/unsubscribe"
	"github.com/campaignctl/campaignctl/providers/sandbox"
)

// TestRefusalsThroughTheMessagesCloseTheLoop runs the built binary: an e-mail and an SMS campaign send
// at 10/s while refusals come back the three ways they do — a one-click unsubscribe link (RFC 8058), a
// SendGrid unsubscribe event, an SMS "RET" to the sender. Each person who refused and was not sent yet
// is skipped (revoked) by the campaign already running; everyone who refused is excluded (consent_ret)
// from the next launch; `iys push` registers each refusal in İYS once, however often it came; the audit
// says where each came from; a forged link changes nothing.
func TestRefusalsThroughTheMessagesCloseTheLoop(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("end-to-end run skipped in -short mode")
	}
	const n = 250 // per channel: three chunks of 100 at 10/s, the third leased some 20 s in
	const secret = "e2e-unsubscribe-secret-0123456789"
	db, dbURL := testdb.New(t)
	_, redisURL := testredis.New(t)
	ctx := context.Background()
	sb, hooksAddr := freeAddr(t), freeAddr(t)
	env := append(os.Environ(),
		"DATABASE_URL="+dbURL, "REDIS_URL="+redisURL, "SENDER_IDENTITY="+testSender,
		"SENDGRID_API_KEY=SG.e2e-key", "SENDGRID_FROM=kampanya@example.com", "SENDGRID_BASE_URL=http://"+sb, "SENDGRID_RATE=0",
		"TWILIO_ACCOUNT_SID=ACref00000000000000000000000000000", "TWILIO_AUTH_TOKEN=reftoken", "TWILIO_FROM=+905550000000",
		"TWILIO_BASE_URL=http://"+sb, "TWILIO_RATE=0",
		"IYS_BASE_URL=http://"+sb, "IYS_USERNAME=api-user", "IYS_PASSWORD=s3cret-pass", "IYS_CODE=123456", "IYS_BRAND_CODE=654321",
		"WEBHOOKS_PUBLIC_URL=http://"+hooksAddr, "UNSUBSCRIBE_SECRET="+secret, "UNSUBSCRIBE_MAILTO=cikis@example.com",
	)
	e := &e2eEnv{t: t, bin: binary(t), env: env}
	e.mustRun("migrate")
	for _, sql := range []string{
		`CREATE TABLE customers AS SELECT 'u' || lpad(i::text, 3, '0') AS user_id, 'musteri' || i || '@example.com' AS email,
			'+90532200' || lpad(i::text, 4, '0') AS phone, 'Ad' || i AS first_name FROM generate_series(1, ` + fmt.Sprint(n) + `) i`,
		`GRANT SELECT ON customers TO campaignctl_audience`,
		`INSERT INTO iys_consents (recipient, type, recipient_type, brand_code, status, source, consent_date)
			SELECT email, 'EPOSTA', 'BIREYSEL', '654321', 'ONAY', 'HS_WEB', now() - interval '1 day' FROM customers
			UNION ALL SELECT phone, 'MESAJ', 'BIREYSEL', '654321', 'ONAY', 'HS_WEB', now() - interval '1 day' FROM customers`,
		`INSERT INTO iys_sync_state (brand_code, source, last_success_at) VALUES ('654321', 'import', now())`,
	} {
		if _, err := db.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	e.start("sandbox", "sandbox", "--addr", sb, "--sendgrid-event-url", "http://"+hooksAddr+sendgridReceiptPath,
		"--twilio-inbound-url", "http://"+hooksAddr+twilioInboundPath, "--receipt-delay", "100ms", "--iys-pull-lag", "0")
	waitFor(t, 10*time.Second, func() bool { return listening(sb) })
	post := func(path string, body any) *http.Response {
		t.Helper()
		b, _ := json.Marshal(body)
		resp, err := http.Post("http://"+sb+path, "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	// İYS holds the ONAY of those who will refuse (a RET is only an update of a stored consent there).
	for _, c := range [][2]string{{"musteri5@example.com", "EPOSTA"}, {"musteri210@example.com", "EPOSTA"}, {"musteri220@example.com", "EPOSTA"}, {"+905322000230", "MESAJ"}} {
		resp := post("/_sandbox/iys/consents", map[string]string{"recipient": c[0], "type": c[1], "recipientType": "BIREYSEL", "status": "ONAY", "source": "HS_WEB"})
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("İYS consent %s: %d", c[0], resp.StatusCode)
		}
	}
	var key struct {
		PublicKey string `json:"public_key"`
	}
	waitFor(t, 10*time.Second, func() bool {
		req, _ := http.NewRequest(http.MethodGet, "http://"+sb+"/v3/user/webhooks/event/settings/signed", nil)
		req.Header.Set("Authorization", "Bearer SG.e2e-key")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return json.NewDecoder(resp.Body).Decode(&key) == nil && key.PublicKey != ""
	})
	hooks := &e2eEnv{t: t, bin: e.bin, env: append(append([]string(nil), env...), "SENDGRID_WEBHOOK_PUBLIC_KEY="+key.PublicKey)}
	hooks.start("webhooks", "webhooks", "--addr", hooksAddr)
	waitFor(t, 10*time.Second, func() bool { return listening(hooksAddr) })
	e.start("worker", "worker", "--concurrency", "4")

	dir := t.TempDir()
	mailSQL, smsSQL := filepath.Join(dir, "mail.sql"), filepath.Join(dir, "sms.sql")
	os.WriteFile(mailSQL, []byte("SELECT user_id, email, first_name FROM customers"), 0o600) //nolint:errcheck
	os.WriteFile(smsSQL, []byte("SELECT user_id, phone, first_name FROM customers"), 0o600)  //nolint:errcheck
	launch := func(args ...string) (int64, map[string]int64) {
		t.Helper()
		out := e.mustRun(append([]string{"launch", "--json"}, args...)...)
		var rep struct {
			ID       int64            `json:"id"`
			Excluded map[string]int64 `json:"excluded"`
		}
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("launch: %v\n%s", err, out)
		}
		return rep.ID, rep.Excluded
	}
	mail, _ := launch("--name", "mail", "--channel", "email", "--audience", mailSQL, "--rate", "10", "--yes",
		"--subject", "Merhaba {{.first_name}}", "--message", "Size özel indirim. Çıkmak için: {{.unsubscribe_url}}")
	sms, _ := launch("--name", "sms", "--channel", "sms", "--audience", smsSQL, "--rate", "10", "--yes",
		"--message", testPrefix+"Merhaba {{.first_name}}")

	// The first chunk of each is out: the refusals come in while both campaigns run.
	var first sandbox.Message
	waitFor(t, 30*time.Second, func() bool {
		var mails, texts int
		for _, m := range sandboxMessages(t, sb) {
			switch m.Provider {
			case "sendgrid":
				mails++
				if m.To == "musteri5@example.com" {
					first = m
				}
			case "twilio":
				texts++
			}
		}
		return mails > 0 && texts > 0 && first.To != ""
	})
	hooksURL := "http://" + hooksAddr
	link, _, ok := strings.Cut(strings.TrimPrefix(first.Headers["List-Unsubscribe"], "<"), ">")
	if !ok || !strings.HasPrefix(link, hooksURL+unsubscribe.Path) || first.Headers["List-Unsubscribe-Post"] != "List-Unsubscribe=One-Click" {
		t.Fatalf("the e-mail to musteri5 carries List-Unsubscribe %q, List-Unsubscribe-Post %q", first.Headers["List-Unsubscribe"], first.Headers["List-Unsubscribe-Post"])
	}
	oneClick := func(link string, want int) {
		t.Helper()
		resp, err := http.Post(link, "application/x-www-form-urlencoded", strings.NewReader("List-Unsubscribe=One-Click"))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("one-click POST %s: %d, want %d", link, resp.StatusCode, want)
		}
	}
	// 1. musteri5, e-mailed already, unsubscribes with one click from the mail client (twice: one refusal).
	oneClick(link, http.StatusOK)
	oneClick(link, http.StatusOK)
	// 2. musteri220 opens the link of a later e-mail: the page asks first (a GET changes nothing), then the
	//    button.
	signer, err := unsubscribe.New(secret, hooksURL)
	if err != nil {
		t.Fatal(err)
	}
	// The worker's links carry their campaign's nonce: a later e-mail's link of u220 is made with it.
	mailed, err := signer.Check(strings.TrimPrefix(link, hooksURL+unsubscribe.Path))
	if err != nil || mailed.CampaignID != mail || mailed.Nonce == "" {
		t.Fatalf("musteri5's link names %+v (%v): want campaign %d with its nonce", mailed, err, mail)
	}
	linkOf := func(user string) string {
		return signer.URL(unsubscribe.Link{CampaignID: mail, Nonce: mailed.Nonce, UserID: user})
	}
	resp, err := http.Get(linkOf("u220"))
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Contains(page, []byte(`<form method="post">`)) || !bytes.Contains(page, []byte("Aboneliğimi iptal et")) {
		t.Fatalf("unsubscribe page: %d\n%s", resp.StatusCode, page)
	}
	resp, err = http.PostForm(linkOf("u220"), url.Values{"List-Unsubscribe": {"One-Click"}, "via": {"page"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("unsubscribe button: %d", resp.StatusCode)
	}
	// 3. musteri210 unsubscribes through SendGrid (an earlier campaign's link); SendGrid posts it again.
	for range 2 {
		resp := post("/_sandbox/sendgrid/events", map[string]string{"event": "unsubscribe", "email": "musteri210@example.com", "sg_event_id": "sg-unsub-210"})
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !bytes.Contains(b, []byte(`"status":204`)) {
			t.Fatalf("SendGrid unsubscribe event: %d %s", resp.StatusCode, b)
		}
	}
	// 4. +905322000230 answers "ret" to the sender, then "İptal" once more.
	for _, text := range []string{"ret", "İptal lütfen"} {
		resp := post("/_sandbox/twilio/inbound", map[string]string{"from": "+905322000230", "to": "+905550000000", "body": text})
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !bytes.Contains(b, []byte(`"status":200`)) {
			t.Fatalf("inbound SMS %q: %d %s", text, resp.StatusCode, b)
		}
	}
	// Forged and foreign links change nothing.
	oneClick(hooksURL+unsubscribe.Path+"forged.token", http.StatusForbidden)
	other, _ := unsubscribe.New("another-secret-0123456789abcdef", hooksURL)
	oneClick(other.URL(unsubscribe.Link{CampaignID: mail, Nonce: mailed.Nonce, UserID: "u100"}), http.StatusForbidden)
	oneClick(linkOf("not-a-recipient"), http.StatusNotFound)
	// An SMS that is no refusal changes nothing either.
	resp = post("/_sandbox/twilio/inbound", map[string]string{"from": "+905322000240", "to": "+905550000000", "body": "Merhaba, kod çalışmadı"})
	resp.Body.Close()

	for _, id := range []int64{mail, sms} {
		waitFor(t, 90*time.Second, func() bool {
			var st map[string]any
			json.Unmarshal([]byte(e.mustRun("status", fmt.Sprint(id), "--json")), &st) //nolint:errcheck
			return st["state"] == "completed"
		})
	}
	// The campaigns running skipped those not sent yet.
	outcome := func(id int64, user string) string {
		var st, reason string
		db.QueryRow(ctx, `SELECT status, coalesce(reason, '') FROM campaign_recipients WHERE campaign_id = $1 AND user_id = $2`, id, user).Scan(&st, &reason) //nolint:errcheck
		return st + "/" + reason
	}
	for _, c := range []struct {
		id         int64
		user, want string
	}{{mail, "u005", "sent/"}, {mail, "u210", "skipped/revoked"}, {mail, "u220", "skipped/revoked"}, {sms, "u230", "skipped/revoked"}, {sms, "u240", "sent/"}, {mail, "u230", "sent/"}} {
		if got := outcome(c.id, c.user); got != c.want {
			t.Errorf("campaign %d, %s: %s, want %s", c.id, c.user, got, c.want)
		}
	}
	var sent, withHeaders int
	for _, m := range sandboxMessages(t, sb) {
		if m.Provider != "sendgrid" {
			continue
		}
		sent++
		lu := m.Headers["List-Unsubscribe"]
		if strings.HasPrefix(lu, "<"+hooksURL+unsubscribe.Path) && strings.Contains(lu, "<mailto:cikis@example.com?") && m.Headers["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click" &&
			strings.Contains(m.Body, "Çıkmak için: "+hooksURL+unsubscribe.Path) {
			withHeaders++
		}
	}
	if sent != n-2 || withHeaders != sent {
		t.Errorf("%d e-mails sent (want %d), %d with their one-click headers and link", sent, n-2, withHeaders)
	}

	// The next launch excludes everyone who refused.
	_, excluded := launch("--name", "mail-2", "--channel", "email", "--audience", mailSQL, "--dry-run", "--frequency-cap", "0",
		"--subject", "Merhaba", "--message", "Yeni fırsat")
	if excluded["consent_ret"] != 3 {
		t.Errorf("next e-mail launch excluded %v, want consent_ret 3 (musteri5, 210, 220)", excluded)
	}
	_, excluded = launch("--name", "sms-2", "--channel", "sms", "--audience", smsSQL, "--dry-run", "--frequency-cap", "0",
		"--message", testPrefix+"Yeni fırsat")
	if excluded["consent_ret"] != 1 {
		t.Errorf("next SMS launch excluded %v, want consent_ret 1 (+905322000230)", excluded)
	}

	// The audit: one refusal per event, with where it came from.
	rows, err := db.Query(ctx, `SELECT via, kind, recipient, source, evidence FROM refusals ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	audit := map[string]string{}
	count := 0
	for rows.Next() {
		var via, kind, rcpt, source, evidence string
		if err := rows.Scan(&via, &kind, &rcpt, &source, &evidence); err != nil {
			t.Fatal(err)
		}
		count++
		audit[rcpt] += via + "/" + kind + "/" + source + " "
		if evidence == "" || strings.Contains(evidence, rcpt) {
			t.Errorf("refusal of %s: evidence %q (empty, or quoting the address)", rcpt, evidence)
		}
	}
	rows.Close()
	want := map[string]string{
		"musteri5@example.com":   "one_click/one_click/HS_EPOSTA ",
		"musteri220@example.com": "one_click/one_click/HS_EPOSTA ",
		"musteri210@example.com": "sendgrid/unsubscribe/HS_EPOSTA ",
		"+905322000230":          "twilio_inbound/inbound/HS_MESAJ twilio_inbound/inbound/HS_MESAJ ",
	}
	if count != 5 || fmt.Sprint(audit) != fmt.Sprint(want) {
		t.Errorf("%d refusals recorded: %v\nwant 5: %v", count, audit, want)
	}

	// İYS gets each refusal once, however often it came and however often push runs.
	out := e.mustRun("iys", "outbox", "--json")
	var box struct {
		States  map[string]int `json:"states"`
		Overdue int            `json:"overdue"`
		Items   []struct {
			Recipient string `json:"recipient"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &box); err != nil || box.States["waiting"] != 4 || len(box.Items) != 4 || strings.Contains(out, "musteri210@example.com") {
		t.Fatalf("iys outbox before push (4 waiting, addresses masked): %v %s", err, out)
	}
	for range 2 {
		if out := e.mustRun("iys", "push"); !strings.Contains(out, "tried") {
			t.Fatalf("iys push: %s", out)
		}
	}
	if err := json.Unmarshal([]byte(e.mustRun("iys", "outbox", "--json")), &box); err != nil || box.States["accepted"] != 4 || box.States["waiting"] != 0 || box.Overdue != 0 {
		t.Fatalf("iys outbox after push: %+v (%v), want 4 accepted", box, err)
	}
	var iysStats sandbox.IYSStats
	r2, err := http.Get("http://" + sb + "/_sandbox/iys/stats")
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(r2.Body).Decode(&iysStats) //nolint:errcheck
	r2.Body.Close()
	for _, k := range []string{sandbox.IYSAddKey("musteri5@example.com", "EPOSTA", "BIREYSEL"), sandbox.IYSAddKey("musteri210@example.com", "EPOSTA", "BIREYSEL"),
		sandbox.IYSAddKey("musteri220@example.com", "EPOSTA", "BIREYSEL"), sandbox.IYSAddKey("+905322000230", "MESAJ", "BIREYSEL")} {
		if iysStats.AddsAcceptedByKey[k] != 1 {
			t.Errorf("İYS registered %s %d times, want once (stats %+v)", k, iysStats.AddsAcceptedByKey[k], iysStats)
		}
	}
	if iysStats.AddsAccepted != 4 {
		t.Errorf("İYS accepted %d adds, want 4", iysStats.AddsAccepted)
	}
	if strings.Contains(hooks.mustRun("iys", "outbox")+e.mustRun("iys", "push"), secret) {
		t.Fatal("a secret was printed")
	}
}
