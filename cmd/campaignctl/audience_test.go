package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/internal/testdb"
)

// An audience query is whatever its author wrote. Run as the engine's superuser connection, these read a
// server file into the message, listed directories, imported files, reloaded the configuration, killed
// another session during a dry run, or (with dblink) deleted rows. Each is refused now, dry run or not, with
// exit 2 and a message that says what to do; nothing is written, nothing queued, and the other session,
// the audience and the engine's tables are as they were.
func TestAudienceProbesAreRefused(t *testing.T) {
	t.Parallel()
	env, count := badInputDB(t)
	ctx := context.Background()
	db := mustConnect(t, env["DATABASE_URL"])
	if _, err := db.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS dblink`); err != nil {
		t.Fatal(err)
	}
	// A session the probes may try to terminate.
	victim := mustConnect(t, env["DATABASE_URL"])
	var victimPID int
	if err := victim.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&victimPID); err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(env["DATABASE_URL"])
	dblinkTo := "dbname=" + strings.TrimPrefix(u.Path, "/") + " host=127.0.0.1 user=postgres"
	probes := map[string]string{
		"read a server file":                   `SELECT user_id, phone, pg_read_file('/etc/passwd') AS first_name FROM customers`,
		"list a directory":                     `SELECT user_id, phone, (SELECT string_agg(f, ',') FROM pg_ls_dir('/') f) AS first_name FROM customers`,
		"import a file":                        `SELECT user_id, phone, lo_import('/etc/passwd')::text AS first_name FROM customers`,
		"reload the configuration":             `SELECT user_id, phone, pg_reload_conf()::text AS first_name FROM customers`,
		"terminate another session":            `SELECT user_id, phone, pg_terminate_backend(` + strconv.Itoa(victimPID) + `)::text AS first_name FROM customers`,
		"delete through dblink":                `SELECT user_id, phone, dblink_exec('` + dblinkTo + `', 'DELETE FROM customers') AS first_name FROM customers`,
		"read the codes":                       `SELECT user_id, phone, (SELECT string_agg(code, ',') FROM promo_codes) AS first_name FROM customers`,
		"read the consents":                    `SELECT user_id, phone, (SELECT string_agg(status, ',') FROM iys_consents) AS first_name FROM customers`,
		"read the audit":                       `SELECT user_id, phone, (SELECT count(*) FROM send_log)::text AS first_name FROM customers`,
		"take the role back":                   `SELECT user_id, phone, set_config('role', 'postgres', true) AS first_name FROM customers`,
		"take the role back, then read a file": `SELECT user_id, phone, set_config('role', 'postgres', true) || query_to_xml('SELECT pg_read_file(''/etc/passwd'') AS f', false, false, '')::text AS first_name FROM customers`,
		"become another session user":          `SELECT user_id, phone, set_config('session_authorization', 'postgres', true) AS first_name FROM customers`,
	}
	i := 0
	for name, sql := range probes {
		audience := writeFile(t, "probe.sql", sql)
		for _, mode := range []string{"--dry-run", "--yes"} {
			i++
			stdout, stderr, code := cli(t, env, "launch", "--name", "probe-"+strconv.Itoa(i), "--channel", "sms", "--audience", audience,
				"--message", testPrefix+"Merhaba {{.first_name}}", mode)
			if code != 2 {
				t.Errorf("%s (%s): exit %d, want 2\nstdout: %s\nstderr: %s", name, mode, code, stdout, stderr)
				continue
			}
			if strings.Contains(stdout+stderr, "root:") {
				t.Errorf("%s (%s): a server file reached the output:\n%s%s", name, mode, stdout, stderr)
			}
			if !strings.Contains(stderr, "audience") {
				t.Errorf("%s (%s): the error does not say what is wrong with the audience:\n%s", name, mode, stderr)
			}
			// What each is said to be: an engine table is never to be granted, a role change is one.
			if want, ok := map[string]string{
				"read the codes": "is one of the engine's own tables", "read the consents": "is one of the engine's own tables",
				"read the audit": "is one of the engine's own tables", "take the role back": "tried to change its role",
				"become another session user": "tried to change its role",
			}[name]; ok && (!strings.Contains(stderr, want) || strings.Contains(stderr, "GRANT")) {
				t.Errorf("%s (%s): the error does not say %q (or advises a grant):\n%s", name, mode, want, stderr)
			}
			// A probe of a function or a file is not fixed by granting a table (the audience's is granted).
			if strings.Contains(stderr, "GRANT SELECT ON customers") {
				t.Errorf("%s (%s): the error tells to grant the audience table it already reads:\n%s", name, mode, stderr)
			}
		}
	}
	if n := count(`SELECT count(*) FROM campaigns`); n != 0 {
		t.Errorf("refused launches left %d campaigns", n)
	}
	if n := count(`SELECT count(*) FROM customers`); n != 3 {
		t.Errorf("the audience table has %d rows, want its 3", n)
	}
	if n := count(`SELECT count(*) FROM pg_largeobject_metadata`); n != 0 {
		t.Errorf("%d large objects imported", n)
	}
	if err := victim.Ping(ctx); err != nil {
		t.Errorf("the other session was terminated: %v", err)
	}
	if q := mustRedis(t, env["REDIS_URL"]).Keys(ctx, "asynq:*").Val(); len(q) != 0 {
		t.Errorf("refused launches queued something: %v", q)
	}
	// The same audience without the probe goes through, as the audience role.
	audience := writeFile(t, "ok.sql", `SELECT user_id, phone, first_name FROM customers`)
	if _, stderr, code := cli(t, env, "launch", "--name", "fine", "--channel", "sms", "--audience", audience,
		"--message", testPrefix+"Merhaba {{.first_name}}", "--dry-run"); code != 0 {
		t.Fatalf("a plain audience was refused: %s", stderr)
	}
	// A table the audience role was not granted is named, with the grant to give.
	if _, err := db.Exec(ctx, `CREATE TABLE vip (user_id text, phone text, first_name text)`); err != nil {
		t.Fatal(err)
	}
	audience = writeFile(t, "vip.sql", `SELECT user_id, phone, first_name FROM vip`)
	_, stderr, code := cli(t, env, "launch", "--name", "vip", "--channel", "sms", "--audience", audience,
		"--message", testPrefix+"Merhaba {{.first_name}}", "--dry-run")
	if code != 2 || !strings.Contains(stderr, "GRANT SELECT ON vip TO campaignctl_audience") {
		t.Fatalf("audience on an ungranted table: exit %d, %s; want exit 2 naming the grant", code, stderr)
	}
	// A schema the audience role may not use: the grant to give is the schema's.
	if _, err := db.Exec(ctx, `CREATE SCHEMA crm; CREATE TABLE crm.people (user_id text, phone text, first_name text)`); err != nil {
		t.Fatal(err)
	}
	audience = writeFile(t, "crm.sql", `SELECT user_id, phone, first_name FROM crm.people`)
	_, stderr, code = cli(t, env, "launch", "--name", "crm", "--channel", "sms", "--audience", audience,
		"--message", testPrefix+"Merhaba {{.first_name}}", "--dry-run")
	if code != 2 || !strings.Contains(stderr, "GRANT USAGE ON SCHEMA crm TO campaignctl_audience") {
		t.Fatalf("audience in a schema not granted: exit %d, %s; want exit 2 naming the schema's grant", code, stderr)
	}
}

// An audience database of its own (AUDIENCE_DATABASE_URL) without the audience role's function: as a
// superuser the launch is refused and says what to do; --allow-privileged-audience goes ahead and is
// recorded; a login role that may only read the audience is used as it is.
func TestAudienceOfItsOwnDatabaseRunsOnlyAsARestrictedRole(t *testing.T) {
	t.Parallel()
	env, count := badInputDB(t)
	ctx := context.Background()
	_, audURL := testdb.New(t)
	aud := mustConnect(t, audURL)
	role := "aud_" + randHex(4)
	for _, sql := range []string{
		`DROP SCHEMA campaignctl_audience CASCADE`, // a database that is only an audience
		`CREATE TABLE customers AS SELECT 'a' AS user_id, '+905321000001' AS phone, 'Ada' AS first_name`,
		`CREATE ROLE ` + role + ` LOGIN`,
		`GRANT SELECT ON customers TO ` + role,
	} {
		if _, err := aud.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		ctx := context.Background()
		aud.Exec(ctx, `REVOKE ALL ON customers, refusals, iys_outbox FROM `+role) //nolint:errcheck
		c, err := pgx.Connect(ctx, testdb.AdminURL())
		if err == nil {
			c.Exec(ctx, `DROP ROLE IF EXISTS `+role) //nolint:errcheck
			c.Close(ctx)
		}
	})
	audience := writeFile(t, "a.sql", `SELECT user_id, phone, first_name FROM customers`)
	launch := func(audienceURL string, extra ...string) (string, string, int) {
		e := map[string]string{}
		for k, v := range env {
			e[k] = v
		}
		e["AUDIENCE_DATABASE_URL"] = audienceURL
		args := append([]string{"launch", "--name", "own-" + randHex(3), "--channel", "sms", "--audience", audience,
			"--message", testPrefix + "Merhaba {{.first_name}}", "--yes"}, extra...)
		return cli(t, e, args...)
	}
	_, stderr, code := launch(audURL)
	if code != 2 || !strings.Contains(stderr, "is a superuser") || !strings.Contains(stderr, "--allow-privileged-audience") ||
		!strings.Contains(stderr, "AUDIENCE_DATABASE_URL") {
		t.Fatalf("superuser audience: exit %d, %s", code, stderr)
	}
	if n := count(`SELECT count(*) FROM campaigns`); n != 0 {
		t.Fatalf("the refused launch left %d campaigns", n)
	}
	if _, stderr, code = launch(audURL, "--allow-privileged-audience"); code != 0 {
		t.Fatalf("--allow-privileged-audience: exit %d, %s", code, stderr)
	}
	if n := count(`SELECT count(*) FROM campaigns WHERE privileged_audience`); n != 1 {
		t.Fatalf("%d campaigns record a privileged audience, want 1", n)
	}
	restricted, _ := url.Parse(audURL)
	restricted.User = url.User(role)
	if _, stderr, code = launch(restricted.String()); code != 0 {
		t.Fatalf("audience as a restricted login role: exit %d, %s", code, stderr)
	}
	if n := count(`SELECT count(*) FROM campaigns WHERE NOT privileged_audience`); n != 1 {
		t.Fatalf("%d campaigns launched without privilege, want 1", n)
	}
	// A read of any engine table, even of one column of it, is a power the audience may not have: the
	// refusals were not on the list, and an audience that could read them put every refused address into
	// a message.
	for table, grant := range map[string]string{"refusals": `GRANT SELECT ON refusals TO `, "iys_outbox": `GRANT SELECT (recipient) ON iys_outbox TO `} {
		if _, err := aud.Exec(ctx, grant+role); err != nil {
			t.Fatal(err)
		}
		_, stderr, code = launch(restricted.String())
		if code != 2 || !strings.Contains(stderr, "may read the engine's tables ("+table+")") {
			t.Errorf("audience role after %s: exit %d, %s; want exit 2 naming %s", grant, code, stderr, table)
		}
		if _, err := aud.Exec(ctx, `REVOKE ALL ON `+table+` FROM `+role); err != nil {
			t.Fatal(err)
		}
	}
	// The audience database has the engine's schema, whose audience function the login role may not
	// reach (no USAGE on the schema): it runs as that role, as on a database of its own, instead of failing
	// on the schema's permission (exit 1).
	if _, err := aud.Exec(ctx, `CREATE SCHEMA campaignctl_audience`); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code = launch(restricted.String()); code != 0 {
		t.Fatalf("audience as a login role without the audience schema's USAGE: exit %d, %s", code, stderr)
	}
}

func mustConnect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func mustRedis(t *testing.T, u string) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	return c
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b) //nolint:errcheck // crypto/rand does not fail
	return hex.EncodeToString(b)
}

// A launch with no terminal to ask (a pipe, cron, CI) and no --yes sends nothing and writes nothing: like
// gh, kubectl delete and terraform apply, it acts unattended only when told to. A dry run needs no --yes.
func TestUnattendedLaunchNeedsYes(t *testing.T) {
	t.Parallel()
	env, count := badInputDB(t)
	audience := writeFile(t, "a.sql", `SELECT user_id, phone, first_name FROM customers`)
	args := []string{"launch", "--name", "cron", "--channel", "sms", "--audience", audience, "--message", testPrefix + "Merhaba {{.first_name}}"}
	var out, errb strings.Builder
	code := run(args, func(k string) string { return env[k] }, strings.NewReader("n\n"), &out, &errb)
	if code != 2 || !strings.Contains(errb.String(), "--yes") || !strings.Contains(errb.String(), "nothing was written or sent") {
		t.Fatalf("launch without a terminal and without --yes: exit %d\n%s%s", code, out.String(), errb.String())
	}
	if n := count(`SELECT count(*) FROM campaigns`); n != 0 {
		t.Fatalf("the refused launch left %d campaigns", n)
	}
	if q := mustRedis(t, env["REDIS_URL"]).Keys(context.Background(), "asynq:*").Val(); len(q) != 0 {
		t.Fatalf("the refused launch queued %v", q)
	}
	if _, stderr, code := cli(t, env, append(args, "--dry-run")...); code != 0 {
		t.Fatalf("a dry run without --yes: exit %d, %s", code, stderr)
	}
	if _, stderr, code := cli(t, env, append(args, "--yes")...); code != 0 {
		t.Fatalf("with --yes: exit %d, %s", code, stderr)
	}
	if n := count(`SELECT count(*) FROM campaigns`); n != 1 {
		t.Fatalf("%d campaigns after the launch with --yes, want 1", n)
	}
}
