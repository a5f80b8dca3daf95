package worker

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/iys"
	"github.com/campaignctl/campaignctl/providers"
)

// retHandler is a handler of the fixture's store that sends through p.
func (f *fixture) retHandler(p providers.Provider) *Handler {
	return NewHandler(Config{
		Store: f.store, Redis: f.rdb, Owner: "test", SendWindow: 1,
		Providers:     map[campaign.Channel]providers.Provider{campaign.ChannelSMS: p},
		ProviderRates: map[string]float64{},
	})
}

// retSecond plans a second campaign on the fixture's audience (edit adjusts its spec) and returns its id and
// the batch user holds in it.
func (f *fixture) retSecond(t *testing.T, name string, user string, edit func(*campaign.Spec)) (int64, int, int) {
	t.Helper()
	ctx := context.Background()
	spec := fixtureSpec(name)
	if edit != nil {
		edit(&spec)
	}
	rep, err := (&campaign.Planner{Engine: f.db, Audience: f.db}).Plan(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	var b int
	if err := f.db.QueryRow(ctx, `SELECT batch FROM campaign_recipients WHERE campaign_id = $1 AND user_id = $2`, rep.ID, user).Scan(&b); err != nil {
		t.Fatal(err)
	}
	return rep.ID, rep.Batches, b
}

func netgsm50(to string) func(int, providers.Message) error {
	return func(_ int, m providers.Message) error {
		if m.To == to {
			return &providers.Error{Provider: "netgsm", Status: 200, Code: 50, Class: providers.Permanent, NoConsent: true,
				Message: "İYS kontrollü gönderim"}
		}
		return nil
	}
}

// The claim: a provider's RET (Netgsm 50 in campaign A) makes a running campaign B of the same brand
// skip the person at its next chunk (the consents' version moved: B's lease reads the consent again).
func TestAProvidersNoConsentStopsARunningCampaignAtItsNextChunk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := plan(t, 20)
	x := phone(11)
	idB, batchesB, bx := f.retSecond(t, "b", "u11", nil)
	pB := newProvider()
	hB := f.retHandler(pB)
	// B runs its batches before u11's (it is running), then A meets Netgsm's 50 for u11.
	for b := 0; b < bx; b++ {
		if err := hB.RunBatch(ctx, idB, b); err != nil {
			t.Fatal(err)
		}
	}
	f.provider.fail = netgsm50(x)
	f.runAll(t)
	f.h.waitConsentWrites(10 * time.Second)
	for b := bx; b < batchesB; b++ {
		if err := hB.RunBatch(ctx, idB, b); err != nil {
			t.Fatal(err)
		}
	}
	var st, reason string
	f.db.QueryRow(ctx, `SELECT status, coalesce(reason, '') FROM campaign_recipients WHERE campaign_id = $1 AND user_id = 'u11'`, idB).Scan(&st, &reason) //nolint:errcheck
	if n := len(pB.sentTo(x)); n != 0 || st != campaign.StatusSkipped || reason != campaign.ReasonRevoked {
		t.Fatalf("campaign B: u11 got %d messages (%s/%s) after Netgsm said İYS holds no consent; want 0, skipped/revoked", n, st, reason)
	}
}

// A provider refuses u11 for want of consent in campaign A while an import (or a sync page) holds the
// consents' turn, so the worker's RET is written in the background, retried. Meanwhile campaign B (same
// brand, same worker) leases u11's chunk: its lease still reads the ONAY, but the worker holds u11 back
// until the RET is written, and B settles u11 as revoked. With Netgsm's 50 (İYS holds no consent) and
// with Twilio's 21610 at creation (the person opted out).
func TestAProvidersRefusalStillBeingWrittenHoldsTheAddressBackHere(t *testing.T) {
	twilio21610 := func(to string) func(int, providers.Message) error {
		return func(_ int, m providers.Message) error {
			if m.To == to {
				return &providers.Error{Provider: "twilio", Status: 400, Code: 21610, Class: providers.Permanent, OptedOut: true,
					Message: "Attempt to send to unsubscribed recipient"}
			}
			return nil
		}
	}
	for name, refuse := range map[string]func(string) func(int, providers.Message) error{"netgsm 50": netgsm50, "twilio 21610": twilio21610} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := plan(t, 20)
			x := phone(11)
			idB, batchesB, _ := f.retSecond(t, "b", "u11", nil)
			pB := newProvider()
			endImport := f.holdConsentsTurn(t)
			f.provider.fail = refuse(x)
			f.runAll(t)
			if st, _, _ := f.status(t, "u11"); st != campaign.StatusFailed {
				t.Fatalf("A: u11 %s, want failed", st)
			}
			// The same worker process goes on with B, through a provider that does not check İYS.
			f.h.cfg.Providers = map[campaign.Channel]providers.Provider{campaign.ChannelSMS: pB}
			for b := 0; b < batchesB; b++ {
				if err := f.h.RunBatch(ctx, idB, b); err != nil {
					t.Fatal(err)
				}
			}
			endImport()
			f.h.waitConsentWrites(30 * time.Second)
			// Written now; a lease that read the consents just before that commit still carries the ONAY:
			// the address stays held back a while after it.
			if cB, err := f.store.Get(ctx, idB); err != nil || !f.h.refusedHere(cB, x) {
				t.Fatalf("u11 is no longer held back the moment its RET is written (%v): a lease read just before the commit would send", err)
			}
			var cs, st, reason string
			f.db.QueryRow(ctx, `SELECT status FROM iys_consents WHERE recipient = $1 LIMIT 1`, x).Scan(&cs) //nolint:errcheck
			if n := len(pB.sentTo(x)); n != 0 {
				t.Fatalf("the provider refused u11 for want of consent (campaign A), yet campaign B of the same brand sent u11 %d commercial SMS from the same worker while the RET was still being written (consent now %s)", n, cs)
			}
			f.db.QueryRow(ctx, `SELECT status, coalesce(reason, '') FROM campaign_recipients WHERE campaign_id = $1 AND user_id = 'u11'`, idB).Scan(&st, &reason) //nolint:errcheck
			if st != campaign.StatusSkipped || reason != campaign.ReasonRevoked || cs != "RET" {
				t.Fatalf("campaign B: u11 %s/%s, consent %s; want skipped/revoked and RET once written", st, reason, cs)
			}
		})
	}
}

// smsRET records an SMS reply "RET" from to (brand ”), as the Twilio inbound webhook does.
func smsRET(t *testing.T, f *fixture, to, id string, at time.Time) {
	t.Helper()
	if _, err := iys.RecordRefusals(context.Background(), f.db, "", []iys.Refusal{{Via: iys.ViaTwilioInbound, EventID: id, Kind: "inbound",
		Recipient: to, Type: "MESAJ", Evidence: "RET", At: at}}); err != nil {
		t.Fatal(err)
	}
}

// The RET arrives while the person's chunk is in hand (leased, consents read), before their send, and the
// send comes more than consentMaxAge after the lease read them (the clock is moved on).
func TestARETWhileTheChunkIsInHandStopsASendMoreThanASecondLater(t *testing.T) {
	t.Parallel()
	f := plan(t, 10)
	var mu sync.Mutex
	now := time.Now()
	f.h.cfg.Now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	done := false
	f.provider.before = func(m providers.Message) {
		if m.To == phone(1) && !done {
			done = true
			smsRET(t, f, phone(2), "SM-in-hand", time.Now())
			mu.Lock()
			now = now.Add(2 * time.Second)
			mu.Unlock()
		}
	}
	f.runAll(t)
	if n := len(f.provider.sentTo(phone(2))); n != 0 {
		t.Fatalf("u2 refused while its chunk was in hand, >1 s before its send, yet got %d messages", n)
	}
}

// The RET, then Redis loses its data (the test's own DB), then resume, then the batch again.
func TestARETThenARedisWipeThenResumeSendsNothingToThePerson(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := plan(t, 10)
	done := false
	f.provider.before = func(m providers.Message) {
		if m.To == phone(1) && !done {
			done = true
			smsRET(t, f, phone(2), "SM-wipe", time.Now())
			if err := f.rdb.FlushDB(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	for b := 0; b < f.batches; b++ {
		t.Logf("batch %d: %v", b, f.h.RunBatch(ctx, f.id, b))
	}
	if _, err := Resume(ctx, ResumeOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id}); err != nil {
		t.Logf("resume: %v", err)
	}
	h2 := f.handler(f.rdb)
	for b := 0; b < f.batches; b++ {
		t.Logf("batch %d again: %v", b, h2.RunBatch(ctx, f.id, b))
	}
	if n := len(f.provider.sentTo(phone(2))); n != 0 {
		t.Fatalf("u2 refused before its send, Redis wiped, resumed: u2 got %d messages", n)
	}
	if n := len(f.provider.sentTo(phone(1))); n > 1 {
		t.Fatalf("u1 got %d messages", n)
	}
	if st, reason, _ := f.status(t, "u2"); st != campaign.StatusSkipped || reason != campaign.ReasonRevoked {
		t.Fatalf("u2 %s/%s, want skipped/revoked", st, reason)
	}
}

// Netgsm 50 in a TACIR campaign: the TACIR consent only. A BIREYSEL campaign still reaches the person
// (its own consent is ONAY), a TACIR one does not; another brand's campaign still reaches them.
func TestAProvidersNoConsentHoldsOnlyItsBrandAndRecipientType(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	x := phone(11)
	f := planAround(t, 20, func(s *campaign.Spec) { s.RecipientType = "TACIR" }, func(db *pgxpool.Pool, launch func()) {
		for _, q := range []string{
			`INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date, brand_code)
			 SELECT recipient, type, 'TACIR', status, source, consent_date, '' FROM iys_consents WHERE recipient_type = 'BIREYSEL' AND brand_code = ''`,
			`INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date, brand_code)
			 SELECT recipient, type, recipient_type, status, source, consent_date, '222' FROM iys_consents WHERE brand_code = ''`,
		} {
			if _, err := db.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		launch()
	})
	idB, nB, _ := f.retSecond(t, "bireysel", "u11", nil)
	idC, nC, _ := f.retSecond(t, "tacir", "u11", func(s *campaign.Spec) { s.RecipientType = "TACIR" })
	idD, nD, _ := f.retSecond(t, "brand222", "u11", func(s *campaign.Spec) { s.RecipientType = "TACIR"; s.BrandCode = "222" })
	f.provider.fail = netgsm50(x)
	f.runAll(t)
	f.h.waitConsentWrites(10 * time.Second)
	run := func(id int64, n int) *scriptedProvider {
		p := newProvider()
		h := f.retHandler(p)
		for b := 0; b < n; b++ {
			if err := h.RunBatch(ctx, id, b); err != nil {
				t.Fatal(err)
			}
		}
		return p
	}
	if n := len(run(idB, nB).sentTo(x)); n != 1 {
		t.Errorf("BIREYSEL campaign: u11 got %d messages, want 1 (Netgsm refused the TACIR message only)", n)
	}
	if n := len(run(idC, nC).sentTo(x)); n != 0 {
		t.Errorf("TACIR campaign: u11 got %d messages, want 0", n)
	}
	if n := len(run(idD, nD).sentTo(x)); n != 1 {
		t.Errorf("brand 222 TACIR campaign: u11 got %d messages, want 1 (brand '' was refused)", n)
	}
}

// A RET (SMS reply) dated before the ONAY stored arrives after the launch: the ONAY is the later decision
// and stands; the send is not blocked (no over-blocking), and a Netgsm 50 dated before a newer ONAY
// does not turn it either.
func TestARETOlderThanTheONAYStoredDoesNotBlock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := plan(t, 10)
	smsRET(t, f, phone(2), "SM-old", time.Now().Add(-time.Hour))
	f.runAll(t)
	if n := len(f.provider.sentTo(phone(2))); n != 1 {
		var st string
		f.db.QueryRow(ctx, `SELECT status FROM iys_consents WHERE recipient = $1`, phone(2)).Scan(&st) //nolint:errcheck
		t.Fatalf("u2: %d messages (consent %s); a RET older than its ONAY must not block", n, st)
	}
}
