package worker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/faults"
	"github.com/campaignctl/campaignctl/iys"
)

// The consents of a chunk are read with its lease. u1's claim stalls 2.5 s on Redis; meanwhile u4 replies
// STOP. After the claim u1's consent is more than a second old and is read again, u1's alone: that must
// not make the rest of the chunk's consents fresh. u4's, read 2.5 s before its STOP, must be read again
// before it is sent. One send at a time, and windows of 2.
func TestAReReadOfTheSendsJustClaimedLeavesTheRestOfTheChunkStale(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		claim  string
		window int
	}{{"ClaimSend", 1}, {"ClaimWindow", 2}} {
		t.Run(fmt.Sprintf("window %d", tc.window), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := plan(t, 8) // eligible in batch 0: u1 u2 u4 u7 u8, one chunk
			h, fr, _ := f.faulty(t, func(c *Config) { c.SendWindow = tc.window })
			stall := fr.Add(&faults.Rule{Match: faults.Method(tc.claim), Times: 1, Kind: faults.Stall, Delay: 2500 * time.Millisecond})
			stopped := make(chan time.Time, 1)
			go func() {
				// u4 replies STOP while the first claim is stalled.
				waitUntil(t, 5*time.Second, "the first claim stalled", func() bool { return stall.Hits() > 0 })
				time.Sleep(300 * time.Millisecond)
				rep, err := iys.RecordRefusals(ctx, f.db, "", []iys.Refusal{{Via: iys.ViaTwilioInbound, EventID: "SMstop-u4",
					Kind: "inbound", Recipient: phone(4), Type: "MESAJ", At: time.Now(), Evidence: "STOP"}})
				if err != nil || rep.Revoked != 1 {
					t.Errorf("refusal: %+v %v", rep, err)
				}
				stopped <- time.Now()
			}()
			if err := h.RunBatch(ctx, f.id, 0); err != nil {
				t.Fatal(err)
			}
			var stopAt time.Time
			select {
			case stopAt = <-stopped:
			case <-time.After(5 * time.Second):
			}
			if stall.Hits() != 1 || stopAt.IsZero() {
				t.Fatal("the claim never stalled / no STOP: this tests nothing")
			}
			if n := len(f.provider.sentTo(phone(4))); n != 0 {
				t.Errorf("u4 replied STOP at %s and got %d messages after it (the run re-read only u1's consent)", stopAt.Format("15:04:05.000"), n)
			}
			if st, reason, _ := f.status(t, "u4"); st != campaign.StatusSkipped {
				t.Errorf("u4 is %s (%s), want skipped (revoked)", st, reason)
			}
		})
	}
}
