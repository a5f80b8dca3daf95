package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Input past the bounds is refused fast, with exit 2, a message naming the bound and the fix, and nothing
// written: a device given as the audience or HTML file, a huge column value, a template that loops a
// billion times, an SMS longer than --max-segments or than providers take.
func TestBoundsAreRefusedWithNothingWritten(t *testing.T) {
	t.Parallel()
	env, count := badInputDB(t)
	audience := writeFile(t, "a.sql", `SELECT user_id, phone, first_name FROM customers`)
	huge := writeFile(t, "huge.sql", `SELECT user_id, phone, repeat('x', 50000000) AS first_name FROM customers`)
	long := strings.Repeat("Çok uzun bir mesaj ", 53) // 1,007 characters, UCS-2: 16 segments
	launch := func(extra ...string) []string {
		return append([]string{"launch", "--name", "b", "--channel", "sms", "--audience", audience,
			"--message", testPrefix + "Merhaba {{.first_name}}", "--yes"}, extra...)
	}
	for _, tc := range []struct {
		name string
		args []string
		says []string
	}{
		{"audience file is a device", append(launch(), "--audience", "/dev/zero"), []string{"larger than 1024 KiB", "one SELECT"}},
		{"html file is a device", []string{"launch", "--name", "b", "--channel", "email", "--audience", audience, "--subject", "s",
			"--message", "m", "--html", "/dev/zero", "--yes"}, []string{"--html", "larger than 1024 KiB"}},
		{"a 50 MB value", append(launch(), "--audience", huge), []string{"first_name", "more than 64 KiB", "left(first_name"}},
		{"a billion loops", append(launch(), "--message", testPrefix+"{{range 1000000000}}x{{end}}"), []string{"more than 1000 items"}},
		{"sixteen segments", append(launch(), "--message", testPrefix+long), []string{"16 SMS segments", "--max-segments 10"}},
		{"more than providers take", append(launch(), "--message", testPrefix+long+long, "--max-segments", "24"), []string{"more than the 1600"}},
		{"max segments out of range", append(launch(), "--max-segments", "30"), []string{"--max-segments 30", "between 1 and 24"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			stdout, stderr, code := cli(t, env, tc.args...)
			if code != 2 {
				t.Fatalf("exit %d, want 2\nstdout: %s\nstderr: %s", code, stdout, stderr)
			}
			for _, s := range tc.says {
				if !strings.Contains(stderr, s) {
					t.Errorf("stderr does not say %q:\n%s", s, stderr)
				}
			}
			// A huge value is refused once the database has produced its row: the restricted audience
			// function materialises the query's result first, which takes seconds on a loaded machine.
			if took := time.Since(start); took > 30*time.Second {
				t.Errorf("refused after %v", took)
			}
		})
	}
	if n := count(`SELECT count(*) FROM campaigns`); n != 0 {
		t.Fatalf("refused launches left %d campaigns", n)
	}
	// Four segments go out, with a warning in the dry run.
	four := strings.Repeat("ı", 200)
	_, stderr, code := cli(t, env, "launch", "--name", "four", "--channel", "sms", "--audience", audience,
		"--message", testPrefix+four, "--dry-run")
	if code != 0 || !strings.Contains(stderr, "warning: each message takes 4 SMS segments") {
		t.Fatalf("a four-segment dry run: exit %d, %s", code, stderr)
	}
}

// SIGTERM stops a launch while its audience query runs: it exits at once with nothing written, no
// campaign and no code reserved.
func TestSIGTERMStopsALaunchWithNothingWritten(t *testing.T) {
	t.Parallel()
	env, count := badInputDB(t)
	if _, err := mustConnect(t, env["DATABASE_URL"]).Exec(context.Background(), `INSERT INTO promo_codes (pool, code) VALUES ('small', 'X3')`); err != nil {
		t.Fatal(err)
	}
	audience := writeFile(t, "slow.sql", `SELECT user_id, phone, first_name FROM customers, pg_sleep(30)`)
	cmd := exec.Command(binary(t), "launch", "--name", "slow", "--channel", "sms", "--audience", audience, "--code-pool", "small",
		"--message", testPrefix+"Merhaba {{.first_name}} {{.code}}", "--yes")
	cmd.Env = os.Environ()
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, func() bool {
		return count(`SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND datname = current_database()`) > 0
	})
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		cmd.Process.Kill() //nolint:errcheck
		t.Fatal("the launch did not stop within 10 s of SIGTERM")
	}
	if cmd.ProcessState.ExitCode() == 0 {
		t.Fatalf("the interrupted launch exited 0: %s", stderr.String())
	}
	t.Logf("stopped %v after SIGTERM: %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(stderr.String()))
	if n := count(`SELECT count(*) FROM campaigns`); n != 0 {
		t.Fatalf("the interrupted launch left %d campaigns", n)
	}
	if n := count(`SELECT count(*) FROM campaign_recipients`); n != 0 {
		t.Fatalf("the interrupted launch left %d recipients", n)
	}
	waitFor(t, 10*time.Second, func() bool {
		return count(`SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND datname = current_database()`) == 0
	})
}

// A line break in a header is refused at launch (the subject, the sender's name), and a recipient whose
// value would put one into the subject is excluded (invalid_value) while the others go ahead.
func TestHeaderValuesCarryNoLineBreak(t *testing.T) {
	t.Parallel()
	env, count := badInputDB(t)
	env["WEBHOOKS_PUBLIC_URL"], env["UNSUBSCRIBE_SECRET"] = "https://hooks.example.com", "bounds-test-secret-0123456789"
	db := mustConnect(t, env["DATABASE_URL"])
	for _, sql := range []string{
		`CREATE TABLE mail (user_id text, email text, first_name text)`,
		`GRANT SELECT ON mail TO campaignctl_audience`,
		"INSERT INTO mail VALUES ('a', 'a@example.com', 'Ada'), ('b', 'b@example.com', E'Ali\\r\\nBcc: all@example.com'), ('c', 'c@example.com', E'Cem\\nX-Evil: 1')",
		`INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date) SELECT email, 'EPOSTA', 'BIREYSEL', 'ONAY', 'HS_WEB', now() FROM mail`,
	} {
		if _, err := db.Exec(context.Background(), sql); err != nil {
			t.Fatal(err)
		}
	}
	audience := writeFile(t, "mail.sql", `SELECT user_id, email, first_name FROM mail`)
	mail := func(subject string, extra ...string) []string {
		return append([]string{"launch", "--name", "m", "--channel", "email", "--audience", audience, "--subject", subject,
			"--message", "Merhaba {{.first_name}}"}, extra...)
	}
	if _, stderr, code := cli(t, env, mail("Hi\r\nBcc: all@example.com", "--yes")...); code != 2 || !strings.Contains(stderr, "line break") {
		t.Fatalf("a subject with a line break: exit %d, %s", code, stderr)
	}
	withName := map[string]string{"SENDGRID_FROM_NAME": "ACME\r\nBcc: all@example.com"}
	for k, v := range env {
		withName[k] = v
	}
	if _, stderr, code := cli(t, withName, mail("Merhaba {{.first_name}}", "--yes")...); code != 2 || !strings.Contains(stderr, "SENDGRID_FROM_NAME") {
		t.Fatalf("a sender name with a line break: exit %d, %s", code, stderr)
	}
	if n := count(`SELECT count(*) FROM campaigns`); n != 0 {
		t.Fatalf("refused launches left %d campaigns", n)
	}
	out, stderr, code := cli(t, env, mail("Merhaba {{.first_name}}", "--dry-run", "--json")...)
	if code != 0 {
		t.Fatalf("dry run: exit %d, %s", code, stderr)
	}
	var rep struct {
		Eligible int64            `json:"eligible"`
		Excluded map[string]int64 `json:"excluded"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Eligible != 1 || rep.Excluded["invalid_value"] != 2 {
		t.Fatalf("report %+v, want a eligible and b, c excluded as invalid_value", rep)
	}
	// In the body (not a header), a line break is just text.
	out, _, code = cli(t, env, "launch", "--name", "m2", "--channel", "email", "--audience", audience, "--subject", "Merhaba",
		"--message", "Merhaba {{.first_name}}", "--dry-run", "--json")
	if err := json.Unmarshal([]byte(out), &rep); code != 0 || err != nil || rep.Eligible != 3 {
		t.Fatalf("line breaks in the body only: exit %d, %+v, %v", code, rep, err)
	}
}

// A commercial e-mail launch without what its one-click unsubscribe links need is refused, naming the
// fix, and writes nothing; a transactional one needs none.
func TestCommercialEmailLaunchNeedsUnsubscribeLinks(t *testing.T) {
	t.Parallel()
	env, count := badInputDB(t)
	audience := mailAudience(t, env, "('a', 'a@example.com')")
	args := []string{"launch", "--name", "m", "--channel", "email", "--audience", audience, "--subject", "Merhaba", "--message", "Size özel", "--yes"}
	with := func(kv ...string) map[string]string {
		e := map[string]string{}
		for k, v := range env {
			e[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			e[kv[i]] = kv[i+1]
		}
		return e
	}
	for _, c := range []struct {
		env  map[string]string
		want string
	}{
		{env, "set WEBHOOKS_PUBLIC_URL"},
		{with("WEBHOOKS_PUBLIC_URL", "https://hooks.example.com"), "UNSUBSCRIBE_SECRET is not"},
		{with("UNSUBSCRIBE_SECRET", "a-secret-of-enough-length-0123"), "WEBHOOKS_PUBLIC_URL is not"},
		{with("UNSUBSCRIBE_SECRET", "short", "WEBHOOKS_PUBLIC_URL", "https://hooks.example.com"), "shorter than 16 bytes"},
		{with("UNSUBSCRIBE_SECRET", "a-secret-of-enough-length-0123", "WEBHOOKS_PUBLIC_URL", "https://user:pw@hooks.example.com"), "no user, password"},
	} {
		_, stderr, code := cli(t, c.env, args...)
		if code != 2 || !strings.Contains(stderr, c.want) || strings.Contains(stderr, "a-secret-of-enough") || strings.Contains(stderr, ":pw@") {
			t.Errorf("launch: exit %d, %s; want 2 naming %q, no secret", code, stderr, c.want)
		}
	}
	if n := count(`SELECT count(*) FROM campaigns`); n != 0 {
		t.Fatalf("refused launches left %d campaigns", n)
	}
	if _, stderr, code := cli(t, env, append(args[:len(args)-1], "--transactional", "--dry-run")...); code != 0 {
		t.Fatalf("a transactional e-mail needs no unsubscribe link: exit %d, %s", code, stderr)
	}
	// A transactional message cannot show a link it has not.
	bad := []string{"launch", "--name", "m", "--channel", "email", "--audience", audience, "--subject", "Merhaba", "--message", "Çık: {{.unsubscribe_url}}", "--transactional", "--dry-run"}
	if _, stderr, code := cli(t, env, bad...); code != 2 || !strings.Contains(stderr, "a transactional e-mail does not have") {
		t.Fatalf("a transactional template with {{.unsubscribe_url}}: exit %d, %s", code, stderr)
	}
}

// mailAudience makes the table mail (user_id, email) of the bad-input database with the given VALUES, each
// address with an ONAY, and returns an audience file that selects it.
func mailAudience(t *testing.T, env map[string]string, values string) string {
	t.Helper()
	db := mustConnect(t, env["DATABASE_URL"])
	for _, sql := range []string{
		`CREATE TABLE mail (user_id text, email text)`,
		`GRANT SELECT ON mail TO campaignctl_audience`,
		"INSERT INTO mail VALUES " + values,
		`INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date) SELECT email, 'EPOSTA', 'BIREYSEL', 'ONAY', 'HS_WEB', now() FROM mail`,
	} {
		if _, err := db.Exec(context.Background(), sql); err != nil {
			t.Fatal(err)
		}
	}
	return writeFile(t, "mail.sql", `SELECT user_id, email FROM mail`)
}
