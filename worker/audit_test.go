package worker

import (
	"context"
	"testing"
)

// Every send and every block leaves an audit record with the consent it was decided on, the channel and
// the template's hash.
func TestAuditRecordsTheConsentOfEachDecision(t *testing.T) {
	t.Parallel()
	f := plan(t, 4) // eligible u1, u2, u4
	ctx := context.Background()
	if _, err := f.db.Exec(ctx, `UPDATE iys_consents SET status = 'RET', source = 'IYS_MOBIL', transaction_id = 'T-77' WHERE recipient = $1`, phone(2)); err != nil {
		t.Fatal(err)
	}
	f.runAll(t)
	var hash string
	f.db.QueryRow(ctx, `SELECT template_hash FROM campaigns WHERE id = $1`, f.id).Scan(&hash) //nolint:errcheck
	if len(hash) != 64 {
		t.Fatalf("campaign template hash %q", hash)
	}
	for user, want := range map[string][4]string{
		"u1": {"sent", "ONAY", "HS_WEB", ""},
		"u2": {"skipped", "RET", "IYS_MOBIL", "T-77"},
	} {
		var status, ch, cst, src, txn, th string
		var synced bool
		err := f.db.QueryRow(ctx, `SELECT status, channel, consent_status, consent_source, coalesce(consent_txn, ''), template_hash,
				consent_synced_at IS NOT NULL AND consent_date IS NOT NULL
			FROM send_log WHERE campaign_id = $1 AND user_id = $2`, f.id, user).Scan(&status, &ch, &cst, &src, &txn, &th, &synced)
		if err != nil {
			t.Fatalf("%s: %v", user, err)
		}
		if status != want[0] || ch != "sms" || cst != want[1] || src != want[2] || txn != want[3] || th != hash || !synced {
			t.Errorf("%s audit: %s %s consent %s/%s/%s hash %s dated %v; want %v", user, status, ch, cst, src, txn, th, synced, want)
		}
	}
}
