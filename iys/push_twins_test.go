package iys_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/iys"
	"github.com/campaignctl/campaignctl/providers/sandbox"
)

// An address with consents both without a brand (an import without IYS_BRAND_CODE) and under the brand
// (the re-import a launch advises) gets an outbox row for each on a refusal, and both go under the
// client's brand: İYS got the same RET twice (an outside run: 231 refusals, 460 adds). The change goes
// once now, one request or one batch item, and both rows take its answer.
func TestARefusalWaitingWithAndWithoutTheBrandReachesIYSOnce(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch %v", batch), func(t *testing.T) {
			const addr = "+905324444481"
			e, pool, brand, base, c := onayOnBothSides(t, addr)
			consentRows(t, pool, [6]any{addr, "MESAJ", "BIREYSEL", "", "ONAY", base.Add(-48 * time.Hour)})
			ctx := context.Background()
			rep, err := iys.RecordRefusals(ctx, pool, brand, []iys.Refusal{{Via: iys.ViaTwilioInbound, EventID: "SM81", Kind: "inbound",
				Recipient: addr, Type: "MESAJ", Evidence: "RET", At: base}})
			if err != nil {
				t.Fatal(err)
			}
			var rows int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM iys_outbox WHERE recipient = $1`, addr).Scan(&rows); err != nil || rows != 2 {
				t.Fatalf("refusal %+v: %d outbox rows (%v); want one for each brand, which this tests", rep, rows, err)
			}
			opts := iys.PushOptions{}
			if batch {
				opts = iys.PushOptions{BatchFrom: 1, ResultAfter: time.Millisecond, Wait: 10 * time.Second, PollEvery: 50 * time.Millisecond}
			}
			if _, err := iys.Push(ctx, pool, c, opts); err != nil {
				t.Fatal(err)
			}
			if st := e.s.IYSStats(); st.AddsReceived != 1 {
				t.Fatalf("İYS received %d adds (accepted for the key: %d); want the refusal once", st.AddsReceived, st.AddsAcceptedByKey[sandbox.IYSAddKey(addr, "MESAJ", "BIREYSEL")])
			}
			got := map[string]int{}
			r, err := pool.Query(ctx, `SELECT state FROM iys_outbox WHERE recipient = $1`, addr)
			if err != nil {
				t.Fatal(err)
			}
			for r.Next() {
				var s string
				if err := r.Scan(&s); err != nil {
					t.Fatal(err)
				}
				got[s]++
			}
			if got[iys.OutboxAccepted] != 2 {
				t.Fatalf("outbox rows by state %v; want both accepted", got)
			}
		})
	}
}
