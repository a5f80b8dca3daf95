package campaign_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testdb"
)

// A push whose message is longer than FCM takes (4 KB of title, body and data together) is refused at
// launch, naming the size and the fix, with nothing written; one that fits launches. Before, the dry run and
// the launch took a 7,602-byte message, and every send then failed with FCM's "Message is too big".
func TestAPushTooBigForFCMIsRefusedAtLaunch(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	mustExec(t, db, `CREATE TABLE devices AS SELECT 'u' || i AS user_id, 'tok-' || i AS push_token, true AS push_opt_in, 'Ad' || i AS first_name FROM generate_series(1, 5) i`)
	mustExec(t, db, `GRANT SELECT ON devices TO campaignctl_audience`)
	p := &campaign.Planner{Engine: db, Audience: db}
	pushSpec := func(name, body string) campaign.Spec {
		return campaign.Spec{Name: name, Channel: campaign.ChannelPush, BatchSize: 10,
			AudienceSQL: `SELECT user_id, push_token, push_opt_in, first_name FROM devices`,
			Subject:     `Merhaba {{.first_name}}`, Message: body}
	}
	_, err := p.Plan(ctx, pushSpec("too-big", strings.Repeat("Size özel bir fırsat. ", 300)))
	if !errors.Is(err, campaign.ErrInvalid) || !strings.Contains(err.Error(), "FCM takes at most 4096") {
		t.Fatalf("a push of about 7 KB: %v; want it refused, naming FCM's limit", err)
	}
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM campaigns`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d campaigns written by the refused launch (%v); want none", n, err)
	}
	if _, err := p.Plan(ctx, pushSpec("fits", "Size özel bir fırsat")); err != nil {
		t.Fatalf("a short push: %v", err)
	}
}
