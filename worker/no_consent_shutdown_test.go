package worker

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/providers"
)

// Order: an `iys import` holds the consents' turn while a commercial SMS campaign runs under Serve. The
// provider refuses u1 for want of consent (Netgsm 50) and u2 at creation with Twilio's 21610 (the person
// replied STOP). Both recipients are written failed; the consent writes wait in the background for the
// turn. SIGTERM (a deploy) comes; the import ends 300 ms later, well inside --shutdown-timeout (30 s).
// Serve returns at once, without waiting for the background writes: the process exits, and u1's ONAY
// stays ONAY (the next campaign through Twilio reaches them) and u2's refusal is never recorded nor queued
// for İYS (no status callback will ever carry it: Twilio created no message). docs/operations.md says a
// SIGTERM loses nothing.
func TestAProvidersNoConsentIsNotLostAtSIGTERM(t *testing.T) {
	t.Parallel()
	f := plan(t, 10)
	f.provider.fail = func(_ int, m providers.Message) error {
		switch m.To {
		case phone(1):
			return &providers.Error{Provider: "netgsm", Status: 200, Code: 50, Class: providers.Permanent, NoConsent: true, Message: "İYS kontrollü gönderim"}
		case phone(2):
			return &providers.Error{Provider: "twilio", Status: 400, Code: 21610, Class: providers.Permanent, OptedOut: true, Message: "Attempt to send to unsubscribed recipient"}
		}
		return nil
	}
	bg := context.Background()
	endImport := f.holdConsentsTurn(t)
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	if _, _, err := Enqueue(ctx, asynq.NewClientFromRedisClient(f.rdb), f.store, f.campaign(t), true); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, f.rdb, f.h, ServerConfig{Concurrency: 2, ShutdownTimeout: 30 * time.Second})
	}()
	for end := time.Now().Add(30 * time.Second); f.campaign(t).State != campaign.StateCompleted; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("campaign not completed in 30 s")
		}
	}
	if st, _, _ := f.status(t, "u1"); st != campaign.StatusFailed {
		t.Fatalf("u1 %s, want failed", st)
	}
	// SIGTERM; the import ends 300 ms later.
	cancel()
	go func() { time.Sleep(300 * time.Millisecond); endImport() }()
	start := time.Now()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	// The process exits here.
	var u1 string
	var refusals int
	if err := f.db.QueryRow(bg, `SELECT (SELECT status FROM iys_consents WHERE recipient = $1), (SELECT count(*) FROM refusals WHERE recipient = $2)`,
		phone(1), phone(2)).Scan(&u1, &refusals); err != nil {
		t.Fatal(err)
	}
	if u1 != "RET" || refusals != 1 {
		t.Errorf("Serve returned %v after SIGTERM (shutdown timeout 30 s, the import ended after 300 ms) with the consent writes still pending: u1 (Netgsm 50) consent %s, want RET; u2 (Twilio 21610) %d refusals recorded, want 1. At process exit they are lost",
			took.Round(time.Millisecond), u1, refusals)
	}
	time.Sleep(3 * time.Second) // let the orphaned writes finish before the database is dropped
}
