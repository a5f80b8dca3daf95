package iys_test

import (
	"context"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/iys"
)

// A provider's "no consent" (Netgsm's code 50) turns the stored ONAY to RET here, with nothing queued for
// İYS; a re-verification that finds İYS holding the ONAY after all sets it back.
func TestAProvidersNoConsentHoldsUntilAReverificationSaysOtherwise(t *testing.T) {
	const addr = "+905324444481"
	_, pool, brand, _, plain := onayOnBothSides(t, addr)

	ctx := context.Background()
	n, err := iys.RecordNoConsent(ctx, pool, brand, []iys.NoConsent{{Recipient: addr, Type: "MESAJ", RecipientType: "BIREYSEL", Source: "netgsm 50", At: time.Now()}})
	if err != nil || n != 1 {
		t.Fatalf("record: %d turned, %v; want 1", n, err)
	}
	if st := consentStatus(t, pool, addr, "MESAJ", "BIREYSEL", brand); st != "RET" {
		t.Fatalf("after the provider's word: %s, want RET", st)
	}
	items, err := iys.OutboxItems(ctx, pool, time.Now(), 0)
	if err != nil || len(items) != 0 {
		t.Fatalf("İYS outbox: %d rows, %v; want none (the person refused nothing)", len(items), err)
	}
	// Again: a repeat changes nothing.
	if n, err := iys.RecordNoConsent(ctx, pool, brand, []iys.NoConsent{{Recipient: addr, Type: "MESAJ", RecipientType: "BIREYSEL", Source: "netgsm 50", At: time.Now()}}); err != nil || n != 0 {
		t.Fatalf("repeat: %d turned, %v; want 0", n, err)
	}
	if _, err := iys.Reverify(ctx, pool, plain, "MESAJ", "BIREYSEL"); err != nil {
		t.Fatal(err)
	}
	if st := consentStatus(t, pool, addr, "MESAJ", "BIREYSEL", brand); st != "ONAY" {
		t.Fatalf("after a re-verification that finds İYS holding ONAY: %s, want ONAY", st)
	}
}
