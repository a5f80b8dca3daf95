package campaign_test

import (
	"context"
	"math"
	"testing"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testdb"
)

// A launch's rate and ETA under a provider cap counted in segments are about what its dry run says: the dry
// run counts every message's segments, the launch takes the mean of a sample of them. Before, the launch
// took the first message's count for every message and said 50 msg/s where its dry run said 73.
func TestALaunchAndItsDryRunGiveTheSameRate(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	mustExec(t, db, `CREATE TABLE aud (ord int, user_id text, phone text, first_name text)`)
	mustExec(t, db, `GRANT SELECT ON aud TO campaignctl_audience`)
	// The first recipient's message is one GSM segment; one in three of the others needs UCS-2 (ş), and
	// with the rest of the text two segments.
	mustExec(t, db, `INSERT INTO aud SELECT i, 'u' || lpad(i::text, 4, '0'), '+90532' || lpad(i::text, 7, '0'),
		CASE WHEN i % 3 = 0 THEN 'Ayşe' ELSE 'Ayse' END FROM generate_series(1, 600) i`)
	mustExec(t, db, `INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date)
		SELECT phone, 'MESAJ', 'BIREYSEL', 'ONAY', 'HS_WEB', now() FROM aud`)
	p := &campaign.Planner{Engine: db, Audience: db}
	s := campaign.Spec{Name: "eta", Channel: campaign.ChannelSMS, Transactional: true,
		AudienceSQL:  `SELECT user_id, phone, first_name FROM aud ORDER BY ord`,
		Message:      `Merhaba {{.first_name}}, siparisiniz yola cikti; kargo takip numaraniz mesajin sonunda, iyi gunler dileriz. 1234567890`,
		ProviderRate: 100, ProviderCountsSegments: true, DryRun: true}
	dry, err := p.Plan(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if dry.SegmentsPerMessage != 1 || dry.TotalSegments != 800 {
		t.Fatalf("dry run: first message %d segments, %d in all; want 1 and 800 (the case needs a mixed audience)", dry.SegmentsPerMessage, dry.TotalSegments)
	}
	s.DryRun = false
	rep, err := p.Plan(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(rep.Rate-dry.Rate) > dry.Rate/20 || math.Abs(rep.ETASeconds-dry.ETASeconds) > dry.ETASeconds/20 {
		t.Fatalf("launch: %.1f msg/s, ETA %.0f s; its dry run %.1f msg/s, ETA %.0f s: want them within 5 %%", rep.Rate, rep.ETASeconds, dry.Rate, dry.ETASeconds)
	}
}
