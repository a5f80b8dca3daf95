package campaign_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testdb"
)

// A user_id of blanks is no ID: such rows are excluded as missing_user_id, as a NULL one is, instead of
// sharing one recipient (and its claim and frequency mark) and calling the second a duplicate.
func TestABlankUserIDIsMissing(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	seedAudience(t, db, 3)
	p := &campaign.Planner{Engine: db, Audience: db}
	s := spec("blank-ids")
	s.DryRun = true
	s.AudienceSQL = `SELECT CASE WHEN ord = 1 THEN '' WHEN ord = 2 THEN '   ' ELSE user_id END AS user_id, phone, first_name
		FROM aud WHERE ord IN (1, 2, 4) ORDER BY ord`
	mustExec(t, db, `INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date) VALUES
		('+905321111114', 'MESAJ', 'BIREYSEL', 'ONAY', 'HS_WEB', now())`)
	rep, err := p.Plan(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Eligible != 1 || rep.Excluded[campaign.ReasonMissingUser] != 2 || rep.Excluded[campaign.ReasonDuplicateUser] != 0 {
		t.Fatalf("eligible %d, excluded %v; want u4 eligible and the blank IDs excluded as missing_user_id", rep.Eligible, rep.Excluded)
	}
}

// Two columns of one name, or a column named as a value the engine fills in (the promo code of a campaign
// with a pool, the campaign's name), would print another value than the one the query selected: the
// launch is refused, naming the column and the fix, and nothing is written.
func TestAudienceColumnsAMessageCannotTellApartAreRefused(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	seedAudience(t, db, 10)
	p := &campaign.Planner{Engine: db, Audience: db}
	for _, c := range []struct{ name, sql, says string }{
		{"twice", `SELECT user_id, phone, first_name, phone AS first_name FROM aud`, "two columns named first_name"},
		{"code", `SELECT user_id, phone, first_name, 'X' AS code FROM aud`, "column named code, but {{.code}} is the promo code from pool p"},
		{"campaign", `SELECT user_id, phone, first_name, 'spring' AS campaign FROM aud`, "column named campaign"},
	} {
		s := spec("columns-" + c.name)
		s.AudienceSQL = c.sql
		_, err := p.Plan(context.Background(), s)
		if !errors.Is(err, campaign.ErrInvalid) || !strings.Contains(err.Error(), c.says) || !strings.Contains(err.Error(), "AS other_name") {
			t.Errorf("%s: %v; want a refusal saying %q and how to rename", c.name, err, c.says)
		}
	}
	if n := count(t, db, `SELECT count(*) FROM campaigns`); n != 0 {
		t.Fatalf("%d campaigns written by refused launches", n)
	}
	// Without a pool, a column named code is the message's own value.
	s := spec("own-code")
	s.CodePool, s.DryRun = "", true
	s.AudienceSQL = `SELECT user_id, phone, first_name, 'OWN' || ord AS code FROM aud WHERE ord = 1`
	rep, err := p.Plan(context.Background(), s)
	if err != nil || rep.SampleMessage != "Merhaba Ayşe, kodunuz OWN1" {
		t.Fatalf("a campaign without a pool and the audience's own code column: %+v, %v", rep, err)
	}
}
