package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/campaignctl/campaignctl/internal/testdb"
)

// What a careful user expects of the small cases: refused with the fix (exit 2, nothing written) where
// going ahead would surprise, accepted where the intent is plain.
func TestSafeDefaults(t *testing.T) {
	t.Parallel()
	env, count := badInputDB(t)
	audience := writeFile(t, "a.sql", `SELECT user_id, phone, first_name FROM customers`)
	nobody := writeFile(t, "none.sql", `SELECT user_id, phone, first_name FROM customers WHERE false`)
	launch := func(extra ...string) []string {
		return append([]string{"launch", "--name", "s", "--channel", "sms", "--audience", audience,
			"--message", testPrefix + "Merhaba {{.first_name}}"}, extra...)
	}
	with := func(k, v string) map[string]string {
		e := map[string]string{k: v}
		for k, v := range env {
			if _, ok := e[k]; !ok {
				e[k] = v
			}
		}
		return e
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		says []string
	}{
		{"codes nobody sees", env, append(launch("--code-pool", "small"), "--yes"), []string{"never shows {{.code}}", "drop --code-pool"}},
		{"nobody in the audience", env, append(launch("--audience", nobody), "--yes"), []string{"returned no rows", "nothing was written"}},
		{"nobody eligible", env, append(launch("--recipient-type", "TACIR"), "--yes"), []string{"none of the audience's 3 rows is eligible", "no_consent 3"}},
		{"consents without the brand", with("IYS_BRAND_CODE", "123456"), append(launch("--max-consent-age", "0"), "--yes"),
			[]string{`IYS_BRAND_CODE is "123456"`, "3 recipients", "without a brand", "Import the consent file again"}},
		{"not a duration", env, append(launch("--frequency-cap", "1x"), "--yes"), []string{"1d, 7d, 36h"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, code := cli(t, tc.env, tc.args...)
			if code != 2 {
				t.Fatalf("exit %d, want 2\nstdout: %s\nstderr: %s", code, stdout, stderr)
			}
			for _, s := range tc.says {
				if !strings.Contains(stderr, s) {
					t.Errorf("stderr does not say %q:\n%s", s, stderr)
				}
			}
		})
	}
	if n := count(`SELECT count(*) FROM campaigns`); n != 0 {
		t.Fatalf("refused launches left %d campaigns", n)
	}
	// A dry run of nobody says so and exits 0.
	if _, stderr, code := cli(t, env, launch("--audience", nobody, "--dry-run")...); code != 0 || !strings.Contains(stderr, "no recipient is eligible") {
		t.Fatalf("dry run of nobody: exit %d, %s", code, stderr)
	}
	// Days are a unit: 1d is 24 hours, 7d a week.
	out, stderr, code := cli(t, env, launch("--frequency-cap", "7d", "--max-consent-age", "2d", "--dry-run", "--json")...)
	var rep struct {
		Eligible int64 `json:"eligible"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &rep) != nil || rep.Eligible != 3 {
		t.Fatalf("--frequency-cap 7d: exit %d, %s%s", code, out, stderr)
	}
	// Pool names are lower case; ACC is acc wherever a pool is named.
	if _, stderr, code := cli(t, env, "codes", "generate", "--pool", "ACC", "--count", "5"); code != 0 {
		t.Fatalf("codes generate --pool ACC: exit %d, %s", code, stderr)
	}
	if n := count(`SELECT count(*) FROM promo_codes WHERE pool = 'acc'`); n != 5 {
		t.Fatalf("%d codes in pool acc, want 5", n)
	}
	if _, stderr, code := cli(t, env, "launch", "--name", "acc", "--channel", "sms", "--audience", audience, "--code-pool", "Acc",
		"--message", testPrefix+"Merhaba {{.first_name}} {{.code}}", "--yes"); code != 0 {
		t.Fatalf("launch --code-pool Acc: exit %d, %s", code, stderr)
	}
}

// A database that was never migrated (or by an older version) is named as such, with the command that
// fixes it, by every command that uses it; the worker does not start on it.
func TestUnmigratedDatabaseSaysToMigrate(t *testing.T) {
	t.Parallel()
	env, _ := badInputDB(t)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, testdb.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	name := "campaignctl_bare_" + randHex(4)
	if _, err := admin.Exec(ctx, `CREATE DATABASE `+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// admin is closed by then (deferred above): the drop needs a connection of its own.
		c, err := pgx.Connect(context.Background(), testdb.AdminURL())
		if err != nil {
			t.Logf("database %s left behind: %v", name, err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(context.Background(), `DROP DATABASE IF EXISTS `+name+` WITH (FORCE)`); err != nil {
			t.Logf("database %s left behind: %v", name, err)
		}
	})
	bare := map[string]string{}
	for k, v := range env {
		bare[k] = v
	}
	bare["DATABASE_URL"] = strings.Replace(env["DATABASE_URL"], dbName(env["DATABASE_URL"]), name, 1)
	bare["TWILIO_ACCOUNT_SID"], bare["TWILIO_AUTH_TOKEN"], bare["TWILIO_FROM"] = "ACbare000000000000000000000000000", "token", "+905550000000"
	audience := writeFile(t, "a.sql", `SELECT 'u' AS user_id, '+905321000001' AS phone`)
	for _, args := range [][]string{
		{"status"},
		{"launch", "--name", "x", "--channel", "sms", "--audience", audience, "--message", testPrefix + "Merhaba", "--yes"},
		{"worker", "--concurrency", "1"},
		{"codes", "stats"},
	} {
		_, stderr, code := cli(t, bare, args...)
		if code != 2 || !strings.Contains(stderr, "no campaignctl schema") || !strings.Contains(stderr, "campaignctl migrate") {
			t.Errorf("%v on an unmigrated database: exit %d, %s", args, code, stderr)
		}
	}
	// One migration short: named, and migrate fixes it.
	if _, stderr, code := cli(t, bare, "migrate"); code != 0 {
		t.Fatalf("migrate: exit %d, %s", code, stderr)
	}
	db := mustConnect(t, bare["DATABASE_URL"])
	if _, err := db.Exec(ctx, `DELETE FROM schema_migrations WHERE name = (SELECT max(name) FROM schema_migrations)`); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := cli(t, bare, "status"); code != 2 || !strings.Contains(stderr, "1 migration of this version is not applied") {
		t.Fatalf("status one migration short: exit %d, %s", code, stderr)
	}
}

func dbName(u string) string {
	s := u[strings.LastIndex(u, "/")+1:]
	if i := strings.IndexByte(s, '?'); i >= 0 {
		s = s[:i]
	}
	return s
}

// migrate creates the engine database when the server has none of that name, and says so; run again, it
// finds the schema up to date.
func TestMigrateCreatesTheDatabase(t *testing.T) {
	t.Parallel()
	env, _ := badInputDB(t)
	name := "campaignctl_new_" + randHex(4)
	t.Cleanup(func() {
		ctx := context.Background()
		if c, err := pgx.Connect(ctx, testdb.AdminURL()); err == nil {
			c.Exec(ctx, `DROP DATABASE IF EXISTS `+name+` WITH (FORCE)`) //nolint:errcheck
			c.Close(ctx)
		}
	})
	fresh := map[string]string{"DATABASE_URL": strings.Replace(env["DATABASE_URL"], dbName(env["DATABASE_URL"]), name, 1)}
	out, stderr, code := cli(t, fresh, "migrate")
	if code != 0 || !strings.Contains(out, "created database "+name) || !strings.Contains(out, "applied 0001_init") {
		t.Fatalf("migrate of a database that does not exist: exit %d\n%s%s", code, out, stderr)
	}
	if out, _, code := cli(t, fresh, "migrate"); code != 0 || strings.TrimSpace(out) != "schema is up to date" {
		t.Fatalf("second migrate: exit %d, %s", code, out)
	}
}

// A launch without IYS_BRAND_CODE reads the consents recorded without a brand; a RET that `iys sync`
// recorded under the brand for one of its eligible recipients would go unseen: refused with the fix,
// nothing written. A brand's ONAY beside the unbranded one changes nothing.
func TestALaunchWithoutABrandSeesNoRefusalRecordedUnderOne(t *testing.T) {
	t.Parallel()
	env, count := badInputDB(t)
	audience := writeFile(t, "a.sql", `SELECT user_id, phone, first_name FROM customers`)
	args := []string{"launch", "--name", "s", "--channel", "sms", "--audience", audience,
		"--message", testPrefix + "Merhaba {{.first_name}}", "--max-consent-age", "0", "--dry-run"}
	count(`WITH i AS (INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date, brand_code)
		VALUES ('+905321000001', 'MESAJ', 'BIREYSEL', 'ONAY', 'HS_WEB', now(), '654321') RETURNING 1) SELECT count(*) FROM i`)
	if _, stderr, code := cli(t, env, args...); code != 0 {
		t.Fatalf("a brand's ONAY beside the unbranded one: exit %d\n%s", code, stderr)
	}
	count(`WITH i AS (INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date, brand_code)
		VALUES ('+905321000002', 'MESAJ', 'BIREYSEL', 'RET', 'IYS_MOBIL', now(), '654321') RETURNING 1) SELECT count(*) FROM i`)
	for _, a := range [][]string{args, append(args[:len(args)-1:len(args)-1], "--yes")} {
		_, stderr, code := cli(t, env, a...)
		if code != 2 {
			t.Fatalf("%v: exit %d, want 2\n%s", a, code, stderr)
		}
		for _, s := range []string{"1 of its eligible recipients", "RET recorded under brand 654321", "IYS_BRAND_CODE=654321"} {
			if !strings.Contains(stderr, s) {
				t.Errorf("stderr does not say %q:\n%s", s, stderr)
			}
		}
	}
	if n := count(`SELECT count(*) FROM campaigns`); n != 0 {
		t.Fatalf("refused launches left %d campaigns", n)
	}
}
