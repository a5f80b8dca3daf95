package main

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/campaignctl/campaignctl/internal/testdb"
)

// Twilio itself takes a person's opt-out and blocks every further message from the sender to them: on
// its standard opt-out words (STOP, STOPALL, UNSUBSCRIBE, CANCEL, END, QUIT, OPTOUT, REVOKE), and on any
// custom word of Advanced Opt-Out, posting the message to the incoming-message webhook with
// OptOutType=STOP. A send to such a person afterwards fails with 21610 ("recipient replied STOP"). Each
// of these is a refusal that reached campaignctl webhooks and is answered 2xx: it must become a local RET
// (and an İYS outbox row), as "STOP" does. Before, none of them did: the consent stayed ONAY, nothing was
// queued for İYS, and the next campaign (or one sent through another sender number, which Twilio does not
// block) messaged someone who said no.
func TestTwilioOptOutsTwilioHonoursBecomeRETs(t *testing.T) {
	t.Parallel()
	db, dbURL := testdb.New(t)
	ctx := t.Context()
	const brand = "654321"
	for _, sql := range []string{
		`INSERT INTO iys_consents (recipient, type, recipient_type, brand_code, status, source, consent_date)
			SELECT '+90555123000' || i, 'MESAJ', 'BIREYSEL', '` + brand + `', 'ONAY', 'HS_WEB', now() - interval '1 day' FROM generate_series(0, 4) i`,
		`INSERT INTO campaign_recipients (campaign_id, user_id, address, batch, status, provider_message_id)
			VALUES (1, 'u4', '+905551230004', 0, 'sent', 'SM21610aaaaaaaaaaaaaaaaaaaaaaaaaaa')`,
	} {
		if _, err := db.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	env := map[string]string{"DATABASE_URL": dbURL, "TWILIO_AUTH_TOKEN": hooksToken, "IYS_BRAND_CODE": brand}
	hooks := serveInProcess(t, env, hooksURLRe, "webhooks", "--addr", "127.0.0.1:0")
	post := func(path string, form url.Values, want int) {
		t.Helper()
		target := hooks.base + path
		hdr := map[string]string{"Content-Type": "application/x-www-form-urlencoded", "X-Twilio-Signature": twilioSig(hooksToken, target, form)}
		if code := hooksPost(t, target, strings.NewReader(form.Encode()), hdr); code != want {
			t.Fatalf("POST %s %v: %d, want %d", path, form, code, want)
		}
	}
	inbound := func(sid, from, body string) url.Values {
		return url.Values{"MessageSid": {sid}, "SmsMessageSid": {sid}, "AccountSid": {"ACtest"}, "From": {from}, "To": {"+908501234567"},
			"Body": {body}, "NumMedia": {"0"}, "SmsStatus": {"received"}, "ApiVersion": {"2010-04-01"}, "OptOutType": {"STOP"}}
	}
	// 0. The control: "STOP" is a refusal.
	post(twilioInboundPath, inbound("SMin0000000000000000000000000000000", "+905551230000", "STOP"), http.StatusOK)
	// 1.-3. Twilio's own opt-out words, flagged OptOutType=STOP by Twilio: Twilio now blocks this sender.
	post(twilioInboundPath, inbound("SMin0000000000000000000000000000001", "+905551230001", "CANCEL"), http.StatusOK)
	post(twilioInboundPath, inbound("SMin0000000000000000000000000000002", "+905551230002", "UNSUBSCRIBE"), http.StatusOK)
	post(twilioInboundPath, inbound("SMin0000000000000000000000000000003", "+905551230003", "STOPALL"), http.StatusOK)
	// 4. A message of campaign 1 fails at Twilio with 21610: the recipient replied STOP (Twilio blocks them).
	post(twilioReceiptPath+"?campaign_id=1&user_id=u4", url.Values{"MessageSid": {"SM21610aaaaaaaaaaaaaaaaaaaaaaaaaaa"}, "MessageStatus": {"undelivered"},
		"ErrorCode": {"21610"}, "AccountSid": {"ACtest"}, "To": {"+905551230004"}, "From": {"+908501234567"}, "ApiVersion": {"2010-04-01"}}, http.StatusNoContent)

	for i, why := range []string{"STOP", "CANCEL (OptOutType=STOP)", "UNSUBSCRIBE (OptOutType=STOP)", "STOPALL (OptOutType=STOP)", "status callback ErrorCode 21610"} {
		addr := "+90555123000" + string(rune('0'+i))
		var status string
		if err := db.QueryRow(ctx, `SELECT status FROM iys_consents WHERE recipient = $1 AND type = 'MESAJ'`, addr).Scan(&status); err != nil {
			t.Fatal(err)
		}
		var refusals, queued int
		// Where it came from: the person's own SMS, or Twilio's word (21610) that they opted out with it.
		via := "twilio_inbound"
		if i == 4 {
			via = "twilio_opt_out"
		}
		db.QueryRow(ctx, `SELECT count(*) FROM refusals WHERE recipient = $1 AND via = $2`, addr, via).Scan(&refusals) //nolint:errcheck
		db.QueryRow(ctx, `SELECT count(*) FROM iys_outbox WHERE recipient = $1`, addr).Scan(&queued)                   //nolint:errcheck
		if status != "RET" || refusals != 1 || queued != 1 {
			t.Errorf("%s after %s (acknowledged to Twilio): consent %s, %d refusals via %s, %d İYS outbox rows; want RET, 1, 1", addr, why, status, refusals, via, queued)
		}
	}
}

// campaignctl webhooks --addr 0.0.0.0:PORT (every interface, no proxy in front: the second example of its
// help without --public-url) checks Twilio's signature against the URL each request was sent to. Before,
// it checked it over "http://0.0.0.0:PORT/...", a URL Twilio can never have called: every signed incoming
// SMS, "RET" included, was refused 403, and Twilio does not post an incoming message again.
func TestWebhooksOnEveryInterfaceWithoutPublicURLTakeSignedRefusals(t *testing.T) {
	t.Parallel()
	db, dbURL := testdb.New(t)
	ctx := t.Context()
	if _, err := db.Exec(ctx, `INSERT INTO iys_consents (recipient, type, recipient_type, brand_code, status, source, consent_date)
		VALUES ('+905551239999', 'MESAJ', 'BIREYSEL', '654321', 'ONAY', 'HS_WEB', now() - interval '1 day')`); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"DATABASE_URL": dbURL, "TWILIO_AUTH_TOKEN": hooksToken, "IYS_BRAND_CODE": "654321"}
	hooks := serveInProcess(t, env, hooksURLRe, "webhooks", "--addr", "0.0.0.0:0")
	// Twilio calls the URL configured on the number: this host as it reaches it.
	target := hooks.base + twilioInboundPath
	form := url.Values{"MessageSid": {"SMin9999999999999999999999999999999"}, "AccountSid": {"ACtest"}, "From": {"+905551239999"},
		"To": {"+908501234567"}, "Body": {"RET"}, "NumMedia": {"0"}, "SmsStatus": {"received"}, "ApiVersion": {"2010-04-01"}}
	hdr := map[string]string{"Content-Type": "application/x-www-form-urlencoded", "X-Twilio-Signature": twilioSig(hooksToken, target, form)}
	code := hooksPost(t, target, strings.NewReader(form.Encode()), hdr)
	var status string
	db.QueryRow(ctx, `SELECT status FROM iys_consents WHERE recipient = '+905551239999'`).Scan(&status) //nolint:errcheck
	if code != http.StatusOK || status != "RET" {
		t.Errorf("a correctly signed \"RET\" to %s: %d, consent %s; want 200 and RET", target, code, status)
	}
}

// WEBHOOKS_PUBLIC_URL is where recipients and providers reach campaignctl webhooks: behind a proxy that
// strips a path prefix, Twilio signs the public URL it called. Without --public-url, webhooks checked the
// signature against its own address only, and every signed refusal through the proxy was refused 403 (Twilio
// does not post an incoming message again). --public-url still wins over it.
func TestWebhooksCheckTwilioSignaturesAgainstWebhooksPublicURL(t *testing.T) {
	t.Parallel()
	db, dbURL := testdb.New(t)
	ctx := t.Context()
	if _, err := db.Exec(ctx, `INSERT INTO iys_consents (recipient, type, recipient_type, brand_code, status, source, consent_date)
		VALUES ('+905551238881', 'MESAJ', 'BIREYSEL', '654321', 'ONAY', 'HS_WEB', now() - interval '1 day'),
		       ('+905551238882', 'MESAJ', 'BIREYSEL', '654321', 'ONAY', 'HS_WEB', now() - interval '1 day')`); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"DATABASE_URL": dbURL, "TWILIO_AUTH_TOKEN": hooksToken, "IYS_BRAND_CODE": "654321",
		"WEBHOOKS_PUBLIC_URL": "https://hooks.example.com/pfx", "UNSUBSCRIBE_SECRET": "public-url-test-secret-0123456789"}
	for _, c := range []struct {
		from, public string
		args         []string
	}{
		{"+905551238881", "https://hooks.example.com/pfx", nil},
		{"+905551238882", "https://other.example.com", []string{"--public-url", "https://other.example.com"}},
	} {
		hooks := serveInProcess(t, env, hooksURLRe, append([]string{"webhooks", "--addr", "127.0.0.1:0", "--spool-dir", ""}, c.args...)...)
		form := url.Values{"MessageSid": {"SMin" + strings.Repeat("8", 28) + c.from[len(c.from)-4:]}, "AccountSid": {"ACtest"}, "From": {c.from},
			"To": {"+908501234567"}, "Body": {"RET"}, "NumMedia": {"0"}, "SmsStatus": {"received"}, "ApiVersion": {"2010-04-01"}}
		// Signed for the public URL, delivered by the proxy to this server's own path.
		hdr := map[string]string{"Content-Type": "application/x-www-form-urlencoded", "X-Twilio-Signature": twilioSig(hooksToken, c.public+twilioInboundPath, form)}
		code := hooksPost(t, hooks.base+twilioInboundPath, strings.NewReader(form.Encode()), hdr)
		var status string
		db.QueryRow(ctx, `SELECT status FROM iys_consents WHERE recipient = $1`, c.from).Scan(&status) //nolint:errcheck
		if code != http.StatusOK || status != "RET" {
			t.Errorf("\"RET\" signed for %s%s (args %v): %d, consent %s; want 200 and RET", c.public, twilioInboundPath, c.args, code, status)
		}
	}
}
