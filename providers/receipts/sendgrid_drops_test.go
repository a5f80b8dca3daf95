package receipts_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/campaignctl/campaignctl/providers/receipts"
)

// A bounce reason in Turkish (an "İ" in it) that quotes the address in another case than SendGrid's
// email field: Receipt.Error must still hide the address (package doc: "a recipient's e-mail address
// quoted in a bounce reason is masked in Receipt.Error too").
func TestSendGridBounceReasonWithNonASCIIStillMasksAddress(t *testing.T) {
	sg := newSigner(t)
	var sk sink
	h, err := receipts.SendGridHandler(sg.public, &sk, nil)
	if err != nil {
		t.Fatal(err)
	}
	body := `[{"email":"Zeynep.Kaya@Example.com","timestamp":1700000007,"event":"bounce","type":"bounce","sg_event_id":"ev-b1",` +
		`"sg_message_id":"M1.filter-1","reason":"550 5.1.1 <zeynep.kaya@example.com>: İleti reddedildi, alıcı bulunamadı","campaign_id":"42","user_id":"u-3"},` +
		`{"email":"can@example.com","timestamp":1700000009,"event":"dropped","sg_event_id":"ev-d1",` +
		`"sg_message_id":"M1.filter-2","reason":"GEÇERSİZ ALICI CAN@EXAMPLE.COM","campaign_id":"42","user_id":"u-5"}]`
	if code := serve(h, sg.signedRequest(t, []byte(body))); code != http.StatusNoContent {
		t.Fatalf("status %d, want 204", code)
	}
	for _, rc := range sk.all() {
		if strings.Contains(strings.ToLower(rc.Error), rc.Address) {
			t.Errorf("receipt %s: Error %q holds the recipient's address %s unmasked", rc.EventID, rc.Error, rc.Address)
		}
	}
}

// SendGrid drops a message to an address on its unsubscribe or spam-report suppression lists with
// event "dropped" and reason "Unsubscribed Address" / "Spam Reporting Address": SendGrid's word that the
// person refused (the original unsubscribe/spamreport post may have been lost: the endpoint down longer
// than SendGrid's retries). The post is answered 204, but no Refusal reaches the RefusalSink: consent
// stays ONAY, İYS never hears of it, and every later launch plans and "sends" to the person again. Each
// drop becomes a refusal marked Suppressed (recorded only when none of the address is:
// TestASuppressionIsARefusalOnlyWhenNoneIsRecorded), besides its receipt.
func TestSendGridDroppedForSuppressedRefusalIsARefusal(t *testing.T) {
	sg := newSigner(t)
	var sk bothSink
	h, err := receipts.SendGridHandler(sg.public, &sk, nil)
	if err != nil {
		t.Fatal(err)
	}
	body := `[{"email":"ayse@example.com","timestamp":1700000009,"event":"dropped","sg_event_id":"ev-d-unsub",` +
		`"sg_message_id":"M2.filter-1","reason":"Unsubscribed Address","campaign_id":"43","user_id":"u-1"},` +
		`{"email":"mehmet@example.com","timestamp":1700000010,"event":"dropped","sg_event_id":"ev-d-spam",` +
		`"sg_message_id":"M2.filter-2","reason":"Spam Reporting Address","campaign_id":"43","user_id":"u-2"}]`
	if code := serve(h, sg.signedRequest(t, []byte(body))); code != http.StatusNoContent {
		t.Fatalf("status %d, want 204", code)
	}
	got := map[string]bool{}
	for _, rf := range sk.allRefusals() {
		got[rf.Address] = true
		if !rf.Suppressed {
			t.Errorf("the refusal of %s is not marked Suppressed: it would refuse again a consent given after an old refusal", rf.Address)
		}
	}
	if n := len(sk.all()); n != 2 {
		t.Errorf("%d receipts, want the 2 drops recorded as receipts too", n)
	}
	for _, addr := range []string{"ayse@example.com", "mehmet@example.com"} {
		if !got[addr] {
			t.Errorf("dropped (%s suppressed as a refusal) acknowledged 204 but no refusal recorded for it", addr)
		}
	}
}
