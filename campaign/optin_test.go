package campaign_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testdb"
)

// The workers read push and webhook opt-ins at send time by running the audience query again for each
// chunk's users (OptIns.Read). The launch checks that the query can be run that way: one that picks its
// recipients by chance or position would have the workers skip most of them as revoked, so it is refused
// with the reason and the fix, nothing written. A query that selects by what the rows are launches, typed
// user IDs, a trailing semicolon and a last-line comment included, and its re-read sees a withdrawal.
func TestTheAudienceIsRunAgainForTheOptIns(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	mustExec(t, db, `CREATE TABLE devices AS SELECT i::bigint AS id, 'tok-' || i AS push_token, true AS push_opt_in FROM generate_series(1, 1000) i`)
	mustExec(t, db, `ALTER TABLE devices ADD PRIMARY KEY (id)`)
	mustExec(t, db, `GRANT SELECT ON devices TO campaignctl_audience`)
	p := &campaign.Planner{Engine: db, Audience: db}
	spec := func(name, sql string) campaign.Spec {
		return campaign.Spec{Name: name, Channel: campaign.ChannelPush, BatchSize: 100, AudienceSQL: sql,
			Subject: `Merhaba`, Message: `Size özel bir fırsat`}
	}
	for _, sql := range []string{
		`SELECT id AS user_id, push_token, push_opt_in FROM devices ORDER BY random() LIMIT 300`,
		`SELECT id AS user_id, push_token, push_opt_in FROM devices WHERE random() < 0.5`,
	} {
		_, err := p.Plan(ctx, spec("sample", sql))
		if !errors.Is(err, campaign.ErrInvalid) || !strings.Contains(err.Error(), "run again") || !strings.Contains(err.Error(), "ORDER BY random()") {
			t.Errorf("%s: %v; want the launch refused: the query cannot be run again for its recipients", sql, err)
		}
	}
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM campaigns`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d campaigns written by the refused launches (%v); want none", n, err)
	}

	rep, err := p.Plan(ctx, spec("by-rows", "SELECT id AS user_id, push_token, push_opt_in FROM devices WHERE id % 2 = 0; /* even */ -- even\n-- devices\n"))
	if err != nil {
		t.Fatalf("an audience selected by a condition: %v", err)
	}
	store := campaign.NewStore(db)
	c, err := store.Get(ctx, rep.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !c.ReadsOptIns() {
		t.Fatal("a commercial push campaign does not read its opt-ins again")
	}
	mustExec(t, db, `UPDATE devices SET push_opt_in = false WHERE id = 4`)
	mustExec(t, db, `DELETE FROM devices WHERE id = 6`)
	got, err := store.OptIns().Read(ctx, c, []string{"2", "4", "6", "8", "3"})
	if err != nil {
		t.Fatal(err)
	}
	var yes []string
	for _, u := range []string{"2", "4", "6", "8", "3"} {
		if got.OptedIn(u, "tok-"+u) {
			yes = append(yes, u)
		}
	}
	if !slices.Equal(yes, []string{"2", "8"}) {
		t.Fatalf("opted in now: %v; want 2 and 8 (4 withdrew, 6 is gone, 3 was never in the audience)", yes)
	}
}

// A re-read of the opt-ins runs the marketer's query on a pooled session of the audience database: what
// the query leaves on that session (a session advisory lock, a setting) must not outlive the read, or a
// lock the engine's code reservations wait for would be held for as long as the worker lives.
func TestAReadOfTheOptInsLeavesNothingOnItsSession(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	mustExec(t, db, `CREATE TABLE devices AS SELECT 'u' || i AS user_id, 'tok-' || i AS push_token, true AS push_opt_in FROM generate_series(1, 5) i`)
	mustExec(t, db, `GRANT SELECT ON devices TO campaignctl_audience`)
	rep, err := (&campaign.Planner{Engine: db, Audience: db}).Plan(ctx, campaign.Spec{Name: "locks", Channel: campaign.ChannelPush, BatchSize: 10,
		AudienceSQL: `SELECT user_id, push_token, push_opt_in FROM devices
			WHERE pg_try_advisory_lock(774411) IS NOT NULL AND set_config('application_name', 'audience', false) IS NOT NULL`,
		Subject: `Merhaba`, Message: `Size özel bir fırsat`})
	if err != nil {
		t.Fatal(err)
	}
	store := campaign.NewStore(db)
	c, err := store.Get(ctx, rep.ID)
	if err != nil {
		t.Fatal(err)
	}
	got, err := store.OptIns().Read(ctx, c, []string{"u1", "u2"})
	if err != nil || len(got) != 2 {
		t.Fatalf("read %v (%v); want u1 and u2", got, err)
	}
	var held int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 774411 AND granted`).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if held != 0 {
		t.Fatalf("the audience query's session lock is still held after the read (%d)", held)
	}
	// The pool's sessions still read the engine's tables as before.
	if _, err := store.Get(ctx, rep.ID); err != nil {
		t.Fatalf("the engine's statements after the read: %v", err)
	}
}

// BenchmarkOptInsRead re-reads the opt-ins of chunks of 500 push recipients, as a worker does before each
// chunk's lease, from an indexed audience of 100,000 devices, through the audience role:
//
//	go test ./campaign -run '^$' -bench OptInsRead -benchtime 200x
func BenchmarkOptInsRead(b *testing.B) {
	db, _ := testdb.New(b)
	ctx := context.Background()
	for _, sql := range []string{
		`CREATE TABLE devices AS SELECT i::bigint AS id, 'tok-' || i AS push_token, true AS push_opt_in, 'Ad' || i AS first_name FROM generate_series(1, 100000) i`,
		`ALTER TABLE devices ADD PRIMARY KEY (id)`,
		`GRANT SELECT ON devices TO campaignctl_audience`,
	} {
		if _, err := db.Exec(ctx, sql); err != nil {
			b.Fatal(err)
		}
	}
	rep, err := (&campaign.Planner{Engine: db, Audience: db}).Plan(ctx, campaign.Spec{Name: "bench", Channel: campaign.ChannelPush, BatchSize: 500,
		AudienceSQL: `SELECT id AS user_id, push_token, push_opt_in, first_name FROM devices WHERE push_opt_in`, Subject: `Merhaba`, Message: `Size özel bir fırsat`})
	if err != nil {
		b.Fatal(err)
	}
	store := campaign.NewStore(db)
	c, err := store.Get(ctx, rep.ID)
	if err != nil {
		b.Fatal(err)
	}
	const chunk = 500
	users := make([]string, chunk)
	r := store.OptIns()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range users {
			users[j] = strconv.Itoa((i*chunk+j)%100000 + 1)
		}
		got, err := r.Read(ctx, c, users)
		if err != nil || len(got) != chunk {
			b.Fatalf("read %d of %d (%v)", len(got), chunk, err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*chunk), "µs/recipient")
}

// User IDs are written into the re-read's SQL as one array literal: quotes, backslashes, braces, commas and
// blanks in them must come back as they are, whatever standard_conforming_strings says, and none of them
// may end the literal.
func TestOptInsReadUserIDsOfAnyText(t *testing.T) {
	t.Parallel()
	db, url := testdb.New(t)
	ctx := context.Background()
	ids := []string{`o'brien`, `a\b`, `q"x`, `c,d`, `{e}`, ` sp `, `x'); DROP TABLE devices; --`, `\'`, `NULL`}
	mustExec(t, db, `CREATE TABLE devices (user_id text PRIMARY KEY, push_token text, push_opt_in boolean)`)
	for i, id := range ids {
		mustExec(t, db, `INSERT INTO devices VALUES ($1, $2, true)`, id, fmt.Sprintf("tok-%d", i))
	}
	mustExec(t, db, `GRANT SELECT ON devices TO campaignctl_audience`)
	rep, err := (&campaign.Planner{Engine: db, Audience: db}).Plan(ctx, campaign.Spec{Name: "ids", Channel: campaign.ChannelPush, BatchSize: 100,
		AudienceSQL: `SELECT user_id, push_token, push_opt_in FROM devices`, Subject: `Merhaba`, Message: `Size özel bir fırsat`})
	if err != nil || rep.Eligible != int64(len(ids)) {
		t.Fatalf("plan: %d eligible (%v), want %d", rep.Eligible, err, len(ids))
	}
	var dbName string
	if err := db.QueryRow(ctx, `SELECT current_database()`).Scan(&dbName); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `ALTER DATABASE `+dbName+` SET standard_conforming_strings = off`)
	for _, conforming := range []bool{true, false} {
		pool := db
		if !conforming {
			if pool, err = pgxpool.New(ctx, url); err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
		}
		store := campaign.NewStore(pool)
		c, err := store.Get(ctx, rep.ID)
		if err != nil {
			t.Fatal(err)
		}
		got, err := store.OptIns().Read(ctx, c, ids)
		if err != nil {
			t.Fatalf("standard_conforming_strings %v: %v", conforming, err)
		}
		for i, id := range ids {
			if !got.OptedIn(id, fmt.Sprintf("tok-%d", i)) {
				t.Errorf("standard_conforming_strings %v: user %q not read back as opted in", conforming, id)
			}
		}
	}
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM devices`).Scan(&n); err != nil || n != len(ids) {
		t.Fatalf("devices: %d rows (%v)", n, err)
	}
}

// An audience query that cannot find a few users within optInProbeMax would hold each chunk at least as
// long at send time (the workers' reads give up after 30 s, and a chunk whose read never ends sends
// nothing, its batch queued again and again): the launch refuses it, naming the cause and the fix, with
// nothing written. Before, it launched with a warning, and an outside run's campaign never sent.
func TestALaunchRefusesAnAudienceTooSlowToReadAgain(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	mustExec(t, db, `CREATE TABLE devices AS SELECT 'u' || i AS user_id, 'tok-' || i AS push_token, true AS push_opt_in FROM generate_series(1, 5) i`)
	mustExec(t, db, `GRANT SELECT ON devices TO campaignctl_audience`)
	_, err := (&campaign.Planner{Engine: db, Audience: db}).Plan(ctx, campaign.Spec{Name: "slow", Channel: campaign.ChannelPush, BatchSize: 10,
		AudienceSQL: `SELECT user_id, push_token, push_opt_in FROM devices WHERE (SELECT pg_sleep(6)) IS NOT NULL`,
		Subject:     `Merhaba`, Message: `Size özel bir fırsat`})
	if !errors.Is(err, campaign.ErrInvalid) || !strings.Contains(err.Error(), "took more than") || !strings.Contains(err.Error(), "index") {
		t.Fatalf("launch: %v; want it refused: too slow to run again for a chunk's users", err)
	}
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM campaigns`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d campaigns written by the refused launch (%v); want none", n, err)
	}
}

// An audience read as a login role of its own (an AUDIENCE_DATABASE_URL of its own, no audience function)
// that fails says why: a revoked grant is reported as Postgres's "permission denied", not as columns the
// query no longer returns (a query that fails before its first row has no columns).
func TestAnOptInReadThatFailsSaysWhy(t *testing.T) {
	t.Parallel()
	engine, _ := testdb.New(t)
	aud, audURL := testdb.New(t)
	ctx := context.Background()
	role := "optin_" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	for _, sql := range []string{
		`DROP SCHEMA campaignctl_audience CASCADE`,
		`CREATE TABLE devices AS SELECT 'u' || i AS user_id, 'tok-' || i AS push_token, true AS push_opt_in FROM generate_series(1, 3) i`,
		`CREATE ROLE ` + role + ` LOGIN`,
		`GRANT SELECT ON devices TO ` + role,
	} {
		mustExec(t, aud, sql)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		aud.Exec(ctx, `REVOKE ALL ON devices FROM `+role) //nolint:errcheck
		if c, err := pgx.Connect(ctx, testdb.AdminURL()); err == nil {
			c.Exec(ctx, `DROP ROLE IF EXISTS `+role) //nolint:errcheck
			c.Close(ctx)
		}
	})
	u, err := url.Parse(audURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	asRole, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(asRole.Close)
	rep, err := (&campaign.Planner{Engine: engine, Audience: asRole}).Plan(ctx, campaign.Spec{Name: "role", Channel: campaign.ChannelPush, BatchSize: 10,
		AudienceSQL: `SELECT user_id, push_token, push_opt_in FROM devices`, Subject: `Merhaba`, Message: `Size özel bir fırsat`})
	if err != nil {
		t.Fatal(err)
	}
	c, err := campaign.NewStore(engine).Get(ctx, rep.ID)
	if err != nil {
		t.Fatal(err)
	}
	r := &campaign.OptIns{Pool: asRole}
	if got, err := r.Read(ctx, c, []string{"u1"}); err != nil || !got.OptedIn("u1", "tok-1") {
		t.Fatalf("read as the login role: %v (%v)", got, err)
	}
	mustExec(t, aud, `REVOKE SELECT ON devices FROM `+role)
	_, err = r.Read(ctx, c, []string{"u1"})
	if err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("read after the grant was revoked: %v; want Postgres's permission denied", err)
	}
}
