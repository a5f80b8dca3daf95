package campaign_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/codes"
	"github.com/campaignctl/campaignctl/internal/testdb"
)

// seedAudience builds a hand-computed audience: 10 rows, 2 eligible, every exclusion reason once
// (no_consent three times: no row, TACIR only, EPOSTA only).
func seedAudience(t *testing.T, db *pgxpool.Pool, codes int) {
	t.Helper()
	ctx := context.Background()
	mustExec(t, db, `CREATE TABLE aud (ord int, user_id text, phone text, first_name text)`)
	mustExec(t, db, `GRANT SELECT ON aud TO campaignctl_audience`)
	mustExec(t, db, `INSERT INTO aud VALUES
		(1, 'u1', '+905321111111', 'Ayşe'),
		(2, 'u2', '05321111112', 'Ali'),
		(3, 'u3', '+905321111113', 'Can'),
		(4, 'u4', '+905321111114', 'Deniz'),
		(5, 'u5', '12345', 'Ece'),
		(6, 'u1', '+905329999999', 'Ayşe'),
		(7, 'u6', '0532 111 11 11', 'Fatma'),
		(8, NULL, '+905321111118', 'Gül'),
		(9, 'u7', '+905321111117', 'Hakan'),
		(10, 'u8', '+905321111119', 'İpek')`)
	mustExec(t, db, `INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date) VALUES
		('+905321111111', 'MESAJ', 'BIREYSEL', 'ONAY', 'HS_WEB', now()),
		('+905321111112', 'MESAJ', 'BIREYSEL', 'ONAY', 'HS_WEB', now()),
		('+905321111113', 'MESAJ', 'BIREYSEL', 'RET', 'IYS_KISAMESAJ', now()),
		('+905321111117', 'MESAJ', 'TACIR', 'ONAY', 'HS_WEB', now()),
		('+905321111119', 'EPOSTA', 'BIREYSEL', 'ONAY', 'HS_WEB', now()),
		('+905321111118', 'MESAJ', 'BIREYSEL', 'ONAY', 'HS_WEB', now())`)
	mustExec(t, db, `INSERT INTO code_pools (name) VALUES ('p')`)
	for i := 0; i < codes; i++ {
		if _, err := db.Exec(ctx, `INSERT INTO promo_codes (pool, code) VALUES ('p', 'CODE' || $1::int)`, i); err != nil {
			t.Fatal(err)
		}
	}
}

func mustExec(t *testing.T, db *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := db.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func spec(name string) campaign.Spec {
	return campaign.Spec{
		Name: name, Channel: campaign.ChannelSMS, CodePool: "p",
		AudienceSQL: `SELECT user_id, phone, first_name FROM aud ORDER BY ord`,
		Message:     `Merhaba {{.first_name}}, kodunuz {{.code}}`,
		BatchSize:   1, ProviderRate: 2,
	}
}

func count(t *testing.T, db *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func TestPlanExclusionsAgainstHandComputedAudience(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	seedAudience(t, db, 3)
	p := &campaign.Planner{Engine: db, Audience: db}

	s := spec("summer")
	s.CountSegments = true
	rep, err := p.Plan(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	wantExcluded := map[string]int64{
		campaign.ReasonDuplicateUser:    1,
		campaign.ReasonInvalidAddress:   1,
		campaign.ReasonDuplicateAddress: 1,
		campaign.ReasonMissingUser:      1,
		campaign.ReasonConsentRET:       1,
		campaign.ReasonNoConsent:        3,
	}
	if diff := cmp.Diff(wantExcluded, rep.Excluded); diff != "" {
		t.Errorf("excluded (-want +got):\n%s", diff)
	}
	if rep.Audience != 10 || rep.Eligible != 2 || rep.Batches != 2 || rep.CodesNeeded != 2 || rep.CodesFree != 3 {
		t.Errorf("report = %+v; want audience 10, eligible 2, batches 2, codes 2 of 3", rep)
	}
	// The code is masked in the sample (it is printed, and a customer gets it).
	if rep.SampleMessage != "Merhaba Ayşe, kodunuz *****" {
		t.Errorf("sample message %q", rep.SampleMessage)
	}
	if rep.Encoding != "UCS-2" || rep.SegmentsPerMessage != 1 {
		t.Errorf("encoding %s/%d, want UCS-2/1 (ş forces UCS-2)", rep.Encoding, rep.SegmentsPerMessage)
	}
	if rep.TotalSegments != 2 || rep.UCS2Messages != 1 {
		t.Errorf("total segments %d, UCS-2 messages %d; want 2 and 1 (Ayşe's message is UCS-2, Ali's GSM-7)", rep.TotalSegments, rep.UCS2Messages)
	}
	if rep.ETASeconds != 1 {
		t.Errorf("ETA %v s, want 1 (2 recipients at 2/s)", rep.ETASeconds)
	}

	// Exactly the two eligible users are planned, each once, each with its own reserved code.
	rows, err := db.Query(context.Background(), `SELECT r.user_id, r.address, r.code, r.batch FROM campaign_recipients r
		JOIN promo_codes c ON c.code = r.code AND c.pool = 'p'
		WHERE r.campaign_id = $1 ORDER BY r.user_id`, rep.ID)
	if err != nil {
		t.Fatal(err)
	}
	type planned struct {
		User, Address, Code string
		Batch               int
	}
	var got []planned
	for rows.Next() {
		var p planned
		if err := rows.Scan(&p.User, &p.Address, &p.Code, &p.Batch); err != nil {
			t.Fatal(err)
		}
		got = append(got, p)
	}
	want := []planned{{"u1", "+905321111111", "CODE0", 0}, {"u2", "+905321111112", "CODE1", 1}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("planned recipients (-want +got):\n%s", diff)
	}
	if n, err := codes.Free(context.Background(), db, "p"); err != nil || n != 1 {
		t.Errorf("%d free codes left (%v), want 1", n, err)
	}
	if n := count(t, db, `SELECT count(*) FROM campaign_batches WHERE campaign_id = $1`, rep.ID); n != 2 {
		t.Errorf("%d batches, want 2", n)
	}
	c, err := campaign.NewStore(db).Get(context.Background(), rep.ID)
	if err != nil {
		t.Fatal(err)
	}
	if c.State != campaign.StateRunning || c.Eligible != 2 || c.Audience != 10 {
		t.Errorf("campaign row %+v", c)
	}

	// The same name again is refused, and nothing more is planned.
	_, err = p.Plan(context.Background(), spec("summer"))
	if !errors.Is(err, campaign.ErrNameTaken) {
		t.Fatalf("second launch with the same name: err = %v, want ErrNameTaken", err)
	}
	if n := count(t, db, `SELECT count(*) FROM campaign_recipients`); n != 2 {
		t.Errorf("%d recipients after refused relaunch, want 2", n)
	}
	if !strings.Contains(err.Error(), "campaignctl resume") {
		t.Errorf("the refusal of a running campaign's name does not say how to go on with it: %v", err)
	}
	// Once it ended, resume is no fix: the message does not offer it.
	mustExec(t, db, `UPDATE campaigns SET state = 'completed' WHERE name = 'summer'`)
	_, err = p.Plan(context.Background(), spec("summer"))
	if !errors.Is(err, campaign.ErrNameTaken) || strings.Contains(err.Error(), "resume") || !strings.Contains(err.Error(), "choose another --name") {
		t.Fatalf("the name of a completed campaign: %v; want ErrNameTaken without resume", err)
	}
}

func TestDryRunWritesNothing(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	seedAudience(t, db, 2)
	p := &campaign.Planner{Engine: db, Audience: db}
	s := spec("dry")
	s.DryRun = true
	dry, err := p.Plan(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	if dry.ID != 0 || dry.Eligible != 2 || dry.Audience != 10 || dry.SampleMessage == "" {
		t.Errorf("dry run report %+v", dry)
	}
	for _, table := range []string{"campaigns", "campaign_recipients", "campaign_batches"} {
		if n := count(t, db, `SELECT count(*) FROM `+table); n != 0 {
			t.Errorf("dry run left %d rows in %s", n, table)
		}
	}
	if n, err := codes.Free(context.Background(), db, "p"); err != nil || n != 2 {
		t.Errorf("dry run reserved codes: %d free (%v), want 2", n, err)
	}
	// The real launch reports the same numbers (asked to count segments, as a dry run always does).
	s.DryRun = false
	s.CountSegments = true
	real, err := p.Plan(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	if real.ID != 1 {
		t.Errorf("the first launch after a dry run got campaign ID %d, want 1: the dry run used up an ID", real.ID)
	}
	opts := cmp.Options{cmpIgnore("ID", "DryRun", "State")}
	if diff := cmp.Diff(dry, real, opts); diff != "" {
		t.Errorf("dry run and launch differ (-dry +launch):\n%s", diff)
	}
}

func cmpIgnore(fields ...string) cmp.Option {
	return cmp.FilterPath(func(p cmp.Path) bool {
		for _, f := range fields {
			if p.Last().String() == "."+f {
				return true
			}
		}
		return false
	}, cmp.Ignore())
}

func TestPlanRefusals(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	seedAudience(t, db, 1)
	p := &campaign.Planner{Engine: db, Audience: db}

	tests := []struct {
		name   string
		edit   func(*campaign.Spec)
		target error
		says   []string
	}{
		{"pool short", func(s *campaign.Spec) {}, campaign.ErrPoolShort, []string{"1 codes missing", "codes generate --pool p --count 1"}},
		{"unknown pool", func(s *campaign.Spec) { s.CodePool = "nope" }, campaign.ErrInvalid, []string{`code pool "nope" does not exist`}},
		{"missing template variable", func(s *campaign.Spec) { s.Message = "Hi {{.nickname}} {{.code}}" }, campaign.ErrInvalid, []string{"{{.nickname}}", "first_name"}},
		{"no phone column", func(s *campaign.Spec) { s.AudienceSQL = "SELECT user_id, first_name FROM aud" }, campaign.ErrInvalid, []string{"no phone column"}},
		{"no user_id column", func(s *campaign.Spec) { s.AudienceSQL = "SELECT phone FROM aud" }, campaign.ErrInvalid, []string{"no user_id column"}},
		{"audience writes", func(s *campaign.Spec) {
			s.AudienceSQL = "WITH d AS (DELETE FROM aud RETURNING *) SELECT user_id, phone, first_name FROM d"
		}, campaign.ErrInvalid, []string{"read-only"}},
		{"audience syntax", func(s *campaign.Spec) { s.AudienceSQL = "SELEC user_id FROM aud" }, campaign.ErrInvalid, []string{"audience query failed"}},
		{"two statements", func(s *campaign.Spec) { s.AudienceSQL = "SELECT 1; SELECT 2" }, campaign.ErrInvalid, []string{"more than one statement"}},
		{"code without a pool", func(s *campaign.Spec) { s.CodePool = "" }, campaign.ErrInvalid, []string{"{{.code}}", "--code-pool"}},
		{"unknown channel", func(s *campaign.Spec) { s.Channel = "fax" }, campaign.ErrInvalid, []string{`unknown channel "fax"`}},
		{"bad template", func(s *campaign.Spec) { s.Message = "Hi {{.first_name" }, campaign.ErrInvalid, []string{"does not parse"}},
		// A value past 64 KiB is refused from its size on the wire, naming the row and its user_id
		// (decoded alone, here an integer), whether the query runs restricted or as the connection's role.
		{"a huge value", func(s *campaign.Spec) {
			s.AudienceSQL = `SELECT ord AS user_id, phone, first_name, CASE WHEN ord = 3 THEN jsonb_build_object('k', repeat('x', 70000)) END AS extra FROM aud ORDER BY ord`
		}, campaign.ErrInvalid, []string{"audience row 3 (user_id 3)", "the value of extra is 68 KiB, more than 64 KiB", "left(extra, 500)"}},
		{"a huge value as the connection role", func(s *campaign.Spec) {
			s.AllowPrivilegedAudience = true
			s.AudienceSQL = `SELECT ord AS user_id, phone, first_name, CASE WHEN ord = 2 THEN repeat('x', 3000000)::bytea END AS extra FROM aud, generate_series(1, 50) ORDER BY ord`
		}, campaign.ErrInvalid, []string{"audience row 51 (user_id 2)", "the value of extra is 2929 KiB"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := spec("refused " + tt.name)
			tt.edit(&s)
			_, err := p.Plan(context.Background(), s)
			if !errors.Is(err, tt.target) {
				t.Fatalf("err = %v, want %v", err, tt.target)
			}
			for _, w := range tt.says {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
	if n := count(t, db, `SELECT count(*) FROM campaigns`); n != 0 {
		t.Errorf("refused launches left %d campaigns", n)
	}
	// Refused launches released the code writers' lock: codes can still be generated.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := codes.Generate(ctx, db, codes.GenerateOptions{Pool: "p", Count: 1}); err != nil {
		t.Fatalf("generate after refused launches: %v", err)
	}
	if n := count(t, db, `SELECT count(*) FROM aud`); n != 10 {
		t.Errorf("the audience table lost rows: %d", n)
	}
}

// A row whose column the template uses is NULL is excluded (missing_value), never sent "Merhaba <no value>".
func TestNullTemplateValueIsExcluded(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	seedAudience(t, db, 3)
	mustExec(t, db, `UPDATE aud SET first_name = NULL WHERE user_id = 'u2'`)
	rep, err := (&campaign.Planner{Engine: db, Audience: db}).Plan(context.Background(), spec("nulls"))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Eligible != 1 || rep.Excluded[campaign.ReasonMissingValue] != 1 {
		t.Fatalf("eligible %d, excluded %v; want u2 excluded as missing_value", rep.Eligible, rep.Excluded)
	}
}

// A code given back (its recipient failed for good) is the first to be given out again, and no code is
// ever held by two recipients.
func TestReleasedCodesAreReusedFirst(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	seedAudience(t, db, 3)
	ctx := context.Background()
	p := &campaign.Planner{Engine: db, Audience: db}
	first, err := p.Plan(ctx, spec("first"))
	if err != nil {
		t.Fatal(err)
	}
	moved, err := campaign.NewStore(db).Record(ctx, first.ID, []campaign.Outcome{{UserID: "u1", Status: campaign.StatusFailed, Reason: "twilio 21610: opted out"}}, campaign.Lease{}, nil)
	if err != nil || moved[campaign.StatusFailed] != 1 {
		t.Fatalf("record: %v %v", moved, err)
	}
	second, err := p.Plan(ctx, spec("second"))
	if err != nil {
		t.Fatal(err)
	}
	if n := count(t, db, `SELECT count(*) FROM campaign_recipients WHERE campaign_id = $1 AND user_id = 'u1' AND code = 'CODE0'`, second.ID); n != 1 {
		t.Errorf("second campaign's u1 does not hold u1's released CODE0, given out again first")
	}
	if n := count(t, db, `SELECT count(*) FROM campaign_recipients WHERE code = 'CODE2'`); n != 1 {
		t.Errorf("the last fresh code is held %d times, want 1", n)
	}
	if n := count(t, db, `SELECT count(*) - count(DISTINCT code) FROM campaign_recipients WHERE code IS NOT NULL`); n != 0 {
		t.Errorf("%d codes held by more than one recipient", n)
	}
	if n, err := codes.Free(ctx, db, "p"); err != nil || n != 0 {
		t.Errorf("%d free codes (%v), want 0", n, err)
	}
}

// A refused audience value ends the audience query at once: its connection is closed, not read to its end.
// The rest of this audience takes 20 s to produce (10 ms a row), and the refusal must come well before.
func TestAnAudienceRefusedAtItsFirstRowIsNotReadToItsEnd(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	seedAudience(t, db, 1)
	p := &campaign.Planner{Engine: db, Audience: db}
	s := spec("refused early")
	s.AllowPrivilegedAudience = true // the connection's role streams its rows (the restricted one materialises them first)
	s.AudienceSQL = `SELECT g::text AS user_id, '+90532111' || lpad(g::text, 4, '0') AS phone, 'Ayşe' AS first_name,
			CASE WHEN g = 1 THEN repeat('x', 70000) ELSE 'y' || pg_sleep(0.01)::text END AS extra
		FROM generate_series(1, 2000) g`
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	_, err := p.Plan(ctx, s)
	took := time.Since(start)
	if !errors.Is(err, campaign.ErrInvalid) || !strings.Contains(err.Error(), "audience row 1 (user_id 1)") {
		t.Fatalf("err = %v, want the first row's value refused", err)
	}
	if took > 5*time.Second {
		t.Errorf("the refusal took %v: the rest of the audience (20 s of rows) was read before it", took.Round(time.Millisecond))
	}
	if n := count(t, db, `SELECT count(*) FROM campaigns`); n != 0 {
		t.Errorf("the refused launch left %d campaigns", n)
	}
}

// Of a customer's rows, and of the customers on one number, the row kept is one that can be sent: a CRM's
// row without a phone, or with a number that has no consent, or without the name the message shows, ahead
// of the good row lost the customer (duplicate_user, duplicate_address), and the number got nothing. Rows
// that can all be sent keep the query's order.
func TestADuplicateThatCannotBeSentDoesNotHideOneThatCan(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	seedAudience(t, db, 10)
	mustExec(t, db, `CREATE TABLE dup (ord int, user_id text, phone text, first_name text)`)
	mustExec(t, db, `GRANT SELECT ON dup TO campaignctl_audience`)
	mustExec(t, db, `INSERT INTO dup VALUES
		(1, 'k1', NULL, 'Ali'), (2, 'k1', '+905321111201', 'Ali'),
		(3, 'k2', '+905329999998', 'Ayşe'), (4, 'k2', '+905321111202', 'Ayşe'),
		(5, 'd1', '+905321111203', NULL), (6, 'd2', '05321111203', 'Can'),
		(7, 'e1', '+905321111204', 'Ece'), (8, 'e2', '+905321111204', 'Eda'),
		(9, 'y', '+905321111205', 'Yeşim'), (10, 'x', '+905321111205', 'Xavier'), (11, 'x', '+905321111206', 'Xavier'),
		(12, 'a', '+905321111207', 'Ada'), (13, 'a', '+905321111208', 'Ada'), (14, 'b', '+905321111208', 'Baran'),
		(15, 'b', '+905321111209', 'Baran'), (16, 'c', '+905321111209', 'Cem')`)
	mustExec(t, db, `INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date)
		SELECT '+90532111120' || i, 'MESAJ', 'BIREYSEL', 'ONAY', 'HS_WEB', now() FROM generate_series(1, 9) i`)
	s := spec("dup")
	s.AudienceSQL = `SELECT user_id, phone, first_name FROM dup ORDER BY ord`
	rep, err := (&campaign.Planner{Engine: db, Audience: db}).Plan(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	// x's first row is on y's number, taken by y before it: x keeps its own other number. a, b and c: a
	// takes 207 (its first), b 208 (a does not use it), c 209 (b does not): nobody is lost down the chain.
	// d1, without the name the message shows, is excluded for that (missing_value), not for d2's number.
	want := map[string]int64{campaign.ReasonDuplicateUser: 5, campaign.ReasonDuplicateAddress: 1, campaign.ReasonMissingValue: 1}
	if diff := cmp.Diff(want, rep.Excluded); diff != "" || rep.Eligible != 9 {
		t.Errorf("eligible %d (want 9), excluded (-want +got):\n%s", rep.Eligible, diff)
	}
	got := texts(t, db, `SELECT user_id || ' ' || address FROM campaign_recipients WHERE campaign_id = $1 ORDER BY 1`, rep.ID)
	if diff := cmp.Diff([]string{"a +905321111207", "b +905321111208", "c +905321111209", "d2 +905321111203", "e1 +905321111204", "k1 +905321111201", "k2 +905321111202", "x +905321111206", "y +905321111205"}, got); diff != "" {
		t.Errorf("planned (-want +got):\n%s", diff)
	}
}

// EngineTables is every table the migrations create: one left off (the refusals, the İYS outbox) was one
// an audience role could read without being refused, and put into a message.
func TestEngineTablesAreEveryTableOfTheSchema(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	got := texts(t, db, `SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p', 'v', 'm') ORDER BY 1`)
	want := slices.Sorted(slices.Values(campaign.EngineTables))
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("campaign.EngineTables against the migrated schema's tables (-list +schema):\n%s", diff)
	}
}

// A NULL in a column the message only tests ({{or .first_name "…"}}, {{if .f}}, {{with .f}}) takes the
// template's fallback: the row was excluded as missing_value, though the engine's own advice for a blank
// subject is such a fallback. A column the message prints as it is still excludes the row when NULL.
func TestANullTheTemplateFallsBackOnIsNotMissing(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	seedAudience(t, db, 20) // eligible: u1 (Ayşe) and u2 (Ali)
	mustExec(t, db, `UPDATE aud SET first_name = NULL WHERE user_id = 'u2'`)
	ctx := context.Background()
	for i, tc := range []struct {
		message string
		missing int64
		u2      string
	}{
		{`Merhaba {{or .first_name "Müşterimiz"}}, kodunuz {{.code}}`, 0, "Merhaba Müşterimiz, kodunuz "},
		{`Merhaba {{with .first_name}}{{.}}{{else}}dostum{{end}}, kodunuz {{.code}}`, 0, "Merhaba dostum, kodunuz "},
		{`Merhaba{{if .first_name}} sayın müşterimiz{{end}}, kodunuz {{.code}}`, 0, "Merhaba, kodunuz "},
		{`Merhaba {{.first_name}}, kodunuz {{.code}}`, 1, ""},
		// or prints its last argument when none is true, and prints a NULL field there; and prints its
		// first false argument.
		{`Merhaba {{or .first_name .first_name}}, kodunuz {{.code}}`, 1, ""},
		{`Merhaba{{and .first_name " bey"}}, kodunuz {{.code}}`, 1, ""},
		{`Merhaba {{if not .first_name}}dostum{{end}}, kodunuz {{.code}}`, 0, "Merhaba dostum, kodunuz "},
		{`Merhaba {{printf "%s" .first_name}}, kodunuz {{.code}}`, 1, ""},
	} {
		s := spec(fmt.Sprintf("null-%d", i))
		s.Message, s.CountSegments = tc.message, true
		rep, err := (&campaign.Planner{Engine: db, Audience: db}).Plan(ctx, s)
		if err != nil {
			t.Fatalf("%s: %v", tc.message, err)
		}
		if got := rep.Excluded[campaign.ReasonMissingValue]; got != tc.missing || rep.Eligible != 2-tc.missing {
			t.Errorf("%s: missing_value %d, eligible %d; want %d and %d", tc.message, got, rep.Eligible, tc.missing, 2-tc.missing)
			continue
		}
		if tc.u2 == "" {
			continue
		}
		tmpl, err := campaign.ParseTemplate(tc.message)
		if err != nil {
			t.Fatal(err)
		}
		rs, err := campaign.NewStore(db).LoadBatch(ctx, rep.ID, 1)
		if err != nil || len(rs) != 1 || rs[0].UserID != "u2" {
			t.Fatalf("batch 1: %v %v; want u2", rs, err)
		}
		msg, err := tmpl.Render(rs[0].TemplateData(campaign.ChannelSMS, s.Name))
		if err != nil || !strings.HasPrefix(msg, tc.u2) {
			t.Errorf("%s: u2's message %q (%v), want it to start %q", tc.message, msg, err, tc.u2)
		}
	}
}

// A code pool reserves a code for every recipient: a message that shows {{.code}} only to some (inside an
// {{if}} without an {{else}} showing it too) is refused, as one that never shows it is. An outside run
// used up 10 codes for 2 shown, and the report listed a code for each of the 10.
func TestACodeShownToSomeRecipientsOnlyIsRefused(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	seedAudience(t, db, 10)
	ctx := context.Background()
	for i, tc := range []struct {
		message string
		ok      bool
	}{
		{`{{if .first_name}}Kodunuz {{.code}}{{end}}`, false},
		{`{{with .first_name}}{{$.code}}{{end}}`, false},
		{`{{$c := .code}}Merhaba`, false},
		{`{{if .first_name}}{{.code}}{{else if .user_id}}Merhaba{{end}}`, false},
		{`{{if .first_name}}VIP {{.code}}{{else}}Kodunuz {{.code}}{{end}}`, true},
		{`{{if .first_name}}VIP{{end}} kodunuz {{.code}}`, true},
		{`{{if .first_name}}{{.code}}{{else if .user_id}}{{.code}}{{else}}{{.code}}{{end}}`, true},
	} {
		s := spec(fmt.Sprintf("some-%d", i))
		s.Message, s.DryRun = tc.message, true
		_, err := (&campaign.Planner{Engine: db, Audience: db}).Plan(ctx, s)
		if tc.ok && err != nil {
			t.Errorf("%s: %v; want it planned", tc.message, err)
		}
		if !tc.ok && (!errors.Is(err, campaign.ErrInvalid) || !strings.Contains(err.Error(), "--code-pool reserves a code for every recipient")) {
			t.Errorf("%s: %v; want it refused, the code shown to some only", tc.message, err)
		}
	}
}

// texts runs a query of one text column and returns its rows.
func texts(t *testing.T, db *pgxpool.Pool, sql string, args ...any) []string {
	t.Helper()
	rows, err := db.Query(context.Background(), sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return got
}
