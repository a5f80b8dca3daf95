package iys_test

import (
	"context"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/iys"
)

// Order: a provider refuses a commercial SMS for want of consent (Twilio 21610 at creation, or Netgsm's
// code 50): the stored ONAY turns RET here, nothing queued for İYS (İYS still holds the ONAY). Then the
// person refuses through the brand's own channel (an SMS "RET" to the sender, or a Twilio status
// callback 21610): RecordRefusals finds the consent RET already and queues nothing. A sync pulls nothing
// new (İYS's ONAY was pulled long ago), and `iys push` has nothing to send: İYS keeps the ONAY, the
// refusal is never registered there, and no overdue alarm fires (there is no outbox row to be overdue).
func TestARealRefusalAfterAProvidersNoConsentReachesIYS(t *testing.T) {
	const addr = "+905324444491"
	e, pool, brand, _, c := onayOnBothSides(t, addr)
	ctx := context.Background()
	// The ONAY was pulled long ago: the cursor is past it.
	if _, err := iys.Sync(ctx, pool, c); err != nil {
		t.Fatal(err)
	}
	now := time.Now().Truncate(time.Second)
	if n, err := iys.RecordNoConsent(ctx, pool, brand, []iys.NoConsent{{Recipient: addr, Type: "MESAJ", RecipientType: "BIREYSEL",
		Source: "twilio 21610", At: now.Add(-time.Hour)}}); err != nil || n != 1 {
		t.Fatalf("provider's no consent: %d turned, %v", n, err)
	}
	rep, err := iys.RecordRefusals(ctx, pool, brand, []iys.Refusal{{Via: iys.ViaTwilioInbound, EventID: "SMhunt1", Kind: "inbound",
		Recipient: addr, Type: "MESAJ", Evidence: "twilio inbound SMhunt1 \"RET\"", At: now}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := iys.Sync(ctx, pool, c); err != nil {
		t.Fatal(err)
	}
	if _, err := iys.Push(ctx, pool, c, iys.PushOptions{}); err != nil {
		t.Fatal(err)
	}
	items, _ := iys.OutboxItems(ctx, pool, time.Now(), 0)
	want := "RET " + now.In(iys.Istanbul()).Format(iys.DateLayout)
	if got := iysStatus(e, addr); got != want {
		t.Fatalf("the person refused through the brand's SMS after a provider's no-consent (refusal report %+v); after a sync and a push İYS holds %q, want %q; %d İYS outbox rows",
			rep, got, want, len(items))
	}
}
