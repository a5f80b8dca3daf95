package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/internal/testredis"
)

// cli runs a fresh command tree in-process with the given environment.
func cli(t *testing.T, env map[string]string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(args, func(k string) string { return env[k] }, strings.NewReader(""), &out, &errb)
	return out.String(), errb.String(), code
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// badInputEnv is a migrated database with a small audience (3 customers with consent) and a pool of 2
// codes, and a Redis DB.
// testSender and testPrefix make test messages pass the commercial SMS lint: the sender's identity and
// how to refuse further messages.
const (
	testSender = "ACME A.Ş."
	testPrefix = "ACME A.Ş. (RET yazıp 4609'a gönderin) "
)

func badInputEnv(t *testing.T) (map[string]string, func() int64) {
	env, count := badInputDB(t)
	return env, func() int64 { return count(`SELECT count(*) FROM campaigns`) }
}

// threeCustomers seeds a table customers (user_id, phone, first_name) of three, each with an SMS ONAY, a
// consent import just done, and the code pool "small" holding codes.
func threeCustomers(codes ...string) []string {
	vals := make([]string, len(codes))
	for i, c := range codes {
		vals[i] = "('small', '" + c + "')"
	}
	return []string{
		`CREATE TABLE customers (user_id text, phone text, first_name text)`,
		`GRANT SELECT ON customers TO campaignctl_audience`,
		`INSERT INTO customers VALUES ('a', '+905321000001', 'Ada'), ('b', '+905321000002', 'Baran'), ('c', '+905321000003', 'Cem')`,
		`INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date)
		 SELECT phone, 'MESAJ', 'BIREYSEL', 'ONAY', 'HS_WEB', now() FROM customers`,
		`INSERT INTO code_pools VALUES ('small')`,
		`INSERT INTO iys_sync_state (source, last_success_at) VALUES ('import', now())`,
		`INSERT INTO promo_codes (pool, code) VALUES ` + strings.Join(vals, ", "),
	}
}

func badInputDB(t *testing.T) (map[string]string, func(sql string) int64) {
	t.Helper()
	db, dbURL := testdb.New(t)
	_, redisURL := testredis.New(t)
	ctx := context.Background()
	for _, sql := range threeCustomers("X1", "X2") {
		if _, err := db.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	count := func(sql string) int64 {
		var n int64
		if err := db.QueryRow(ctx, sql).Scan(&n); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return n
	}
	return map[string]string{"DATABASE_URL": dbURL, "REDIS_URL": redisURL, "SENDER_IDENTITY": testSender}, count
}

func TestBadInputIsRefusedClearlyAndNothingIsWritten(t *testing.T) {
	t.Parallel()
	env, campaigns := badInputEnv(t)
	audience := writeFile(t, "a.sql", "SELECT user_id, phone, first_name FROM customers")
	noUser := writeFile(t, "b.sql", "SELECT phone, first_name FROM customers")
	writes := writeFile(t, "c.sql", "WITH d AS (DELETE FROM customers RETURNING *) SELECT user_id, phone, first_name FROM d")
	broken := writeFile(t, "d.sql", "SELECT user_id, phone FROM nowhere")
	launch := func(extra ...string) []string {
		args := []string{"launch", "--name", "x", "--channel", "sms", "--audience", audience, "--code-pool", "small",
			"--message", testPrefix + "Merhaba {{.first_name}} {{.code}}", "--yes"}
		return append(args, extra...)
	}
	tests := []struct {
		name string
		args []string
		code int
		says []string
	}{
		{"unknown channel", append(launch(), "--channel", "fax"), 2, []string{`unknown channel "fax"`, "sms"}},
		{"missing flags", []string{"launch", "--name", "x"}, 2, []string{"--audience", "--message"}},
		{"unknown pool", append(launch(), "--code-pool", "nope"), 2, []string{`code pool "nope" does not exist`, "codes generate"}},
		{"too few codes", launch(), 2, []string{"1 codes missing", "codes generate --pool small --count 1", "Not launched (nothing written, nothing sent)", "codes needed / free  3 / 2"}},
		{"preview of an SMS", append(launch(), "--dry-run", "--preview-dir", t.TempDir()), 2, []string{"--preview-dir shows an e-mail"}},
		{"template variable missing", append(launch(), "--message", testPrefix+"Hi {{.nick}} {{.code}}"), 2, []string{"{{.nick}}", "first_name"}},
		{"commercial SMS without opt-out", append(launch(), "--message", "ACME A.Ş. Merhaba {{.code}}"), 2, []string{"how to refuse further messages", "law 6563", "--transactional"}},
		{"commercial SMS without sender", append(launch(), "--message", "Merhaba {{.code}}, RET yazıp 4609'a gönderin"), 2, []string{"the sender's identity", "SENDER_IDENTITY"}},
		// Law 6563's parts must reach every recipient: not only those of an {{if}}, nor none (a comment).
		{"opt-out in one branch", append(launch(), "--message", "ACME A.Ş. {{if .first_name}}RET yazıp 4609'a gönderin{{end}} {{.code}}"), 2, []string{"how to refuse further messages", "outside {{if}}"}},
		{"sender in a comment", append(launch(), "--message", "{{/* ACME A.Ş. */}}Merhaba {{.code}}, RET yazıp 4609'a gönderin"), 2, []string{"the sender's identity"}},
		{"sender and opt-out in one branch", append(launch(), "--message", "{{if .first_name}}"+testPrefix+"{{end}}Kodunuz {{.code}}"), 2, []string{"the sender's identity", "how to refuse"}},
		// "RET" inside a word is no instruction: ÜRETİM and ÜRETİCİ, with a price after them.
		{"RET inside a Turkish word", append(launch(), "--message", "ACME A.Ş.: YERLİ ÜRETİM ÜRÜNLERDE 500 TL İNDİRİM, KOD {{.code}}"), 2, []string{"how to refuse further messages"}},
		// A value printed against RET glues to it: "…WC8HT6YWRET yazıp" carries no word RET.
		{"RET glued to a value before it", append(launch(), "--message", "ACME A.Ş. kodunuz {{.code}}RET yazıp 4609'a gönderin"), 2, []string{"how to refuse further messages"}},
		{"RET glued to a trimmed value", append(launch(), "--message", "ACME A.Ş. {{.code}} {{- .first_name -}}   RET yazıp 4609'a gönderin"), 2, []string{"how to refuse further messages"}},
		{"RET inside a word, lower case", append(launch(), "--message", "ACME A.Ş.: seçkin üreticilerden 250 TL indirim, kod {{.code}}"), 2, []string{"how to refuse further messages"}},
		{"frequency cap on a transactional message", append(launch(), "--transactional", "--frequency-cap", "7d"), 2, []string{"--frequency-cap is about commercial messages", "--transactional"}},
		{"transactional with codes", append(launch(), "--transactional"), 2, []string{"transactional message carries no promo code"}},
		{"bad recipient type", append(launch(), "--recipient-type", "ESNAF"), 2, []string{"BIREYSEL", "TACIR"}},
		{"audience without user_id", append(launch(), "--audience", noUser), 2, []string{"no user_id column"}},
		{"audience writes", append(launch(), "--audience", writes), 2, []string{"read-only"}},
		{"audience fails", append(launch(), "--audience", broken), 2, []string{`relation "nowhere" does not exist`}},
		{"audience file missing", append(launch(), "--audience", "/nonexistent.sql"), 2, []string{"cannot read the audience file"}},
		{"bad rate", append(launch(), "--rate", "-3"), 2, []string{"--rate"}},
		{"rate below one an hour", append(launch(), "--rate", "1e-9"), 2, []string{"--rate 1e-09 is below one message an hour", "0.000278"}},
		{"start in the past", append(launch(), "--at", "2020-01-01 10:00"), 2, []string{"in the past"}},
		{"bad window", append(launch(), "--window", "9-20"), 2, []string{"HH:MM-HH:MM"}},
		{"bad zone", append(launch(), "--tz", "Mars/Olympus"), 2, []string{"time zone"}},
		{"no segments", append(launch(), "--max-segments", "0"), 2, []string{"--max-segments 0", "between 1 and 24"}},
		{"max segments of an e-mail", append(launch(), "--channel", "email", "--subject", "Kod", "--max-segments", "5"), 2, []string{"--max-segments bounds an SMS", "--channel email sends none"}},
		{"batch size out of range", append(launch(), "--batch-size", "10001"), 2, []string{"--batch-size 10001", "from 1 to 10000"}},
		{"batch size negative", append(launch(), "--batch-size", "-1"), 2, []string{"--batch-size -1", "or 0 for the channel's"}},
		{"e-mail batch above a request", append(launch(), "--channel", "email", "--subject", "Kod", "--batch-size", "1001"), 2, []string{"--batch-size 1001", "at most 1000"}},
		{"no statement timeout", append(launch(), "--statement-timeout", "0s"), 2, []string{"--statement-timeout", "from 1s to 24h0m0s"}},
		{"statement timeout Postgres reads as none", append(launch(), "--statement-timeout", "500us"), 2, []string{"--statement-timeout 500µs", "from 1s"}},
		{"statement timeout past a day", append(launch(), "--statement-timeout", "600h"), 2, []string{"--statement-timeout 600h0m0s", "to 24h0m0s"}},
		{"empty zone", append(launch(), "--tz", ""), 2, []string{`--tz ""`, "UTC"}},
		// Each worker would read the window in its own zone: quiet hours at different times on each machine.
		{"each machine's own zone", append(launch(), "--tz", "Local", "--window", "09:00-20:00"), 2, []string{"--tz Local", "each machine's own", "Europe/Istanbul"}},
		// Kept in whole seconds: 900ms was stored as 0, no cap at send time.
		{"frequency cap below a second", append(launch(), "--frequency-cap", "900ms"), 2, []string{"--frequency-cap 900ms", "whole seconds", "1s"}},
		{"frequency cap of a fraction", append(launch(), "--frequency-cap", "1500ms"), 2, []string{"--frequency-cap 1.5s", "whole seconds"}},
		{"SMS with a subject", append(launch(), "--subject", "Merhaba"), 2, []string{"an SMS has none"}},
		{"two e-mail bodies", append(launch(), "--channel", "email", "--html", audience, "--template-id", "d-123"), 2, []string{"keep one"}},
		{"status of unknown campaign", []string{"status", "999"}, 2, []string{"no campaign has id 999"}},
		{"bad campaign id", []string{"status", "abc"}, 2, []string{`campaign ID "abc"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stdout, stderr, code := cli(t, env, tt.args...)
			if code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, stdout, stderr)
			}
			if stdout != "" {
				t.Errorf("a refused command printed a result on stdout:\n%s", stdout)
			}
			for _, s := range tt.says {
				if !strings.Contains(stderr, s) {
					t.Errorf("stderr does not say %q:\n%s", s, stderr)
				}
			}
		})
	}
	if n := campaigns(); n != 0 {
		t.Fatalf("refused launches left %d campaigns", n)
	}
	// Nor anything in Redis: the launches that got as far as connecting (an unknown pool, too few codes, an
	// audience that fails) had created the Redis epoch's three keys.
	opt, err := redis.ParseURL(env["REDIS_URL"])
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	if keys, err := rdb.Keys(context.Background(), "*").Result(); err != nil || len(keys) != 0 {
		t.Fatalf("refused launches left keys in Redis: %v (err %v)", keys, err)
	}
	// An audience file that starts with a byte order mark (as editors on Windows save it) is read as the
	// SQL after it: Postgres reported a syntax error "at or near SELECT", the mark unseen.
	bom := writeFile(t, "bom.sql", "\uFEFFSELECT user_id, phone, first_name FROM customers ORDER BY user_id LIMIT 2")
	args := launch("--dry-run")
	args[slices.Index(args, audience)] = bom
	if stdout, stderr, code := cli(t, env, args...); code != 0 {
		t.Errorf("a dry run of an audience file with a byte order mark: exit %d\n%s%s", code, stdout, stderr)
	}
}

func TestMalformedConsentCSVNamesTheLine(t *testing.T) {
	t.Parallel()
	env, count := badInputDB(t)
	csv := writeFile(t, "c.csv", "recipient,type,recipient_type,status,source,consent_date\n"+
		"+905321000009,MESAJ,BIREYSEL,ONAY,HS_WEB,2026-01-15 10:30:00\n"+
		"+905321000010,MESAJ,BIREYSEL,OK,HS_WEB,2026-01-15 10:30:00\n")
	_, stderr, code := cli(t, env, "iys", "import", csv)
	if code != 2 || !strings.Contains(stderr, "line 3") || !strings.Contains(stderr, "ONAY") {
		t.Fatalf("exit %d, stderr %q; want exit 2 naming line 3 and the allowed values", code, stderr)
	}
	if n := count(`SELECT count(*) FROM iys_consents WHERE recipient = '+905321000009'`); n != 0 {
		t.Fatalf("a malformed file was partly imported (%d rows)", n)
	}
}

func TestServicesUnreachableSayWhereAndWhatToRun(t *testing.T) {
	t.Parallel()
	env, campaigns := badInputEnv(t)
	audience := writeFile(t, "a.sql", "SELECT user_id, phone, first_name FROM customers")

	noRedis := map[string]string{"DATABASE_URL": env["DATABASE_URL"], "REDIS_URL": "redis://127.0.0.1:1/0", "SENDER_IDENTITY": testSender}
	_, stderr, code := cli(t, noRedis, "launch", "--name", "r", "--channel", "sms", "--audience", audience,
		"--message", testPrefix+"Merhaba {{.first_name}}", "--yes")
	if code != 1 || !strings.Contains(stderr, "Redis is not reachable at 127.0.0.1:1") || !strings.Contains(stderr, "REDIS_URL") {
		t.Fatalf("Redis down: exit %d, stderr %q", code, stderr)
	}
	if n := campaigns(); n != 0 {
		t.Fatalf("a launch with Redis down wrote %d campaigns", n)
	}

	// A REDIS_URL that is not a URL, or names a database Redis does not have, is the user's to fix (exit 2),
	// even for status, which otherwise answers from Postgres alone while Redis is down.
	for url, says := range map[string]string{"notaurl": "not a valid Redis URL", "redis://127.0.0.1:6379/99": "0 to 15"} {
		bad := map[string]string{"DATABASE_URL": env["DATABASE_URL"], "REDIS_URL": url}
		if _, stderr, code := cli(t, bad, "status"); code != 2 || !strings.Contains(stderr, says) {
			t.Fatalf("REDIS_URL=%s: exit %d, stderr %q; want 2 and %q", url, code, stderr, says)
		}
	}

	// Given as a flag, the message names the flag the user typed, not the variable they did not set.
	for _, args := range [][]string{{"--database-url", "x", "status"}, {"--redis-url", "notaurl", "status"}, {"--database-url", "x", "migrate"}} {
		_, stderr, code := cli(t, map[string]string{"DATABASE_URL": env["DATABASE_URL"], "REDIS_URL": env["REDIS_URL"]}, args...)
		if code != 2 || !strings.Contains(stderr, args[0]) || strings.Contains(stderr, "_URL") {
			t.Fatalf("%v: exit %d, stderr %q; want 2 naming %s alone", args, code, stderr, args[0])
		}
	}

	noPG := map[string]string{"DATABASE_URL": "postgres://postgres@127.0.0.1:1/campaignctl?sslmode=disable", "REDIS_URL": env["REDIS_URL"]}
	_, stderr, code = cli(t, noPG, "status")
	if code != 1 || !strings.Contains(stderr, "Postgres is not reachable at 127.0.0.1:1") || !strings.Contains(stderr, "DATABASE_URL") {
		t.Fatalf("Postgres down: exit %d, stderr %q", code, stderr)
	}
	// Without sslmode pgx tries with TLS and then without: the reason, the same both times, is said once.
	noPG["DATABASE_URL"] = "postgres://postgres@127.0.0.1:1/campaignctl"
	if _, stderr, code = cli(t, noPG, "status"); code != 1 || strings.Count(stderr, "connection refused") != 1 {
		t.Fatalf("Postgres down, sslmode not set: exit %d, want 1 and the reason once; stderr %q", code, stderr)
	}

	// A server that answers but refuses the URL's user or lacks its database: the URL is the user's to fix
	// (exit 2), and the message says so rather than "start it"; the password is not printed.
	u, err := url.Parse(env["DATABASE_URL"])
	if err != nil {
		t.Fatal(err)
	}
	badUser, badDB, badParam, badValue := *u, *u, *u, *u
	badUser.User = url.UserPassword("nosuchuser", "Pw0rdS3cret")
	badDB.Path = "/campaignctl_no_such_db"
	// A setting in the URL's query the server does not take (before, exit 1 and "start it").
	badParam.RawQuery += "&bogusparam=1"
	badValue.RawQuery += "&statement_timeout=abc"
	for url, says := range map[string]string{
		badUser.String():  `refused user "nosuchuser"`,
		badDB.String():    `database "campaignctl_no_such_db" does not exist`,
		badParam.String(): `unrecognized configuration parameter "bogusparam" (SQLSTATE 42704); fix or drop it in the URL's query`,
		badValue.String(): `invalid value for parameter "statement_timeout": "abc" (SQLSTATE 22023); fix or drop it in the URL's query`,
	} {
		_, stderr, code := cli(t, map[string]string{"DATABASE_URL": url, "REDIS_URL": env["REDIS_URL"]}, "status")
		if code != 2 || !strings.Contains(stderr, says) || !strings.Contains(stderr, "DATABASE_URL") || strings.Contains(stderr, "not reachable") || strings.Contains(stderr, "Pw0rdS3cret") {
			t.Errorf("DATABASE_URL=%s: exit %d, stderr %q; want 2 and %q naming DATABASE_URL", url, code, stderr, says)
		}
	}
}

func TestSecretsNeverPrinted(t *testing.T) {
	t.Parallel()
	env := map[string]string{"TWILIO_ACCOUNT_SID": "ACnot-alnum", "TWILIO_AUTH_TOKEN": "s3cr3tT0ken", "TWILIO_FROM": "+905550000000"}
	stdout, stderr, _ := cli(t, env, "worker", "--help")
	if strings.Contains(stdout+stderr, "s3cr3tT0ken") {
		t.Fatal("worker --help shows the auth token")
	}
	stdout, stderr, code := cli(t, env, "worker")
	if code == 0 {
		t.Fatal("worker started with an invalid account SID")
	}
	if strings.Contains(stdout+stderr, "s3cr3tT0ken") {
		t.Fatalf("worker error shows the auth token: %s", stderr)
	}
	if !strings.Contains(stderr, "TWILIO_ACCOUNT_SID") {
		t.Errorf("worker error does not name the variable to fix: %s", stderr)
	}
}

// A commercial launch refuses consents older than --max-consent-age, unless --allow-stale-consent, which
// is recorded on the campaign; TACIR audiences are checked against TACIR consents; a transactional
// message is not checked against İYS at all, and says so.
func TestConsentGates(t *testing.T) {
	t.Parallel()
	env, count := badInputDB(t)
	audience := writeFile(t, "a.sql", "SELECT user_id, phone, first_name FROM customers")
	launch := func(name string, extra ...string) (string, string, int) {
		args := append([]string{"launch", "--name", name, "--channel", "sms", "--audience", audience,
			"--message", testPrefix + "Merhaba {{.first_name}}", "--yes", "--json"}, extra...)
		return cli(t, env, args...)
	}
	db, err := pgxpool.New(context.Background(), env["DATABASE_URL"])
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(context.Background(), `UPDATE iys_sync_state SET last_success_at = now() - interval '3 days'`); err != nil {
		t.Fatal(err)
	}
	_, stderr, code := launch("stale")
	if code != 2 || !strings.Contains(stderr, "longer ago than --max-consent-age 24h0m0s") || !strings.Contains(stderr, "campaignctl iys sync") {
		t.Fatalf("stale consents: exit %d, %s", code, stderr)
	}
	if n := count(`SELECT count(*) FROM campaigns`); n != 0 {
		t.Fatalf("a refused launch wrote %d campaigns", n)
	}
	report := func(out string) map[string]any {
		m := map[string]any{}
		if err := json.Unmarshal([]byte(out), &m); err != nil {
			t.Fatalf("launch --json: %v\n%s", err, out)
		}
		return m
	}
	out, stderr, code := launch("stale-ok", "--allow-stale-consent")
	if code != 0 || report(out)["stale_consent_allowed"] != true || count(`SELECT count(*) FROM campaigns WHERE allow_stale_consent`) != 1 {
		t.Fatalf("--allow-stale-consent: exit %d, %s%s", code, out, stderr)
	}
	// TACIR: nobody here has a TACIR consent (a dry run shows it; a launch of nobody is refused).
	out, stderr, code = launch("tacir", "--recipient-type", "TACIR", "--max-consent-age", "0", "--dry-run")
	if r := report(out); code != 0 || r["eligible"] != float64(0) || r["excluded"].(map[string]any)["no_consent"] != float64(3) || r["recipient_type"] != "TACIR" {
		t.Fatalf("TACIR dry run: exit %d, %s%s", code, out, stderr)
	}
	// Transactional: no İYS check, no lint; the RET of c counts for nothing.
	if _, err := db.Exec(context.Background(), `UPDATE iys_consents SET status = 'RET' WHERE recipient = '+905321000003'`); err != nil {
		t.Fatal(err)
	}
	out, stderr, code = cli(t, env, "launch", "--name", "tx", "--channel", "sms", "--audience", audience, "--transactional",
		"--message", "Siparişiniz yola çıktı", "--yes", "--json")
	if r := report(out); code != 0 || r["eligible"] != float64(3) || r["transactional"] != true {
		t.Fatalf("transactional launch: exit %d, %s%s", code, out, stderr)
	}
}

// İYS keys a consent by brand too: a launch for brand 777 counts only brand 777's consents, and an import
// under IYS_BRAND_CODE files its consents under that brand.
func TestConsentsAreKeyedByBrand(t *testing.T) {
	t.Parallel()
	env, _ := badInputDB(t)
	env["IYS_BRAND_CODE"] = "777"
	audience := writeFile(t, "a.sql", "SELECT user_id, phone, first_name FROM customers")
	eligible := func(name string) float64 {
		out, stderr, code := cli(t, env, "launch", "--name", name, "--channel", "sms", "--audience", audience, "--max-consent-age", "0",
			"--message", testPrefix+"Merhaba {{.first_name}}", "--yes", "--json")
		m := map[string]any{}
		if code != 0 || json.Unmarshal([]byte(out), &m) != nil {
			t.Fatalf("launch: exit %d, %s%s", code, out, stderr)
		}
		return m["eligible"].(float64)
	}
	// Consents of no brand do not count for brand 777, and the launch says so rather than exclude everyone.
	if _, stderr, code := cli(t, env, "launch", "--name", "brand-777-before", "--channel", "sms", "--audience", audience, "--max-consent-age", "0",
		"--message", testPrefix+"Merhaba {{.first_name}}", "--yes", "--json"); code != 2 || !strings.Contains(stderr, "recorded without a brand") {
		t.Fatalf("brand 777 launch over consents of no brand: exit %d, %s", code, stderr)
	}
	// The number twice: the later row wins, and the counts add up to the rows.
	csv := writeFile(t, "c.csv", "recipient,type,recipient_type,status,source,consent_date\n"+
		"+905321000001,MESAJ,BIREYSEL,RET,HS_WEB,2026-01-14 10:30:00\n+905321000001,MESAJ,BIREYSEL,ONAY,HS_WEB,2026-01-15 10:30:00\n")
	if out, stderr, code := cli(t, env, "iys", "import", csv); code != 0 || !strings.Contains(out, "imported 2 consent rows: 1 new, 0 updated, 0 unchanged, 1 superseded") {
		t.Fatalf("import: exit %d, %s%s; want the counts to add up to the 2 rows", code, out, stderr)
	}
	// Two of the three still have consents of no brand only: still refused, and counted.
	if _, stderr, code := cli(t, env, "launch", "--name", "brand-777-partly", "--channel", "sms", "--audience", audience, "--max-consent-age", "0",
		"--message", testPrefix+"Merhaba {{.first_name}}", "--yes"); code != 2 || !strings.Contains(stderr, "2 recipients") {
		t.Fatalf("brand 777 launch with two consents of no brand left: exit %d, %s", code, stderr)
	}
	db := mustConnect(t, env["DATABASE_URL"])
	if _, err := db.Exec(context.Background(), `DELETE FROM iys_consents WHERE brand_code = ''`); err != nil {
		t.Fatal(err)
	}
	if n := eligible("brand-777-after"); n != 1 {
		t.Fatalf("brand 777 launch found %v eligible, want the one brand 777 consent", n)
	}
}

// A word that is none of a command group's commands is refused (exit 2, naming the commands), as at the
// top level: a script with a typo must not succeed doing nothing. The group alone prints its help.
func TestUnknownSubcommandsAreRefused(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"iys", "imprt", "consents.csv"}, {"iys", "psuh"}, {"dlq", "retyr", "--campaign", "23"}, {"codes", "bogus"}, {"demo", "bogus"}, {"completion", "tcsh"}} {
		_, stderr, code := cli(t, nil, args...)
		if code != 2 || !strings.Contains(stderr, fmt.Sprintf("unknown command %q", args[1])) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and the unknown command named", args, code, stderr)
		}
	}
	if _, stderr, code := cli(t, nil, "iys", "imprt"); !strings.Contains(stderr, `did you mean "import"`) || code != 2 {
		t.Errorf("iys imprt: exit %d, %q; want a suggestion", code, stderr)
	}
	if stdout, _, code := cli(t, nil, "iys"); code != 0 || !strings.Contains(stdout, "Available Commands") {
		t.Errorf("iys alone: exit %d, %q; want its help", code, stdout)
	}
}

// An unknown flag says where the flags are listed, and an address `iys check` cannot read says how to
// write one (exit 2 both): before, pflag's words alone, and "unexpected character 'n'".
func TestBadFlagsAndAddressesSayTheFix(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"launch", "--bogusflag"}, "unknown flag: --bogusflag; see `campaignctl launch --help`"},
		{[]string{"status", "--watch=maybe"}, "see `campaignctl status --help`"},
		{[]string{"iys", "check", "notaphone"}, "give a phone number as +905321234567 or an e-mail address as ayse@example.com"},
		// Before, exit 1, as if the machine had failed.
		{[]string{"sandbox", "--addr", "notanaddr"}, `--addr "notanaddr" is not an address to listen on: give HOST:PORT`},
		{[]string{"sandbox", "--addr", "127.0.0.1:99999"}, "give HOST:PORT of this machine"},
		// Before, it logged an error, said the events went there, posted nothing and ran on.
		{[]string{"sandbox", "--addr", "127.0.0.1:0", "--sendgrid-event-url", "http://example.com/x"}, `--sendgrid-event-url "http://example.com/x" is not on a loopback host`},
		{[]string{"sandbox", "--addr", "127.0.0.1:0", "--twilio-inbound-url", "ftp://127.0.0.1/x"}, `--twilio-inbound-url "ftp://127.0.0.1/x" is not http(s)`},
	} {
		if _, stderr, code := cli(t, nil, tc.args...); code != 2 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, %q; want 2 and %q", tc.args, code, stderr, tc.want)
		}
	}
}

// A provider's cap that cannot be read is refused by every worker, not only by one whose environment
// configures that provider: FCM_RATE=abc beside Twilio's settings started a worker, and the typo waited
// for the push worker it was meant for.
func TestAnUnreadableCapOfAnyProviderIsRefused(t *testing.T) {
	t.Parallel()
	twilio := map[string]string{"TWILIO_ACCOUNT_SID": "AC00000000000000000000000000000000", "TWILIO_AUTH_TOKEN": "tok", "TWILIO_FROM": "+905550000000"}
	for _, env := range []string{"FCM_RATE", "NETGSM_RATE", "SENDGRID_RATE", "WEBHOOK_RATE"} {
		e := maps.Clone(twilio)
		e[env] = "abc"
		if _, stderr, code := cli(t, e, "worker"); code != 2 || !strings.Contains(stderr, env+`="abc" must be a number of messages per second`) {
			t.Errorf("%s=abc: exit %d, %q; want 2 naming it", env, code, stderr)
		}
	}
}

// A command given too few or too many arguments says what it needs and how to give it (exit 2).
func TestMissingArgumentsAreNamed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"resume"}, "campaignctl resume needs a campaign ID: e.g. `campaignctl resume 42`"},
		{[]string{"pause", "1", "2"}, "campaignctl pause takes one argument (a campaign ID), not 2 (1 2)"},
		{[]string{"cancel"}, "`campaignctl status` lists the campaigns"},
		{[]string{"report"}, "campaignctl report needs a campaign ID"},
		{[]string{"iys", "import"}, "campaignctl iys import needs a consent CSV file: e.g. `campaignctl iys import consents.csv`"},
		{[]string{"iys", "check"}, "campaignctl iys check needs an address"},
		{[]string{"status", "1", "2"}, "status takes at most one campaign ID"},
	} {
		out, stderr, code := cli(t, nil, tc.args...)
		if code != 2 || out != "" || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 2 saying %q", tc.args, code, out, stderr, tc.want)
		}
	}
}

// A scheduled launch whose consents are fresh now but will be older than --max-consent-age at its start
// is told so: its batches would stop at the start and wait in the DLQ for a sync, with nothing said before.
func TestAScheduledLaunchIsWarnedItsConsentsWillBeTooOldAtTheStart(t *testing.T) {
	t.Parallel()
	env, _ := badInputDB(t)
	audience := writeFile(t, "a.sql", "SELECT user_id, phone, first_name FROM customers")
	ist, err := time.LoadLocation("Europe/Istanbul")
	if err != nil {
		t.Fatal(err)
	}
	args := func(at time.Time) []string {
		return []string{"launch", "--name", "later", "--channel", "sms", "--audience", audience, "--message", testPrefix + "Merhaba {{.first_name}}",
			"--at", at.In(ist).Format("2006-01-02 15:04"), "--tz", "Europe/Istanbul", "--max-consent-age", "1h", "--dry-run"}
	}
	_, stderr, code := cli(t, env, args(time.Now().Add(3*time.Hour))...)
	if code != 0 || !strings.Contains(stderr, "older than --max-consent-age") || !strings.Contains(stderr, "iys sync") {
		t.Fatalf("a start 3 h ahead with consents good for 1 h: exit %d, stderr %q; want a warning naming iys sync", code, stderr)
	}
	if _, stderr, code = cli(t, env, args(time.Now().Add(10*time.Minute))...); code != 0 || strings.Contains(stderr, "older than --max-consent-age") {
		t.Fatalf("a start within the consents' age: exit %d, stderr %q; want no warning", code, stderr)
	}
}
