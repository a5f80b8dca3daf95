package worker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/providers"
)

// The audit of a send records the consent it was decided on, not one read after the message went. u1 is
// sent first; then u1 refuses (its RET arrives after its message), and the next send is refused with a
// 429 asking for 2 s, so the chunk's consents are read again before the rest go: that read sees u1's RET
// (u1 is still in the chunk in hand, its outcome not yet written). u1's audit row must still say ONAY:
// the message went under it. Before, the outcome took the chunk's latest reading when it was written, and
// the audit said a message went out on a RET.
func TestTheAuditOfASendKeepsTheConsentItWasSentOn(t *testing.T) {
	t.Parallel()
	for _, window := range []int{1, 2} {
		t.Run(fmt.Sprintf("window %d", window), func(t *testing.T) {
			t.Parallel()
			f := planWith(t, 8, nil) // eligible: u1, u2, u4, u7, u8, one chunk
			h, _, _ := f.faulty(t, func(c *Config) { c.SendWindow = window })
			refuseAt := window + 1 // the first send of the second window
			f.provider.fail = func(call int, _ providers.Message) error {
				if call == refuseAt {
					if _, err := f.db.Exec(context.Background(), `UPDATE iys_consents SET status = 'RET', source = 'IYS_MOBIL', transaction_id = 'T-9' WHERE recipient = $1`, phone(1)); err != nil {
						t.Error(err)
					}
					return &providers.Error{Provider: "test", Status: 429, Throttled: true, RetryAfter: 2 * time.Second, Class: providers.Transient}
				}
				return nil
			}
			start := time.Now()
			if err := h.RunBatch(context.Background(), f.id, 0); err != nil {
				t.Fatal(err)
			}
			if waited := time.Since(start); waited < 2*time.Second {
				t.Fatalf("the batch took %v: the consents were not read again, so this tests nothing", waited)
			}
			if n := len(f.provider.accepted[phone(1)]); n != 1 {
				t.Fatalf("u1 got %d messages, want 1 (sent before its refusal)", n)
			}
			var status, consent, txn string
			if err := f.db.QueryRow(context.Background(), `SELECT status, consent_status, coalesce(consent_txn, '') FROM send_log
				WHERE campaign_id = $1 AND user_id = 'u1'`, f.id).Scan(&status, &consent, &txn); err != nil {
				t.Fatal(err)
			}
			if status != "sent" || consent != "ONAY" || txn == "T-9" {
				t.Fatalf("u1's audit: %s on consent %s (transaction %q); want sent on ONAY, the consent its message went under", status, consent, txn)
			}
		})
	}
}
