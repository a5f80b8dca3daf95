package campaign_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/codes"
	"github.com/campaignctl/campaignctl/internal/testdb"
)

// A launch refuses an SMS longer than --max-segments whichever recipient's it is, as its dry run does, not
// only the first message's: nothing is written and no code is reserved. A plain message is checked by a
// bound in SQL and only the rows over it are rendered; a message with conditions renders every row; a row
// over the bound whose message still fits goes out. (Mutations: checking only the first message, as
// before, lets the long message's launch through; refusing every row over the bound without rendering it
// refuses the fitting one; a bound without the field's bytes lets the long value through.)
func TestALaunchRefusesAnyMessageLongerThanMaxSegments(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	seedAudience(t, db, 2) // eligible: u1 (Ayşe, the first message) and u2
	ctx := context.Background()
	p := &campaign.Planner{Engine: db, Audience: db}
	launch := func(name, message, u2 string) (campaign.Report, error) {
		t.Helper()
		mustExec(t, db, `UPDATE aud SET first_name = $1 WHERE user_id = 'u2'`, u2)
		s := spec(name)
		s.Message, s.MaxSegments = message, 1
		return p.Plan(ctx, s)
	}
	plain := `Merhaba {{.first_name}}, kodunuz {{.code}}`
	branching := `Merhaba {{if .first_name}}{{.first_name}}{{else}}dostum{{end}}, kodunuz {{.code}}`
	for _, tc := range []struct{ name, message string }{{"plain", plain}, {"with a condition", branching}} {
		// 80 dotless i: UCS-2, two segments, for u2 only.
		_, err := launch("long "+tc.name, tc.message, strings.Repeat("ı", 80))
		if !errors.Is(err, campaign.ErrInvalid) {
			t.Fatalf("%s: a launch with u2's message over --max-segments 1: err %v, want it refused", tc.name, err)
		}
		for _, want := range []string{"1 message is too long", "user u2", "2 SMS segments", "--max-segments 1", "nothing was written"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: error %q does not say %q", tc.name, err, want)
			}
		}
	}
	if n := count(t, db, `SELECT count(*) FROM campaigns`); n != 0 {
		t.Fatalf("refused launches left %d campaigns", n)
	}
	if n, err := codes.Free(ctx, db, "p"); err != nil || n != 2 {
		t.Fatalf("refused launches reserved codes: %d free (%v), want 2", n, err)
	}
	// 60 Ö: 146 bytes, over the bound of one segment (70 bytes), but GSM-7 and one segment all the same.
	rep, err := launch("fits", plain, strings.Repeat("Ö", 60))
	if err != nil {
		t.Fatalf("a launch whose every message takes one segment was refused: %v", err)
	}
	if rep.Eligible != 2 || rep.ID == 0 {
		t.Fatalf("report %+v, want both recipients planned", rep)
	}
	// A message with no field at all is plain too: its bound is its text alone.
	s := spec("no field")
	s.Message, s.CodePool, s.MaxSegments = "Merhaba, bu hafta her şey yarı fiyatına", "", 1
	if _, err := p.Plan(ctx, s); err != nil {
		t.Fatalf("a launch of a message with no field: %v", err)
	}
}

// A message that renders blank (its values empty or white space) is refused by the launch and its dry run,
// naming the row, as a long one is: Twilio refused the empty one (21602) and delivered the blank ones. A
// plain message's blank rows are found by the bound in SQL, a message with conditions by rendering.
func TestALaunchRefusesABlankSMS(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	seedAudience(t, db, 0) // eligible: u1 (Ayşe, the first message) and u2
	ctx := context.Background()
	p := &campaign.Planner{Engine: db, Audience: db}
	for _, tc := range []struct{ name, message string }{
		{"plain", `{{.first_name}}`},
		{"with a condition", `{{if .first_name}}{{.first_name}}{{end}}`},
	} {
		for _, dry := range []bool{false, true} {
			// A CRM export's no-break space, an ideographic space, a line separator, a zero-width space.
			for _, value := range []string{"", "   ", "\n", "\u00a0", "\r\u3000", "\u2028\v\f", "\u200b\ufeff"} {
				mustExec(t, db, `UPDATE aud SET first_name = $1 WHERE user_id = 'u2'`, value)
				s := spec("blank")
				s.Message, s.CodePool, s.Transactional, s.DryRun = tc.message, "", true, dry
				_, err := p.Plan(ctx, s)
				if !errors.Is(err, campaign.ErrInvalid) || !strings.Contains(err.Error(), "1 message is blank") || !strings.Contains(err.Error(), "user u2") {
					t.Errorf("%s, dry run %v, u2's value %q: err %v; want the launch refused naming u2's blank message", tc.name, dry, value, err)
				}
			}
		}
	}
	if n := count(t, db, `SELECT count(*) FROM campaigns`); n != 0 {
		t.Fatalf("refused launches left %d campaigns", n)
	}
	if err := campaign.CheckSMSLength(" \t", 10); err == nil {
		t.Error("CheckSMSLength passes a blank body (the worker's check at send time)")
	}
}

// The dry run warns of long messages whichever recipient's they are: it warned only when the first
// message was long.
func TestADryRunWarnsOfTheLongestMessage(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	seedAudience(t, db, 2)
	mustExec(t, db, `UPDATE aud SET first_name = $1 WHERE user_id = 'u2'`, strings.Repeat("ı", 300))
	s := spec("long")
	s.DryRun = true
	rep, err := (&campaign.Planner{Engine: db, Audience: db}).Plan(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	if rep.SegmentsPerMessage != 1 || len(rep.Warnings) != 1 || !strings.Contains(rep.Warnings[0], "1 message takes more than 3 SMS segments, the longest 5 (user u2)") {
		t.Errorf("first message %d segments, warnings %q; want one naming u2's message of 5 segments", rep.SegmentsPerMessage, rep.Warnings)
	}
}
