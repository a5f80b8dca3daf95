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
	} {
		stdout, stderr, code := cli(t, map[string]string{"DATABASE_URL": u, "REDIS_URL": "redis://127.0.0.1:6379/15"}, "migrate")
		t.Logf("DATABASE_URL=%s: exit %d\nstderr: %s", u, code, stderr)
		if strings.Contains(stdout+stderr, "S3cretPW") {
			t.Errorf("migrate printed the database password (exit %d): %s", code, stderr)
		}
	}
}
