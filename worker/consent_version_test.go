package worker

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/campaign"
)

// While no consent has changed since the launch, a lease takes the consents the launch planned on and
// reads none from iys_consents. Seen from outside only when a consent changes behind the version's back
// (its trigger disabled, which takes a superuser): the send goes out on the planned consent, and the audit
// says which consent that was.
func TestLeaseTakesThePlannedConsentsWhileNoneChanged(t *testing.T) {
	t.Parallel()
	f := plan(t, 4) // eligible u1, u2, u4
	ctx := context.Background()
	var planned, now int64
	if err := f.db.QueryRow(ctx, `SELECT consent_version, (SELECT version FROM iys_consents_version) FROM campaigns WHERE id = $1`, f.id).Scan(&planned, &now); err != nil {
		t.Fatal(err)
	}
	if planned != now {
		t.Fatalf("campaign planned on consent version %d, the version is %d with nothing written since", planned, now)
	}
	for _, sql := range []string{
		`ALTER TABLE iys_consents DISABLE TRIGGER iys_consents_changed`,
		`UPDATE iys_consents SET status = 'RET', source = 'IYS_MOBIL' WHERE recipient = '` + phone(2) + `'`,
		`ALTER TABLE iys_consents ENABLE TRIGGER iys_consents_changed`,
	} {
		if _, err := f.db.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	f.runAll(t)
	if n := len(f.provider.accepted[phone(2)]); n != 1 {
		t.Fatalf("u2: %d messages; the lease read the consent it was to take from the plan", n)
	}
	var cst, src string
	if err := f.db.QueryRow(ctx, `SELECT consent_status, consent_source FROM send_log WHERE campaign_id = $1 AND user_id = 'u2'`, f.id).Scan(&cst, &src); err != nil {
		t.Fatal(err)
	}
	if cst != "ONAY" || src != "HS_WEB" {
		t.Fatalf("u2's audit: consent %s/%s, want the planned ONAY/HS_WEB", cst, src)
	}
}

// Any write to the consents after the launch makes the leases read every consent again: a consent deleted
// since (no record: no consent) blocks the send as a revocation does, and the others still go out with
// their consent as read now.
func TestConsentDeletedAfterLaunchBlocksTheSend(t *testing.T) {
	t.Parallel()
	f := plan(t, 4) // eligible u1, u2, u4
	ctx := context.Background()
	if _, err := f.db.Exec(ctx, `DELETE FROM iys_consents WHERE recipient = $1`, phone(4)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.db.Exec(ctx, `UPDATE iys_consents SET source = 'IYS_WEB' WHERE recipient = $1`, phone(1)); err != nil {
		t.Fatal(err)
	}
	f.runAll(t)
	if n := len(f.provider.accepted[phone(4)]); n != 0 {
		t.Fatalf("u4's consent was deleted after the launch but u4 got %d messages", n)
	}
	if st, reason, _ := f.status(t, "u4"); st != "skipped" || reason != "revoked" {
		t.Fatalf("u4: %s/%s, want skipped/revoked", st, reason)
	}
	var src string
	if err := f.db.QueryRow(ctx, `SELECT consent_source FROM send_log WHERE campaign_id = $1 AND user_id = 'u1' AND status = 'sent'`, f.id).Scan(&src); err != nil {
		t.Fatal(err)
	}
	if src != "IYS_WEB" {
		t.Fatalf("u1's audit: consent source %s, want IYS_WEB as read at send time", src)
	}
}

// A RET written while the launch runs and committed after it (the launch reads the consent before it, as
// it was) still blocks the send: the writer's version moves only when it commits, so it is not the
// version the campaign kept, and the lease reads the consents again.
func TestConsentRevokedDuringTheLaunchBlocksTheSend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := planAround(t, 4, nil, func(db *pgxpool.Pool, launch func()) {
		tx, err := db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // committed below
		if _, err := tx.Exec(ctx, `UPDATE iys_consents SET status = 'RET' WHERE recipient = $1`, phone(2)); err != nil {
			t.Fatal(err)
		}
		launch()
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	})
	if st, _, _ := f.status(t, "u2"); st != "pending" {
		t.Fatalf("u2 is %s after the launch; the launch should have planned it on the consent it read", st)
	}
	f.runAll(t)
	if n := len(f.provider.accepted[phone(2)]); n != 0 {
		t.Fatalf("u2 revoked consent during the launch but got %d messages", n)
	}
	if st, reason, _ := f.status(t, "u2"); st != "skipped" || reason != "revoked" {
		t.Fatalf("u2: %s/%s, want skipped/revoked", st, reason)
	}
}

// A RET recorded under a brand after the launch of a campaign of no brand (iys sync records its brand;
// the campaign reads the consents recorded without one) stops its send all the same; a brand's ONAY
// changes nothing. The launch refuses to go ahead when such a RET is there already (brandGate).
func TestARefusalUnderABrandStopsASendOfNoBrand(t *testing.T) {
	t.Parallel()
	f := plan(t, 8) // eligible: u1, u2, u4, u7, u8 (consents without a brand)
	ctx := context.Background()
	if _, err := f.db.Exec(ctx, `INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date, brand_code) VALUES
		($1, 'MESAJ', 'BIREYSEL', 'RET', 'IYS_MOBIL', now(), '654321'), ($2, 'MESAJ', 'BIREYSEL', 'ONAY', 'HS_WEB', now(), '654321')`, phone(1), phone(2)); err != nil {
		t.Fatal(err)
	}
	f.runAll(t)
	if st, reason, _ := f.status(t, "u1"); st != campaign.StatusSkipped || reason != campaign.ReasonRevoked {
		t.Fatalf("u1, refused under a brand after the launch, is %s (%s); want skipped (%s)", st, reason, campaign.ReasonRevoked)
	}
	if n := len(f.provider.accepted[phone(1)]); n != 0 {
		t.Fatalf("u1 got %d messages", n)
	}
	for _, u := range []int{2, 4, 7, 8} {
		if n := len(f.provider.accepted[phone(u)]); n != 1 {
			t.Errorf("u%d got %d messages, want 1", u, n)
		}
	}
}
