package campaign_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"testing"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testdb"
)

// The example SELECT that a refused audience's error gives (a missing address or opt-in column) is a query
// the launch takes, on every channel: run as given, on a table with the columns it names, it is not refused
// for its columns. For the webhook channel, whose address is the user, it named user_id twice and was refused
// for that.
func TestTheExampleOfAMissingColumnIsAnAudienceThatWorks(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	mustExec(t, db, `CREATE TABLE aud (id text, gsm text, mail text, device_token text, notify boolean, first_name text)`)
	mustExec(t, db, `GRANT SELECT ON aud TO campaignctl_audience`)
	mustExec(t, db, `INSERT INTO aud VALUES ('u1', '+905321234567', 'a@example.com', 'tok-1234567890abcdef', true, 'Ayşe')`)
	example := regexp.MustCompile("e\\.g\\. `(SELECT [^`]*)\\.\\.\\.`")
	p := &campaign.Planner{Engine: db, Audience: db}
	for i, ch := range campaign.Channels() {
		// What each refusal's example is given for: only user_id, then user_id and the address without
		// the opt-in (on the channels that need one).
		bad := []string{`SELECT id AS user_id, first_name FROM aud`}
		if ch.OptInColumn != "" {
			bad = append(bad, fmt.Sprintf(`SELECT id AS user_id, %s first_name FROM aud`, addressOf(ch)))
		}
		for j, sql := range bad {
			s := campaign.Spec{Name: fmt.Sprintf("ex-%d-%d", i, j), Channel: ch.Name, AudienceSQL: sql, Transactional: true,
				Message: `Merhaba {{.first_name}}`, Subject: "Merhaba", DryRun: true}
			_, err := p.Plan(ctx, s)
			m := example.FindStringSubmatch(fmt.Sprint(err))
			if !errors.Is(err, campaign.ErrInvalid) || m == nil {
				t.Fatalf("%s, %s: %v; want a refusal with an example SELECT", ch.Name, sql, err)
			}
			s.AudienceSQL = m[1] + "first_name FROM aud"
			if _, err := p.Plan(ctx, s); err != nil {
				t.Errorf("%s: the example %q of the refusal %q is refused itself: %v", ch.Name, s.AudienceSQL, sql, err)
			}
		}
	}
}

// addressOf is the audience's address column for ch as the table above has it, with a trailing ", ";
// nothing for a channel that addresses the user.
func addressOf(ch campaign.ChannelSpec) string {
	switch ch.AddressColumn {
	case "phone":
		return "gsm AS phone, "
	case "email":
		return "mail AS email, "
	case "user_id":
		return ""
	}
	return "device_token AS " + ch.AddressColumn + ", "
}
