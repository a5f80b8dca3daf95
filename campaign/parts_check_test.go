package campaign_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testdb"
)

// countCampaigns is how many campaigns the database holds.
func countCampaigns(t *testing.T, p *campaign.Planner) int {
	t.Helper()
	var n int
	if err := p.Engine.QueryRow(context.Background(), `SELECT count(*) FROM campaigns`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Every push is held to FCM's 4 KB at launch, not the first only: before, a launch whose first message
// fitted took recipients whose own values (a long name printed three times, a data_ column of 4.5 KB) made
// theirs too big, and each of those sends failed with FCM's "Message is too big". The launch and its dry
// run refuse, naming how many and the first, with nothing written; a message near the limit that fits is
// not refused, whether the template is plain (a bound in SQL clears most rows) or not (every row rendered).
func TestEveryPushIsCheckedForFCMsSizeAtLaunch(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	mustExec(t, db, `CREATE TABLE devices AS
		SELECT 'u' || i AS user_id, 'tok-' || i AS push_token, true AS push_opt_in, 'Ad' || i AS first_name, ''::text AS data_link
		FROM generate_series(1, 8) i`)
	// u5's name, printed three times, and u7's data_ column make theirs too big; u3's data_ column leaves
	// its message just under the limit.
	mustExec(t, db, `UPDATE devices SET first_name = repeat('ş', 700) WHERE user_id = 'u5'`)
	mustExec(t, db, `UPDATE devices SET data_link = repeat('x', 4500) WHERE user_id = 'u7'`)
	mustExec(t, db, `UPDATE devices SET data_link = repeat('x', 3700) WHERE user_id = 'u3'`)
	mustExec(t, db, `GRANT SELECT ON devices TO campaignctl_audience`)
	p := &campaign.Planner{Engine: db, Audience: db}
	spec := func(name, body, where string, dry bool) campaign.Spec {
		return campaign.Spec{Name: name, Channel: campaign.ChannelPush, BatchSize: 10, DryRun: dry,
			AudienceSQL: `SELECT user_id, push_token, push_opt_in, first_name, data_link FROM devices` + where,
			Subject:     `Merhaba`, Message: body}
	}
	for i, body := range []string{
		`{{.first_name}} {{.first_name}} {{.first_name}}: size özel`,
		`{{if .first_name}}{{.first_name}} {{.first_name}} {{.first_name}}{{end}}: size özel`,
	} {
		before := countCampaigns(t, p)
		for _, dry := range []bool{true, false} {
			_, err := p.Plan(ctx, spec("big", body, "", dry))
			if !errors.Is(err, campaign.ErrInvalid) || !strings.Contains(err.Error(), "2 push messages are too big: FCM takes at most 4096") ||
				!strings.Contains(err.Error(), "shorten") {
				t.Fatalf("%q (dry run %v): %v; want 2 messages refused, with the fix", body, dry, err)
			}
			if n := countCampaigns(t, p); n != before {
				t.Fatalf("%d campaigns written by a refused launch; want none", n-before)
			}
		}
		// Without the two, the rest (u3's near the limit) launch.
		rep, err := p.Plan(ctx, spec(fmt.Sprint("fits-", i), body, ` WHERE user_id NOT IN ('u5', 'u7')`, false))
		if err != nil || rep.Eligible != 6 {
			t.Fatalf("%q without the two: %v (%d eligible); want 6 launched", body, err, rep.Eligible)
		}
	}
}

// An e-mail subject that renders blank for some recipients is refused at launch, as SendGrid refuses such
// an e-mail: before, the launch took `--subject '{{.first_name}}'` with empty names, and those sends
// failed one by one. A subject with text of its own, or a fallback, launches; a subject that is not plain
// is rendered for every row. Blank is one rule either way, and the SMS's: white space of any kind, a name
// of U+00A0 too (SendGrid takes it, and the subject shows as nothing); before, it counted as blank only
// when the subject was rendered.
func TestAnEmailSubjectThatRendersBlankIsRefusedAtLaunch(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	mustExec(t, db, `CREATE TABLE people (user_id text, email text, first_name text, vip bool)`)
	mustExec(t, db, `GRANT SELECT ON people TO campaignctl_audience`)
	mustExec(t, db, `INSERT INTO people VALUES ('a', 'a@example.com', 'Ayşe', true), ('b', 'b@example.com', '', true),
		('c', 'c@example.com', '  ', true), ('d', 'd@example.com', 'Deniz', false), ('e', 'e@example.com', 'Ece', true),
		('f', 'f@example.com', E'\u00a0', true)`)
	p := &campaign.Planner{Engine: db, Audience: db}
	plan := func(name, subject string, dry bool) (campaign.Report, error) {
		return p.Plan(ctx, campaign.Spec{Name: name, Channel: campaign.ChannelEmail, BatchSize: 10, Transactional: true, DryRun: dry,
			Subject: subject, Message: "Merhaba", AudienceSQL: `SELECT user_id, email, first_name, vip FROM people`})
	}
	for _, tc := range []struct{ subject, want string }{
		{`{{.first_name}}`, "3 e-mail subjects render blank"},
		{` {{.first_name}}{{.first_name}} `, "3 e-mail subjects render blank"},
		{`{{if .vip}}{{.first_name}}{{end}}`, "4 e-mail subjects render blank"},
		{`{{or .first_name "Merhaba"}}`, "2 e-mail subjects render blank (user c's subject is \"  \")"},
	} {
		for _, dry := range []bool{true, false} {
			_, err := plan("blank", tc.subject, dry)
			if !errors.Is(err, campaign.ErrInvalid) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "fallback") {
				t.Fatalf("subject %q (dry run %v): %v; want %q, with the fix", tc.subject, dry, err, tc.want)
			}
			if n := countCampaigns(t, p); n != 0 {
				t.Fatalf("%d campaigns written by a refused launch; want none", n)
			}
		}
	}
	for i, subject := range []string{`Merhaba {{.first_name}}`, `{{.first_name}} için`, `{{.user_id}}{{.first_name}}`, `{{if .vip}}{{.first_name}}{{else}}Merhaba{{end}}.`} {
		if rep, err := plan(fmt.Sprint("fine", i), subject, false); err != nil || rep.Eligible != 6 {
			t.Fatalf("subject %q: %v; want all 6 launched", subject, err)
		}
	}
}
