package iys_test

import (
	"context"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/iys"
)

// A provider's suppression (SendGrid dropped a message: "Unsubscribed Address") is a refusal only when
// none of the address is recorded: with no refusal recorded, the refusal's own post was lost, and the
// drop turns the ONAY to RET and queues it for İYS; with one recorded, and a consent given again in İYS
// since, the suppression is the old refusal's, and the new consent stands (nothing is sent to İYS).
func TestASuppressionIsARefusalOnlyWhenNoneIsRecorded(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.New(t)
	ctx := context.Background()
	now := time.Now()
	consentRows(t, pool,
		[6]any{"lost@example.com", "EPOSTA", "BIREYSEL", "654321", "ONAY", now.Add(-48 * time.Hour)},
		[6]any{"again@example.com", "EPOSTA", "BIREYSEL", "654321", "ONAY", now.Add(-72 * time.Hour)},
	)
	// again@ refused by e-mail, then gave consent again in İYS (stored as a newer ONAY).
	old := iys.Refusal{Via: iys.ViaSendGrid, EventID: "sg-unsub-1", Kind: "unsubscribe", Recipient: "again@example.com", Type: "EPOSTA",
		Evidence: "sendgrid unsubscribe", At: now.Add(-48 * time.Hour)}
	if _, err := iys.RecordRefusals(ctx, pool, "654321", []iys.Refusal{old}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE iys_consents SET status = 'ONAY', consent_date = $2 WHERE recipient = $1`,
		"again@example.com", now.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	var outboxBefore int
	pool.QueryRow(ctx, `SELECT count(*) FROM iys_outbox`).Scan(&outboxBefore) //nolint:errcheck

	drop := func(id, addr string) iys.Refusal {
		return iys.Refusal{Via: iys.ViaSendGrid, EventID: id, Kind: "unsubscribe", Recipient: addr, Type: "EPOSTA",
			Evidence: `sendgrid dropped reason="Unsubscribed Address"`, At: now, Suppressed: true}
	}
	rep, err := iys.RecordRefusals(ctx, pool, "654321", []iys.Refusal{drop("sg-drop-1", "lost@example.com"), drop("sg-drop-2", "again@example.com")})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Recorded != 1 || rep.Repeats != 1 || rep.Revoked != 1 || rep.Outboxed != 1 {
		t.Fatalf("report %+v; want the lost refusal recorded (1 revoked, 1 queued) and the old one's suppression a repeat", rep)
	}
	if st := consentStatus(t, pool, "lost@example.com", "EPOSTA", "BIREYSEL", "654321"); st != "RET" {
		t.Errorf("an address SendGrid suppresses with no refusal recorded here: %s, want RET", st)
	}
	if st := consentStatus(t, pool, "again@example.com", "EPOSTA", "BIREYSEL", "654321"); st != "ONAY" {
		t.Errorf("a consent given again after a recorded refusal: %s after the old refusal's suppression, want ONAY", st)
	}
	var outbox int
	pool.QueryRow(ctx, `SELECT count(*) FROM iys_outbox WHERE recipient = 'again@example.com'`).Scan(&outbox) //nolint:errcheck
	if outbox != 1 {
		t.Errorf("again@example.com has %d RETs queued for İYS, want only the first refusal's", outbox)
	}
}
