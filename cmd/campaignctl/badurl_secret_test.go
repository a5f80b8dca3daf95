package main

import (
	"strings"
	"testing"
)

// Bad input (a directory where the consent CSV goes) is exit 2 with a message naming the fix, as
// `codes import DIR` does; nothing written.
func TestIYSImportOfADirectoryIsBadInput(t *testing.T) {
	t.Parallel()
	env, count := badInputDB(t)
	before := count(`SELECT count(*) FROM iys_consents`)
	dir := t.TempDir()
	stdout, stderr, code := cli(t, env, "iys", "import", dir)
	t.Logf("exit %d\nstdout: %q\nstderr: %s", code, stdout, stderr)
	if code != 2 {
		t.Errorf("iys import %s: exit %d, want 2 (bad input)", dir, code)
	}
	if !strings.Contains(stderr, "directory") {
		t.Errorf("stderr does not say it is a directory: %s", stderr)
	}
	if n := count(`SELECT count(*) FROM iys_consents`); n != before {
		t.Errorf("consents changed: %d -> %d", before, n)
	}
}

// Secrets never in output: a DATABASE_URL that Postgres's own syntax lets carry the password outside the
// user-info part (a password= query parameter, or a keyword/value DSN) and that is otherwise bad must not
// be echoed with its password.
func TestABadDatabaseURLDoesNotPrintItsPassword(t *testing.T) {
	t.Parallel()
	for _, u := range []string{
		"postgres://app@127.0.0.1:5432/engine?sslmode=bogus&password=S3cretPW",
		"host=127.0.0.1 port=abc user=app password=S3cretPW dbname=engine",
		// An '@' in the password that is not percent-encoded: the tail is taken for the host, and the
		// resolver's error quoted it.
		"postgres://app:pw@S3cretPW@127.0.0.1:5432/engine",
		// libpq's escapes: a space kept by a backslash, and a quote left open; each masked to its end.
		`host=127.0.0.1 user=app password=S3cretPW\ MARKPW sslmode=bogus dbname=engine`,
		`host=127.0.0.1 user=app password='S3cretPW MARKPW sslmode=bogus dbname=engine`,
	} {
		stdout, stderr, code := cli(t, map[string]string{"DATABASE_URL": u, "REDIS_URL": "redis://127.0.0.1:6379/15"}, "migrate")
		t.Logf("DATABASE_URL=%s: exit %d\nstderr: %s", u, code, stderr)
		if strings.Contains(stdout+stderr, "S3cretPW") || strings.Contains(stdout+stderr, "MARKPW") {
			t.Errorf("migrate printed the database password (exit %d): %s", code, stderr)
		}
		if strings.Contains(u, "pw@") && (code != 2 || !strings.Contains(stderr, "%40")) {
			t.Errorf("a password with a bare '@': exit %d, %s; want 2, saying to percent-encode it", code, stderr)
		}
	}
}

// An audience query that fails on a value (a phone column cast to a number) gets Postgres's error with
// the value masked: the value is a phone number or an e-mail address as often as not. Exit 2, nothing
// written.
func TestAnAudienceErrorMasksTheValueItQuotes(t *testing.T) {
	t.Parallel()
	env, campaigns := badInputEnv(t)
	for _, col := range []string{"phone::int", "(replace(phone, '+', 'x') || '@example.com')::int"} {
		audience := writeFile(t, "a.sql", "SELECT user_id, phone, "+col+" AS n FROM customers")
		_, stderr, code := cli(t, env, "launch", "--name", "x", "--channel", "sms", "--audience", audience,
			"--message", testPrefix+"Merhaba {{.n}}", "--dry-run")
		if code != 2 || !strings.Contains(stderr, "the audience query failed") {
			t.Fatalf("%s: exit %d, %s; want 2 and the query's error", col, code, stderr)
		}
		for _, addr := range []string{"+905321000001", "905321000001", "x905321000001"} {
			if strings.Contains(stderr, addr) {
				t.Errorf("%s: the error shows %q: %s", col, addr, stderr)
			}
		}
	}
	if n := campaigns(); n != 0 {
		t.Errorf("%d campaigns written", n)
	}
}
