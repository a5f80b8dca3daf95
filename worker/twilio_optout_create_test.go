package worker

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/iys"
	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/sandbox"
)

// Order: u1 replied STOP to the brand's Twilio sender (the inbound post was lost, or came before the
// webhooks ran). Campaign 1: Twilio refuses u1 at creation with 21610. When the worker turned u1's ONAY
// RET here only (origin provider) and queued nothing for İYS, which still held the ONAY, this happened: The operator runs
// `iys sync --reverify` (as the docs and the worker's error log advise): İYS says ONAY, so the consent is
// set back to ONAY. Campaign 2: Twilio is down and the send fails over to Netgsm, which asks İYS (ONAY)
// and delivers: the person who said STOP to the brand's number gets a commercial SMS. The same 21610 in
// a Twilio status callback is recorded as the person's refusal and registered in İYS (receipts/twilio.go);
// at creation it is now recorded the same way.
func TestATwilioOptOutAtCreationIsNotUndoneByAReverification(t *testing.T) {
	t.Parallel()
	const brand = "700002"
	const stopped = "+905320000001" // u1
	ctx := context.Background()
	f := planAround(t, 10, func(s *campaign.Spec) { s.BrandCode = brand }, func(db *pgxpool.Pool, launch func()) {
		if _, err := db.Exec(ctx, `UPDATE iys_consents SET brand_code = $1, consent_date = now() - interval '2 days'`, brand); err != nil {
			t.Fatal(err)
		}
		launch()
	})
	sb := sandbox.New(sandbox.Options{IYSUsername: "api@brand.example", IYSPassword: "pw-1234567", IYSCode: 700001, IYSBrandCode: 700002})
	srv := httptest.NewServer(sb)
	t.Cleanup(srv.Close)
	// İYS holds the ONAY of everyone who has one here (u5 and u10 have none).
	for _, i := range []int{1, 2, 3, 4, 6, 7, 8, 9} {
		if _, err := sb.AddIYSConsents(sandbox.IYSConsent{Recipient: phone(i), Type: "MESAJ", Status: "ONAY", Source: "HS_WEB",
			CreationDate: time.Now().Add(-48 * time.Hour).In(iys.Istanbul()).Format(iys.DateLayout)}); err != nil {
			t.Fatal(err)
		}
	}
	ic, err := iys.NewClient(iys.Config{BaseURL: srv.URL, Username: "api@brand.example", Password: "pw-1234567", IYSCode: "700001", BrandCode: brand})
	if err != nil {
		t.Fatal(err)
	}

	f.provider.fail = func(_ int, m providers.Message) error {
		if m.To == stopped {
			return &providers.Error{Provider: "twilio", Status: 400, Code: 21610, Class: providers.Permanent, OptedOut: true,
				Message: "Attempt to send to unsubscribed recipient"}
		}
		return nil
	}
	fb := newProvider()
	f.h.cfg.Fallback = map[campaign.Channel]providers.Provider{campaign.ChannelSMS: namedProvider{fb, "netgsm"}}
	f.h.cfg.FailoverWindow = time.Hour
	f.runAll(t)
	if st, reason, _ := f.status(t, "u1"); st != campaign.StatusFailed || !strings.Contains(reason, "21610") {
		t.Fatalf("u1 %s %q; want failed with Twilio's 21610", st, reason)
	}

	// The refusal is recorded in the background, and queued for İYS.
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var outboxed int
		if err := f.db.QueryRow(ctx, `SELECT count(*) FROM iys_outbox WHERE recipient = $1`, stopped).Scan(&outboxed); err != nil {
			t.Fatal(err)
		}
		if outboxed == 1 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("Twilio's 21610 at creation: %d İYS outbox rows 10 s later, want the person's refusal queued", outboxed)
		}
	}

	// The operator re-verifies (docs/operations.md).
	if _, err := iys.Reverify(ctx, f.db, ic, "MESAJ", "BIREYSEL"); err != nil {
		t.Fatal(err)
	}

	// Twilio is down: campaign 2 fails over to Netgsm, which checks İYS (ONAY there) and delivers.
	f.provider.fail = func(int, providers.Message) error {
		return &providers.Error{Provider: "twilio", Status: 503, Class: providers.Transient, Message: "unavailable"}
	}
	spec := fixtureSpec("t2")
	spec.BrandCode = brand
	rep, err := (&campaign.Planner{Engine: f.db, Audience: f.db}).Plan(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	h2 := f.handler(f.rdb)
	h2.cfg.Fallback = f.h.cfg.Fallback
	h2.cfg.FailoverWindow = time.Hour
	for b := 0; b < rep.Batches; b++ {
		if err := h2.RunBatch(ctx, rep.ID, b); err != nil {
			t.Fatalf("campaign 2 batch %d: %v", b, err)
		}
	}
	if got := fb.sentTo(stopped); len(got) != 0 {
		var status string
		var outboxed int
		f.db.QueryRow(ctx, `SELECT status, (SELECT count(*) FROM iys_outbox WHERE recipient = $1) FROM iys_consents WHERE recipient = $1`, stopped).Scan(&status, &outboxed) //nolint:errcheck
		t.Fatalf("u1 replied STOP to the brand's Twilio sender (21610 in campaign 1), yet after a re-verification campaign 2 sent u1 %d commercial SMS through Netgsm (local consent %s, %d İYS outbox rows)",
			len(got), status, outboxed)
	}
}

// u1 replied STOP to the brand's Twilio sender (the inbound post was lost). Campaign 1 is
// transactional (an order notice): Twilio refuses u1 at creation with 21610. The same 21610 in a status
// callback is recorded as u1's refusal whatever the message (receipts/twilio.go), but at creation
// ProviderOptOut records nothing for a transactional campaign. Campaign 2 (commercial): Twilio is down, the
// send fails over to Netgsm, which asks İYS (ONAY there: nobody told it) and delivers to the person who
// said STOP. The refusal must be recorded whatever the message was.
func TestATwilioOptOutAtCreationOfATransactionalMessageIsRecorded(t *testing.T) {
	t.Parallel()
	const stopped = "+905320000001" // u1
	ctx := context.Background()
	f := planAround(t, 10, func(s *campaign.Spec) {
		s.Transactional, s.CodePool, s.Message = true, "", "Merhaba {{.first_name}}, siparisiniz yolda"
	}, nil)
	f.provider.fail = func(_ int, m providers.Message) error {
		if m.To == stopped {
			return &providers.Error{Provider: "twilio", Status: 400, Code: 21610, Class: providers.Permanent, OptedOut: true,
				Message: "Attempt to send to unsubscribed recipient"}
		}
		return nil
	}
	f.runAll(t)
	if st, reason, _ := f.status(t, "u1"); st != campaign.StatusFailed || !strings.Contains(reason, "21610") {
		t.Fatalf("u1 %s %q; want failed with Twilio's 21610", st, reason)
	}
	var refusals int
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if err := f.db.QueryRow(ctx, `SELECT count(*) FROM refusals WHERE recipient = $1 AND via = 'twilio_opt_out'`, stopped).Scan(&refusals); err != nil {
			t.Fatal(err)
		}
		if refusals > 0 || time.Now().After(end) {
			break
		}
	}

	// Campaign 2, commercial: Twilio is down, Netgsm takes it.
	f.provider.fail = func(int, providers.Message) error {
		return &providers.Error{Provider: "twilio", Status: 503, Class: providers.Transient, Message: "unavailable"}
	}
	fb := newProvider()
	rep, err := (&campaign.Planner{Engine: f.db, Audience: f.db}).Plan(ctx, fixtureSpec("t2"))
	if err != nil {
		t.Fatal(err)
	}
	h2 := f.handler(f.rdb)
	h2.cfg.Fallback = map[campaign.Channel]providers.Provider{campaign.ChannelSMS: namedProvider{fb, "netgsm"}}
	h2.cfg.FailoverWindow = time.Hour
	for b := 0; b < rep.Batches; b++ {
		if err := h2.RunBatch(ctx, rep.ID, b); err != nil {
			t.Fatalf("campaign 2 batch %d: %v", b, err)
		}
	}
	if got := fb.sentTo(stopped); len(got) != 0 || refusals == 0 {
		var status string
		f.db.QueryRow(ctx, `SELECT status FROM iys_consents WHERE recipient = $1`, stopped).Scan(&status) //nolint:errcheck
		t.Fatalf("u1 opted out with the brand's Twilio sender (21610 at creation in transactional campaign 1): %d refusals recorded, local consent %s, and commercial campaign 2 sent u1 %d SMS through Netgsm",
			refusals, status, len(got))
	}
}

// u1 replied STOP to the brand's Twilio sender, and Twilio refuses the message at creation (21610) while an
// import holds the consents' turn for longer than a consent write used to be retried (20 attempts, a
// minute): nothing else will carry that refusal again (no message was created, so no status callback
// follows), so the write goes on until it lands. The attempts are shortened here (the policy is the same:
// retried for as long as the worker runs), so that 20 of them pass within the import's 4 s.
func TestATwilioOptOutOutlastsAnImportLongerThanTwentyAttempts(t *testing.T) {
	t.Parallel()
	f := plan(t, 10)
	f.h.consentAttempt, f.h.consentPause = 100*time.Millisecond, 50*time.Millisecond
	f.provider.fail = func(_ int, m providers.Message) error {
		if m.To == phone(1) {
			return &providers.Error{Provider: "twilio", Status: 400, Code: 21610, Class: providers.Permanent, OptedOut: true, Message: "Attempt to send to unsubscribed recipient"}
		}
		return nil
	}
	bg := context.Background()
	endImport := f.holdConsentsTurn(t)
	f.runAll(t)
	if st, _, _ := f.status(t, "u1"); st != campaign.StatusFailed {
		t.Fatalf("u1 %s, want failed", st)
	}
	time.Sleep(4 * time.Second)
	endImport() // the import ends
	var refusals int
	var consent string
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if err := f.db.QueryRow(bg, `SELECT count(*), (SELECT status FROM iys_consents WHERE recipient = $1 AND type = 'MESAJ' LIMIT 1)
			FROM refusals WHERE recipient = $1`, phone(1)).Scan(&refusals, &consent); err != nil {
			t.Fatal(err)
		}
		if refusals > 0 || time.Now().After(end) {
			break
		}
	}
	if refusals != 1 || consent != "RET" {
		t.Fatalf("u1 opted out (21610 at creation) while an import held the consents for 4 s: %d refusals recorded, consent %s; want 1 and RET (nothing else carries that refusal again)", refusals, consent)
	}
}
