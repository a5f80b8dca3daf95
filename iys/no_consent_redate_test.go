package iys_test

import (
	"context"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/iys"
)

// Order: u1's ONAY (T0) is stored. Campaign A (Twilio) is refused for u1 at creation with 21610 at T1;
// its write waits in the background (an import holds the consents' turn). Campaign B (Netgsm, the same
// brand) is refused for u1 with code 50 at T3 > T1 (İYS holds none: the person gave RET in İYS at T2,
// not pulled yet); its write lands first: RET here, dated T3. Then A's refusal lands: RecordRefusals turns
// the provider's RET whatever its date, and re-dates it to T1, before the provider's word. A pull of the
// brand's own source (HS) then brings an ONAY the person gave at T1.5 (before the RET of T2, which comes
// with the citizens' pull, later): it is newer than T1, so it wins, and the consent is ONAY again here
// although İYS said at T3 that it holds none. Without the refusal the provider's RET (T3) would have
// held against that ONAY: the person's refusal made them sendable again.
func TestARefusalOlderThanAProvidersRETDoesNotLetAnOlderONAYBack(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.New(t)
	ctx := context.Background()
	const brand, addr = "654321", "+905321111171"
	now := time.Now().Truncate(time.Second)
	t0, t1, t15, t3 := now.Add(-48*time.Hour), now.Add(-3*time.Hour), now.Add(-2*time.Hour), now.Add(-time.Hour)
	consentRows(t, pool, [6]any{addr, "MESAJ", "BIREYSEL", brand, "ONAY", t0})

	if n, err := iys.RecordNoConsent(ctx, pool, brand, []iys.NoConsent{{Recipient: addr, Type: "MESAJ", RecipientType: "BIREYSEL",
		Source: "netgsm 50", At: t3}}); err != nil || n != 1 {
		t.Fatalf("Netgsm 50: %d turned, %v", n, err)
	}
	if _, err := iys.RecordRefusals(ctx, pool, brand, []iys.Refusal{{Via: iys.ViaTwilioInbound, EventID: "create:7:u1:opted_out",
		Kind: "opted_out", Recipient: addr, Type: "MESAJ", CampaignID: 7, UserID: "u1", Evidence: "twilio 21610", At: t1}}); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := iys.ApplyChanges(ctx, tx, brand, []iys.Record{{Recipient: addr, Type: "MESAJ", RecipientType: "BIREYSEL",
		Status: "ONAY", Source: "HS_WEB", ConsentDate: t15}}, iys.OriginPull); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var st, src string
	var date time.Time
	if err := pool.QueryRow(ctx, `SELECT status, source, consent_date FROM iys_consents WHERE recipient = $1 AND brand_code = $2`, addr, brand).
		Scan(&st, &src, &date); err != nil {
		t.Fatal(err)
	}
	if st != "RET" {
		t.Fatalf("provider's RET at %s, then a refusal dated %s (before it), then a pulled ONAY dated %s (between): consent %s (%s, %s); want RET: the provider's word is newer than that ONAY",
			t3.Format(time.TimeOnly), t1.Format(time.TimeOnly), t15.Format(time.TimeOnly), st, src, date.Format(time.TimeOnly))
	}
}
