package receipts_test

import (
	"log/slog"
	"testing"

	"github.com/campaignctl/campaignctl/providers/receipts"
)

// A refusal event one of whose fields has an unexpected JSON type (an object, an array or a boolean for a
// custom arg or the reason) is still recorded: SendGrid does not post a batch answered 2xx again.
func TestARefusalEventWithAFieldOfAnotherTypeIsRecorded(t *testing.T) {
	cases := map[string]string{
		"campaign_id object": `[{"email":"ayse@example.com","timestamp":1700000300,"event":"unsubscribe","sg_event_id":"ev-1","sg_message_id":"M1.f","campaign_id":{"id":42},"user_id":"u-1"}]`,
		"user_id bool":       `[{"email":"ayse@example.com","timestamp":1700000300,"event":"spamreport","sg_event_id":"ev-2","sg_message_id":"M1.f","campaign_id":"42","user_id":true}]`,
		"reason object":      `[{"email":"ayse@example.com","timestamp":1700000300,"event":"unsubscribe","sg_event_id":"ev-4","sg_message_id":"M1.f","reason":{"x":1},"campaign_id":"42","user_id":"u-1"}]`,
		"asm_group_id array": `[{"email":"ayse@example.com","timestamp":1700000300,"event":"group_unsubscribe","sg_event_id":"ev-3","sg_message_id":"M1.f","asm_group_id":[7],"campaign_id":"42","user_id":"u-1"}]`,
	}
	for name, body := range cases {
		t.Run(name, func(t *testing.T) {
			sg := newSigner(t)
			var sk bothSink
			h, err := receipts.SendGridHandler(sg.public, &sk, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			code := serve(h, sg.signedRequest(t, []byte(body)))
			got := sk.allRefusals()
			if code/100 != 2 || len(got) != 1 {
				t.Fatalf("answered %d (SendGrid will not post again) but recorded %d refusals, want 1 for ayse@example.com; stats %+v",
					code, len(got), h.Stats())
			}
		})
	}
}
