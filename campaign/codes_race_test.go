package campaign_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/codes"
	"github.com/campaignctl/campaignctl/internal/testdb"
)

// Invariant 4 (codes) under races: launches against launches, against code writers, against codes coming
// back to the pool; and the codes that may have reached someone never come back.

// seedCrowd creates the audience table crowd of n users u00001…, each with İYS ONAY for SMS.
func seedCrowd(t *testing.T, db *pgxpool.Pool, n int) {
	t.Helper()
	mustExec(t, db, `CREATE TABLE crowd AS SELECT i AS n, 'u' || lpad(i::text, 5, '0') AS user_id,
		'+90532' || lpad(i::text, 7, '0') AS phone, 'Ad' || i AS first_name FROM generate_series(1, $1::int) i`, n)
	mustExec(t, db, `GRANT SELECT ON crowd TO campaignctl_audience`)
	mustExec(t, db, `INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date)
		SELECT phone, 'MESAJ', 'BIREYSEL', 'ONAY', 'HS_WEB', now() FROM crowd`)
}

// crowdSpec launches an SMS to the first size users of the crowd, with codes of pool.
func crowdSpec(name, pool string, size int) campaign.Spec {
	return campaign.Spec{
		Name: name, Channel: campaign.ChannelSMS, CodePool: pool,
		AudienceSQL: fmt.Sprintf(`SELECT user_id, phone, first_name FROM crowd WHERE n <= %d ORDER BY n`, size),
		Message:     `Merhaba {{.first_name}}, kodunuz {{.code}}`,
		BatchSize:   50,
	}
}

// addCodes adds n codes to pool (creating it): POOL-000001, POOL-000002, … after the ones it holds.
func addCodes(t *testing.T, db *pgxpool.Pool, pool string, n int) {
	t.Helper()
	mustExec(t, db, `INSERT INTO code_pools (name) VALUES ($1) ON CONFLICT DO NOTHING`, pool)
	mustExec(t, db, `INSERT INTO promo_codes (pool, code)
		SELECT $1, upper($1) || '-' || lpad((g + (SELECT count(*) FROM promo_codes WHERE pool = $1))::text, 6, '0')
		FROM generate_series(1, $2::int) g ORDER BY g`, pool, n)
}

// newPool opens a pool of its own on the test database, as another process would, with conns connections
// already open so that a race is not decided by who connects first.
func newPool(t *testing.T, url string, conns int) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = int32(conns)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var held []*pgxpool.Conn
	for range conns {
		c, err := pool.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	for _, c := range held {
		c.Release()
	}
	return pool
}

// newPlanners returns n planners, each on a pool of its own (the engine transaction and the audience's
// read-only one each take a connection), like n launch processes.
func newPlanners(t *testing.T, url string, n int) []*campaign.Planner {
	out := make([]*campaign.Planner, n)
	for i := range out {
		pool := newPool(t, url, 3)
		out[i] = &campaign.Planner{Engine: pool, Audience: pool}
	}
	return out
}

// together runs every f in a goroutine of its own and returns their errors in order. The goroutines are
// all started and parked on one channel before it is closed, so they set off at the same instant.
func together(fs ...func() error) []error {
	errs := make([]error, len(fs))
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	ready.Add(len(fs))
	done.Add(len(fs))
	for i, f := range fs {
		go func() {
			defer done.Done()
			ready.Done()
			<-start
			errs[i] = f()
		}()
	}
	ready.Wait()
	close(start)
	done.Wait()
	return errs
}

// gate holds the lock that code writers and the launch planner's reservation take (codes.WriteLockKey), on
// a connection of its own: whatever reserves or adds codes meanwhile queues behind it.
type gate struct {
	t    *testing.T
	db   *pgxpool.Pool
	conn *pgxpool.Conn
}

func closeGate(t *testing.T, db *pgxpool.Pool) *gate {
	t.Helper()
	conn, err := db.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(context.Background(), `SELECT pg_advisory_lock($1)`, int64(codes.WriteLockKey)); err != nil {
		conn.Release()
		t.Fatal(err)
	}
	return &gate{t: t, db: db, conn: conn}
}

// waitQueued returns once n sessions wait for the gate's lock, or fails the test when the ones still
// running (running() of them) can no longer make n.
func (g *gate) waitQueued(n int, running func() int) {
	g.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		queued := advisoryLocks(g.t, g.db, codes.WriteLockKey, false)
		if queued >= n {
			return
		}
		if running() < n || time.Now().After(deadline) {
			g.t.Fatalf("%d sessions queued for the code lock, want %d (%d contenders still running)", queued, n, running())
		}
		time.Sleep(time.Millisecond) // polling pg_locks: the only way to see a lock queue
	}
}

// open lets the queue go.
func (g *gate) open() {
	if g.conn == nil {
		return
	}
	g.conn.Exec(context.Background(), `SELECT pg_advisory_unlock($1)`, int64(codes.WriteLockKey)) //nolint:errcheck
	g.conn.Release()
	g.conn = nil
}

// queued runs the groups of contenders one group after the other into the queue of a closed gate (each
// group is queued before the next one starts), then opens the gate, so that they all reach the code lock
// at once, in that order of groups, and contend there. It returns their errors in order.
func queued(t *testing.T, db *pgxpool.Pool, groups ...[]func() error) []error {
	t.Helper()
	g := closeGate(t, db)
	defer g.open()
	var all []func() error
	for _, grp := range groups {
		all = append(all, grp...)
	}
	errs := make([]error, len(all))
	var running atomic.Int64
	var done sync.WaitGroup
	started := 0
	for _, grp := range groups {
		for _, f := range grp {
			i := started
			started++
			running.Add(1)
			done.Add(1)
			go func() {
				defer done.Done()
				defer running.Add(-1)
				errs[i] = f()
			}()
		}
		g.waitQueued(started, func() int { return int(running.Load()) })
	}
	g.open()
	done.Wait()
	return errs
}

// checkCodes checks invariant 4 over the whole database: no code held by two recipients, every held code
// is its pool's and not free at the same time, and every code of a pool is either held by one recipient or
// free (fresh above the pool's cursor, or released), so that the pool's free count is the truth.
func checkCodes(t *testing.T, db *pgxpool.Pool) {
	t.Helper()
	for _, c := range []struct{ what, sql string }{
		{"code ids held by two recipients", `SELECT count(*) FROM (SELECT code_id FROM campaign_recipients
			WHERE code_id IS NOT NULL GROUP BY code_id HAVING count(*) > 1) x`},
		{"codes held by two recipients", `SELECT count(*) FROM (SELECT code FROM campaign_recipients
			WHERE code IS NOT NULL GROUP BY code HAVING count(*) > 1) x`},
		{"recipients whose code is not the one of their code id", `SELECT count(*) FROM campaign_recipients r
			LEFT JOIN promo_codes p ON p.id = r.code_id
			WHERE (r.code IS NULL) <> (r.code_id IS NULL) OR (r.code_id IS NOT NULL AND p.code IS DISTINCT FROM r.code)`},
		{"recipients holding a code of another pool than their campaign's", `SELECT count(*) FROM campaign_recipients r
			JOIN campaigns c ON c.id = r.campaign_id JOIN promo_codes p ON p.id = r.code_id
			WHERE p.pool IS DISTINCT FROM c.code_pool`},
		{"recipients pending, sent or unknown without a code in a campaign with a pool", `SELECT count(*)
			FROM campaign_recipients r JOIN campaigns c ON c.id = r.campaign_id
			WHERE c.code_pool IS NOT NULL AND r.status IN ('pending', 'sent', 'unknown') AND r.code_id IS NULL`},
		{"held codes also fresh (above their pool's cursor)", `SELECT count(*) FROM campaign_recipients r
			JOIN promo_codes p ON p.id = r.code_id JOIN code_pools cp ON cp.name = p.pool WHERE p.id > cp.next_id`},
		{"held codes also released", `SELECT count(*) FROM campaign_recipients r JOIN released_codes rc ON rc.code_id = r.code_id`},
		{"released codes above their pool's cursor (free twice over)", `SELECT count(*) FROM released_codes rc
			JOIN promo_codes p ON p.id = rc.code_id JOIN code_pools cp ON cp.name = p.pool WHERE p.id > cp.next_id`},
		{"released codes filed under another pool", `SELECT count(*) FROM released_codes rc
			LEFT JOIN promo_codes p ON p.id = rc.code_id WHERE p.pool IS DISTINCT FROM rc.pool`},
		{"codes lost: given out, yet neither held nor released", `SELECT count(*) FROM promo_codes p
			JOIN code_pools cp ON cp.name = p.pool
			WHERE p.id <= cp.next_id AND NOT EXISTS (SELECT 1 FROM released_codes rc WHERE rc.code_id = p.id)
			  AND NOT EXISTS (SELECT 1 FROM campaign_recipients r WHERE r.code_id = p.id)`},
		{"recipients of campaigns that do not exist", `SELECT count(*) FROM campaign_recipients r
			WHERE NOT EXISTS (SELECT 1 FROM campaigns c WHERE c.id = r.campaign_id)`},
	} {
		if n := count(t, db, c.sql); n != 0 {
			t.Errorf("%d %s", n, c.what)
		}
	}
	stats, err := codes.Stats(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range stats {
		held := count(t, db, `SELECT count(*) FROM campaign_recipients r JOIN promo_codes p ON p.id = r.code_id WHERE p.pool = $1`, s.Pool)
		if s.Reserved != held || s.Total != s.Free+held {
			t.Errorf("pool %s: stats say %d codes, %d free, %d reserved; %d are held by recipients", s.Pool, s.Total, s.Free, s.Reserved, held)
		}
	}
}

// launchOutcome sorts the errors of racing launches needing size codes each: it returns how many
// succeeded, and fails the test for any error other than the pool being short, saying by how much, with
// nothing written. freeAfter, when not nil, gives the free codes the winners leave, which is what a
// refused launch must have found; when nil, a refused launch must only have found fewer than size.
func launchOutcome(t *testing.T, db *pgxpool.Pool, label string, names []string, errs []error, size int64, freeAfter func(winners int) int64) int {
	t.Helper()
	won := 0
	for _, err := range errs {
		if err == nil {
			won++
		}
	}
	for i, err := range errs {
		var short *campaign.PoolShortError
		switch {
		case err == nil:
		case errors.As(err, &short):
			free := short.Free
			if freeAfter != nil {
				free = freeAfter(won)
			}
			if short.Needed != size || short.Free != free || free >= size {
				t.Errorf("%s: launch %s refused with %d of %d codes free (%v); want %d of %d free", label, names[i], short.Free, short.Needed, err, free, size)
			}
			if want := fmt.Sprintf("%d codes missing", size-free); !strings.Contains(err.Error(), want) {
				t.Errorf("%s: launch %s refused with %q; want it to say %q", label, names[i], err, want)
			}
			if n := count(t, db, `SELECT count(*) FROM campaigns WHERE name = $1`, names[i]); n != 0 {
				t.Errorf("%s: refused launch %s left its campaign row", label, names[i])
			}
		default:
			t.Errorf("%s: launch %s failed with %v; want success, or the pool short", label, names[i], err)
		}
	}
	return won
}

// Launches started together on one pool: when the pool covers them all, they all succeed with codes of
// their own; when it covers only some, exactly that many succeed and each other one is refused, saying how
// many codes are missing, with nothing written. Each race runs with the launches set off at one instant,
// and again with them queued at the reservation itself and let go at once.
func TestConcurrentLaunchesNeverShareACode(t *testing.T) {
	t.Parallel()
	db, url := testdb.New(t)
	ctx := context.Background()
	const size = 200
	seedCrowd(t, db, size)
	planners := newPlanners(t, url, 3)
	cases := []struct {
		name                     string
		launches, codes, winners int
	}{
		{"the pool covers every launch", 3, 3 * size, 3},
		{"the pool covers one launch", 2, size + size/2, 1},
		{"the pool covers two launches of three", 3, 2*size + size/4, 2},
	}
	round := 0
	for rep := 0; rep < 3; rep++ {
		for _, gated := range []bool{false, true} {
			for _, tc := range cases {
				round++
				pool := fmt.Sprintf("p%d", round)
				label := fmt.Sprintf("round %d (%s, gated %v)", round, tc.name, gated)
				addCodes(t, db, pool, tc.codes)
				names := make([]string, tc.launches)
				fs := make([]func() error, tc.launches)
				for i := range fs {
					names[i] = fmt.Sprintf("r%d-l%d", round, i)
					fs[i] = func() error { _, err := planners[i].Plan(ctx, crowdSpec(names[i], pool, size)); return err }
				}
				var errs []error
				if gated {
					errs = queued(t, db, fs)
				} else {
					errs = together(fs...)
				}
				freeAfter := func(w int) int64 { return int64(tc.codes - w*size) }
				won := launchOutcome(t, db, label, names, errs, size, freeAfter)
				if won != tc.winners {
					t.Errorf("%s: %d launches succeeded, want %d (%v)", label, won, tc.winners, errs)
				}
				if n := count(t, db, `SELECT count(*) FROM campaign_recipients r JOIN campaigns c ON c.id = r.campaign_id
					WHERE c.code_pool = $1`, pool); n != int64(won*size) {
					t.Errorf("%s: %d recipients planned on the pool, want %d", label, n, won*size)
				}
				if free, err := codes.Free(ctx, db, pool); err != nil || free != freeAfter(won) {
					t.Errorf("%s: %d codes free (%v), want %d", label, free, err, freeAfter(won))
				}
				checkCodes(t, db)
				if t.Failed() {
					t.FailNow()
				}
			}
		}
	}
}

// Launches racing `codes generate` and `codes import` on their pool: every writer adds exactly its new
// codes, every launch either gets codes of its own or is refused for a short pool (never a constraint
// error), and afterwards each code is held once or free. The import offers codes of the pool that the
// launches are giving out, and codes of another pool. Races run set off at one instant, and queued at the
// code lock with the launches ahead of the writers, and behind them.
func TestLaunchRacingCodeWritersNeverSharesACode(t *testing.T) {
	t.Parallel()
	db, url := testdb.New(t)
	ctx := context.Background()
	const size, generated, imported = 200, 300, 100
	seedCrowd(t, db, size)
	addCodes(t, db, "other", 10)
	planners := newPlanners(t, url, 2)
	generator := newPool(t, url, 2)
	importer := newPool(t, url, 1)
	round := 0
	for rep := 0; rep < 2; rep++ {
		for _, covered := range []bool{true, false} {
			for _, order := range []string{"together", "launches first", "writers first"} {
				round++
				pool := fmt.Sprintf("w%d", round)
				label := fmt.Sprintf("round %d (covered %v, %s)", round, covered, order)
				initial := 2 * size
				if !covered {
					initial = size + size/2 // the second launch succeeds only after a writer
				}
				addCodes(t, db, pool, initial)
				var file strings.Builder
				for i := 1; i <= imported; i++ {
					fmt.Fprintf(&file, "IMP-%s-%04d\n", strings.ToUpper(pool), i)
				}
				for i := 1; i <= 30; i++ { // codes of this pool: given out by the launches, or about to be
					fmt.Fprintf(&file, "%s-%06d\n", strings.ToUpper(pool), i*(initial/30))
				}
				for i := 1; i <= 10; i++ {
					fmt.Fprintf(&file, "OTHER-%06d\n", i)
				}
				fmt.Fprintf(&file, "IMP-%s-0001\n", strings.ToUpper(pool))

				names := []string{fmt.Sprintf("w%d-l0", round), fmt.Sprintf("w%d-l1", round)}
				var gen codes.GenerateReport
				var imp codes.ImportReport
				launches := []func() error{
					func() error { _, err := planners[0].Plan(ctx, crowdSpec(names[0], pool, size)); return err },
					func() error { _, err := planners[1].Plan(ctx, crowdSpec(names[1], pool, size)); return err },
				}
				writers := []func() error{
					func() (err error) {
						gen, err = codes.Generate(ctx, generator, codes.GenerateOptions{Pool: pool, Count: generated})
						return err
					},
					func() (err error) {
						imp, err = codes.Import(ctx, importer, pool, strings.NewReader(file.String()))
						return err
					},
				}
				var errs []error
				switch order {
				case "together":
					errs = together(append(launches, writers...)...)
				case "launches first":
					errs = queued(t, db, launches, writers)
				default:
					e := queued(t, db, writers, launches)
					errs = []error{e[2], e[3], e[0], e[1]}
				}
				if errs[2] != nil || gen.Generated != generated {
					t.Errorf("%s: generate added %d codes (%v), want %d", label, gen.Generated, errs[2], generated)
				}
				if want := (codes.ImportReport{Lines: imported + 41, Inserted: imported, Duplicates: 41}); errs[3] != nil || imp != want {
					t.Errorf("%s: import %+v (%v), want %+v", label, imp, errs[3], want)
				}
				total := int64(initial + generated + imported)
				won := launchOutcome(t, db, label, names, errs[:2], size, nil)
				if covered && won != 2 || won == 0 {
					t.Errorf("%s: %d launches succeeded (%v)", label, won, errs[:2])
				}
				if free, err := codes.Free(ctx, db, pool); err != nil || free != total-int64(won*size) {
					t.Errorf("%s: %d codes free (%v), want %d", label, free, err, total-int64(won*size))
				}
				checkCodes(t, db)
				if t.Failed() {
					t.FailNow()
				}
			}
		}
	}
}

// advisoryLocks counts the sessions other than the test's own that hold (granted) or wait for (not granted)
// the advisory lock key.
func advisoryLocks(t *testing.T, db *pgxpool.Pool, key int64, granted bool) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND granted = $3 AND classid = ($1::bigint >> 32)::oid AND objid = ($1::bigint & 4294967295)::oid AND objsubid = 1
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) AND pid <> $2`,
		key, testPID, granted).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// testPID is no backend: advisoryLocks counts every session.
const testPID = 0

// await polls cond (pg_locks cannot be waited on otherwise) until it holds, failing the test after 20 s.
func await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 20 s for %s", what)
		}
	}
}

// A launch at the worst instants of `codes generate`. Generate adds its codes through two transactions
// that commit one after the other, and the codes of the one that commits last can have lower ids than the
// other's. A launch reading the pool between the two commits would see one share only, take codes above
// the other share's ids and move the pool's cursor past them: those codes would be lost (counted as given
// out, held by nobody), the pool's free count wrong for good. Triggers of the test's own hold Generate at
// the chosen points: one share is inserted first, the other one next, and the COMMIT of the one inserted
// first waits until a launch has started; the share inserted first is, in turn, the one of the connection
// holding the code lock, and the other one. Either way the launch must wait for the whole Generate.
func TestLaunchBetweenTheCommitsOfGenerateLosesNoCode(t *testing.T) {
	t.Parallel()
	db, url := testdb.New(t)
	ctx := context.Background()
	const size, generated = 50, 400
	const holdSecond, holdCommit, firstInserted = 7401, 7402, 7403
	seedCrowd(t, db, size)
	round := 0
	for rep := 1; rep <= 2; rep++ {
		for _, holderFirst := range []bool{true, false} {
			round++
			pool := fmt.Sprintf("g%d", round)
			mustExec(t, db, `INSERT INTO code_pools (name) VALUES ($1)`, pool)
			mustExec(t, db, fmt.Sprintf(`CREATE FUNCTION hold_generate() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN
				IF EXISTS (SELECT 1 FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory' AND granted
				           AND classid = 0 AND objid = %d) = %v THEN
					-- the share inserted first: says it is in, and waits at its COMMIT
					IF TG_LEVEL = 'STATEMENT' THEN
						PERFORM pg_advisory_xact_lock(%d);
					ELSE
						PERFORM pg_advisory_xact_lock_shared(%d);
					END IF;
				ELSIF TG_WHEN = 'BEFORE' THEN
					-- the other share: inserted once the test lets it
					PERFORM pg_advisory_xact_lock_shared(%d);
				END IF;
				RETURN NULL;
			END $$`, codes.WriteLockKey, holderFirst, firstInserted, holdCommit, holdSecond))
			mustExec(t, db, `CREATE TRIGGER hold_second BEFORE INSERT ON promo_codes FOR EACH STATEMENT EXECUTE FUNCTION hold_generate()`)
			mustExec(t, db, `CREATE TRIGGER first_inserted AFTER INSERT ON promo_codes FOR EACH STATEMENT EXECUTE FUNCTION hold_generate()`)
			mustExec(t, db, `CREATE CONSTRAINT TRIGGER hold_commit AFTER INSERT ON promo_codes DEFERRABLE INITIALLY DEFERRED
			FOR EACH ROW EXECUTE FUNCTION hold_generate()`)

			genPool := newPool(t, url, 2)
			planner := newPlanners(t, url, 1)[0]
			var gen codes.GenerateReport
			genErr, launchErr := func() (genErr, launchErr error) {
				holder, err := db.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				held := map[int64]bool{}
				unlock := func(key int64) {
					if held[key] {
						holder.Exec(ctx, `SELECT pg_advisory_unlock($1)`, key) //nolint:errcheck
						delete(held, key)
					}
				}
				defer func() { // also when the test fails half way: Generate must not stay stuck
					unlock(holdSecond)
					unlock(holdCommit)
					holder.Release()
				}()
				for _, key := range []int64{holdSecond, holdCommit} {
					if _, err := holder.Exec(ctx, `SELECT pg_advisory_lock($1)`, key); err != nil {
						t.Fatal(err)
					}
					held[key] = true
				}

				genDone := make(chan error, 1)
				go func() {
					var err error
					gen, err = codes.Generate(ctx, genPool, codes.GenerateOptions{Pool: pool, Count: generated})
					genDone <- err
				}()
				await(t, "the first share to be inserted", func() bool { return advisoryLocks(t, db, firstInserted, true) == 1 })
				unlock(holdSecond)
				await(t, "the second share to commit and the first to wait at its COMMIT", func() bool {
					return advisoryLocks(t, db, holdCommit, false) == 1
				})

				var launched atomic.Bool
				launchDone := make(chan error, 1)
				go func() {
					_, err := planner.Plan(ctx, crowdSpec(fmt.Sprintf("g%d-launch", round), pool, size))
					launched.Store(true)
					launchDone <- err
				}()
				await(t, "the launch to queue for the code lock (or to be done)", func() bool {
					return launched.Load() || advisoryLocks(t, db, codes.WriteLockKey, false) == 1
				})
				unlock(holdCommit)
				return <-genDone, <-launchDone
			}()
			if genErr != nil || gen.Generated != generated {
				t.Fatalf("round %d: generate added %d codes (%v), want %d", round, gen.Generated, genErr, generated)
			}
			if launchErr != nil {
				t.Fatalf("round %d (share of the lock holder first: %v): launch: %v", round, holderFirst, launchErr)
			}
			mustExec(t, db, `DROP FUNCTION hold_generate() CASCADE`)

			if free, err := codes.Free(ctx, db, pool); err != nil || free != generated-size {
				t.Errorf("round %d (share of the lock holder first: %v): %d codes free (%v), want %d", round, holderFirst, free, err, generated-size)
			}
			checkCodes(t, db)
			if t.Failed() {
				t.FailNow()
			}
		}
	}
}

// recipientsOf returns the users of a campaign's batch.
func recipientsOf(t *testing.T, db *pgxpool.Pool, id int64, batch int) []string {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT user_id FROM campaign_recipients WHERE campaign_id = $1 AND batch = $2 ORDER BY user_id`, id, batch)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var u string
		if err := rows.Scan(&u); err != nil {
			t.Fatal(err)
		}
		out = append(out, u)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// Launches racing codes coming back to their pool: campaign A's recipients fail for good (their codes are
// released by Record, batch after batch) and campaign B is cancelled (CancelUnleased releases its codes)
// while C and D reserve. Released codes go out again, first, but never while still held: afterwards every
// code is held once or free, the free count is exact (a launch needing one more is refused, saying so),
// and a last launch takes every free code, the released ones included.
func TestLaunchRacingReleasesNeverSharesACode(t *testing.T) {
	t.Parallel()
	db, url := testdb.New(t)
	ctx := context.Background()
	const size, batchSize = 150, 50
	seedCrowd(t, db, 4*size+1)
	planners := newPlanners(t, url, 2)
	store := campaign.NewStore(newPool(t, url, 2))
	for round := 1; round <= 4; round++ {
		covered := round%2 == 1
		pool := fmt.Sprintf("rel%d", round)
		label := fmt.Sprintf("round %d (fresh codes cover the launches: %v)", round, covered)
		fresh := 2 * size
		if !covered {
			fresh = size + size/3 // both launches succeed only with released codes
		}
		addCodes(t, db, pool, 2*size+fresh)
		a, err := planners[0].Plan(ctx, crowdSpec(fmt.Sprintf("rel%d-a", round), pool, size))
		if err != nil {
			t.Fatal(err)
		}
		b, err := planners[0].Plan(ctx, crowdSpec(fmt.Sprintf("rel%d-b", round), pool, size))
		if err != nil {
			t.Fatal(err)
		}
		batches := make([][]string, size/batchSize)
		for i := range batches {
			batches[i] = recipientsOf(t, db, a.ID, i)
		}
		names := []string{fmt.Sprintf("rel%d-c", round), fmt.Sprintf("rel%d-d", round)}
		var failed, cancelled int64
		errs := together(
			func() error {
				for i, users := range batches {
					outs := make([]campaign.Outcome, len(users))
					for j, u := range users {
						outs[j] = campaign.Outcome{UserID: u, Status: campaign.StatusFailed, Reason: "twilio 21211: invalid 'To' phone number"}
					}
					moved, err := store.Record(ctx, a.ID, outs, campaign.Lease{Batch: i}, nil)
					if err != nil {
						return err
					}
					failed += moved[campaign.StatusFailed]
				}
				return nil
			},
			func() error {
				if _, err := store.Transition(ctx, b.ID, []campaign.State{campaign.StateRunning}, campaign.StateCancelled); err != nil {
					return err
				}
				n, err := store.CancelUnleased(ctx, b.ID)
				cancelled = n
				return err
			},
			func() error { _, err := planners[0].Plan(ctx, crowdSpec(names[0], pool, size)); return err },
			func() error { _, err := planners[1].Plan(ctx, crowdSpec(names[1], pool, size)); return err },
		)
		if errs[0] != nil || failed != size {
			t.Fatalf("%s: Record failed %d recipients (%v), want %d", label, failed, errs[0], size)
		}
		if errs[1] != nil || cancelled != size {
			t.Fatalf("%s: CancelUnleased skipped %d recipients (%v), want %d", label, cancelled, errs[1], size)
		}
		won := launchOutcome(t, db, label, names, errs[2:], size, nil)
		if covered && won != 2 || won == 0 {
			t.Errorf("%s: %d launches succeeded (%v)", label, won, errs[2:])
		}
		total := int64(2*size + fresh) // A's and B's codes all came back
		free, err := codes.Free(ctx, db, pool)
		if err != nil || free != total-int64(won*size) {
			t.Errorf("%s: %d codes free (%v), want %d", label, free, err, total-int64(won*size))
		}
		checkCodes(t, db)

		// The free count is exact: one code more is refused, saying how many are missing ...
		_, err = planners[1].Plan(ctx, crowdSpec(fmt.Sprintf("rel%d-e", round), pool, int(free)+1))
		var short *campaign.PoolShortError
		if !errors.As(err, &short) || short.Free != free || short.Needed != free+1 {
			t.Errorf("%s: a launch needing %d of %d free codes: %v; want refused, 1 code missing", label, free+1, free, err)
		}
		// ... and exactly that many are given out, released ones and fresh ones alike.
		if _, err := planners[1].Plan(ctx, crowdSpec(fmt.Sprintf("rel%d-f", round), pool, int(free))); err != nil {
			t.Errorf("%s: a launch needing the %d free codes: %v", label, free, err)
		}
		if n := count(t, db, `SELECT count(*) FROM released_codes WHERE pool = $1`, pool); n != 0 {
			t.Errorf("%s: %d released codes left after a launch took every free code", label, n)
		}
		if n := count(t, db, `SELECT count(*) FROM promo_codes p JOIN campaign_recipients r ON r.code_id = p.id WHERE p.pool = $1`, pool); n != int64(2*size+fresh) {
			t.Errorf("%s: %d of the pool's %d codes held after the last launch took every free one", label, n, 2*size+fresh)
		}
		checkCodes(t, db)
		if t.Failed() {
			t.FailNow()
		}
	}
}

// codeOf returns the code and code id a recipient holds ("" and 0 for none).
func codeOf(t *testing.T, db *pgxpool.Pool, id int64, user string) (string, int64) {
	t.Helper()
	var code *string
	var codeID *int64
	if err := db.QueryRow(context.Background(), `SELECT code, code_id FROM campaign_recipients WHERE campaign_id = $1 AND user_id = $2`,
		id, user).Scan(&code, &codeID); err != nil {
		t.Fatal(err)
	}
	if code == nil || codeID == nil {
		return "", 0
	}
	return *code, *codeID
}

// A sent recipient's code, and an unknown one's (the provider's answer was lost: the message may have gone
// out with the code), never return to the pool: not through a later outcome recorded for them (a
// redelivered batch), not through a delivery receipt, not through a cancel. A recipient cancelled before
// anything was sent is the one whose code goes back, and only its code is given out again.
func TestSentAndUnknownCodesNeverReturnToThePool(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	seedCrowd(t, db, 3)
	addCodes(t, db, "keep", 3)
	p := &campaign.Planner{Engine: db, Audience: db}
	store := campaign.NewStore(db)
	a, err := p.Plan(ctx, crowdSpec("keep-a", "keep", 3))
	if err != nil {
		t.Fatal(err)
	}
	const sent, unknown, never = "u00001", "u00002", "u00003"
	planned := map[string]string{}
	for _, u := range []string{sent, unknown, never} {
		planned[u], _ = codeOf(t, db, a.ID, u)
	}
	moved, err := store.Record(ctx, a.ID, []campaign.Outcome{
		{UserID: sent, Status: campaign.StatusSent, MessageID: "SM1"},
		{UserID: unknown, Status: campaign.StatusUnknown, Reason: "timeout after the request was written"},
	}, campaign.Lease{Batch: 0}, nil)
	if err != nil || moved[campaign.StatusSent] != 1 || moved[campaign.StatusUnknown] != 1 {
		t.Fatalf("record: %v, %v", moved, err)
	}
	// A redelivered batch reports them again, failed or skipped this time: nothing moves.
	for _, st := range []string{campaign.StatusFailed, campaign.StatusSkipped, campaign.StatusPending} {
		moved, err := store.Record(ctx, a.ID, []campaign.Outcome{{UserID: sent, Status: st, Reason: "twilio 21610"},
			{UserID: unknown, Status: st, Reason: "twilio 21610"}}, campaign.Lease{Batch: 0}, nil)
		if err != nil || len(moved) != 0 {
			t.Fatalf("a later %s outcome for the sent and the unknown recipient moved %v (%v)", st, moved, err)
		}
	}
	// The sent message bounced: it did go out, with its code.
	if _, err := store.RecordDeliveries(ctx, []campaign.Delivery{{Provider: "twilio", MessageID: "SM1", CampaignID: a.ID, UserID: sent, Status: "undelivered", Error: "30003"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Transition(ctx, a.ID, []campaign.State{campaign.StateRunning}, campaign.StateCancelled); err != nil {
		t.Fatal(err)
	}
	if n, err := store.CancelUnleased(ctx, a.ID); err != nil || n != 1 {
		t.Fatalf("cancel skipped %d recipients (%v), want 1 (the one never sent)", n, err)
	}
	for _, u := range []string{sent, unknown} {
		if got, _ := codeOf(t, db, a.ID, u); got != planned[u] {
			t.Errorf("%s holds %q after the cancel, want its code %q", u, got, planned[u])
		}
	}
	if got, _ := codeOf(t, db, a.ID, never); got != "" {
		t.Errorf("the cancelled recipient still holds %q", got)
	}
	if free, err := codes.Free(ctx, db, "keep"); err != nil || free != 1 {
		t.Errorf("%d codes free (%v), want 1: the cancelled recipient's", free, err)
	}
	checkCodes(t, db)

	// The next launches: two codes are refused (one is missing); one gets the cancelled recipient's code.
	_, err = p.Plan(ctx, crowdSpec("keep-b", "keep", 2))
	var short *campaign.PoolShortError
	if !errors.As(err, &short) || short.Free != 1 {
		t.Fatalf("a launch needing 2 codes: %v; want refused with 1 code free", err)
	}
	b, err := p.Plan(ctx, crowdSpec("keep-c", "keep", 1))
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := codeOf(t, db, b.ID, "u00001"); got != planned[never] {
		t.Errorf("the next launch got %q, want the cancelled recipient's %q", got, planned[never])
	}
	checkCodes(t, db)
}

// A recipient whose outcome was unknown and who is sent again (resume --resend-unknown) keeps its code
// whatever comes next: the resend failing for good, a send-time skip, an unknown again, a cancel while
// the resend is pending. The first message may have reached the person with that code, so it may not go to
// anybody else.
//
// Open: Record releases the code of a resent recipient whose resend fails for good or is skipped, and
// CancelUnleased the code of one still pending; the fix belongs to those two statements (keep the code of
// a recipient with an unknown outcome in send_log, and release only the codes the update dropped).
func TestResentUnknownKeepsItsCode(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	seedCrowd(t, db, 5)
	addCodes(t, db, "resend", 5)
	p := &campaign.Planner{Engine: db, Audience: db}
	store := campaign.NewStore(db)
	a, err := p.Plan(ctx, crowdSpec("resend-a", "resend", 5))
	if err != nil {
		t.Fatal(err)
	}
	const failed, skipped, pending, again = "u00001", "u00002", "u00003", "u00004"
	users := []string{failed, skipped, pending, again}
	planned := map[string]string{}
	var outs []campaign.Outcome
	for _, u := range users {
		planned[u], _ = codeOf(t, db, a.ID, u)
		outs = append(outs, campaign.Outcome{UserID: u, Status: campaign.StatusUnknown, Reason: "timeout after the request was written"})
	}
	if moved, err := store.Record(ctx, a.ID, outs, campaign.Lease{Batch: 0}, nil); err != nil || moved[campaign.StatusUnknown] != 4 {
		t.Fatalf("record unknown: %v, %v", moved, err)
	}
	// resume --resend-unknown
	if n, err := store.Resend(ctx, a.ID, users); err != nil || n != 4 {
		t.Fatalf("resend moved %d (%v), want 4", n, err)
	}
	for _, u := range users {
		if got, _ := codeOf(t, db, a.ID, u); got != planned[u] {
			t.Fatalf("%s holds %q after the resend, want its code %q", u, got, planned[u])
		}
	}
	// The resends: one fails for good, one is skipped (consent revoked meanwhile), one is unknown again,
	// one is still pending when the campaign is cancelled.
	if moved, err := store.Record(ctx, a.ID, []campaign.Outcome{
		{UserID: failed, Status: campaign.StatusFailed, Reason: "twilio 21610: unsubscribed recipient"},
		{UserID: skipped, Status: campaign.StatusSkipped, Reason: campaign.ReasonRevoked},
		{UserID: again, Status: campaign.StatusUnknown, Reason: "timeout after the request was written"},
	}, campaign.Lease{Batch: 0}, nil); err != nil || len(moved) != 3 {
		t.Fatalf("record the resends: %v, %v", moved, err)
	}
	if _, err := store.Transition(ctx, a.ID, []campaign.State{campaign.StateRunning}, campaign.StateCancelled); err != nil {
		t.Fatal(err)
	}
	if n, err := store.CancelUnleased(ctx, a.ID); err != nil || n != 2 {
		t.Fatalf("cancel skipped %d recipients (%v), want 2 (the resend still pending, and the one never sent)", n, err)
	}
	for _, u := range users {
		if got, _ := codeOf(t, db, a.ID, u); got != planned[u] {
			t.Errorf("%s (unknown, then sent again) holds %q at the end, want its code %q", u, got, planned[u])
		}
	}
	if n := count(t, db, `SELECT count(*) FROM released_codes rc JOIN promo_codes p ON p.id = rc.code_id WHERE p.code = ANY($1)`,
		[]string{planned[failed], planned[skipped], planned[pending], planned[again]}); n != 0 {
		t.Errorf("%d codes of recipients once unknown are back in the pool", n)
	}
	if free, err := codes.Free(ctx, db, "resend"); err != nil || free != 1 {
		t.Errorf("%d codes free (%v), want 1: the never-sent recipient's", free, err)
	}
	checkCodes(t, db)
}

// A code listed as released while a recipient still holds it (only a faulty release can leave one: a
// recipient keeping its code, its code filed as released all the same) is not free: a launch does not give
// it out and does not fail on it with a constraint error; it drops it from the free codes, and the free
// count never counted it.
func TestReleasedCodeStillHeldIsNeverGivenOut(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	seedCrowd(t, db, 2)
	addCodes(t, db, "held", 3)
	p := &campaign.Planner{Engine: db, Audience: db}
	a, err := p.Plan(ctx, crowdSpec("held-a", "held", 2))
	if err != nil {
		t.Fatal(err)
	}
	code, codeID := codeOf(t, db, a.ID, "u00001")
	mustExec(t, db, `INSERT INTO released_codes (code_id, pool) VALUES ($1, 'held')`, codeID)
	if free, err := codes.Free(ctx, db, "held"); err != nil || free != 1 {
		t.Errorf("%d codes free (%v), want 1: the held code counted as free", free, err)
	}
	if stats, err := codes.Stats(ctx, db); err != nil || len(stats) != 1 || stats[0] != (codes.PoolStats{Pool: "held", Total: 3, Free: 1, Reserved: 2}) {
		t.Errorf("stats %+v (%v), want 3 codes, 1 free, 2 reserved", stats, err)
	}

	b, err := p.Plan(ctx, crowdSpec("held-b", "held", 1))
	if err != nil {
		t.Fatalf("a launch needing the one free code: %v", err)
	}
	if got, _ := codeOf(t, db, b.ID, "u00001"); got == code || got != "HELD-000003" {
		t.Errorf("the launch gave out %q, want the free HELD-000003 (not %q, still held)", got, code)
	}
	if n := count(t, db, `SELECT count(*) FROM released_codes`); n != 0 {
		t.Errorf("%d codes still listed as released, want the held one dropped", n)
	}
	_, err = p.Plan(ctx, crowdSpec("held-c", "held", 1))
	var short *campaign.PoolShortError
	if !errors.As(err, &short) || short.Free != 0 {
		t.Errorf("a launch on the used-up pool: %v; want refused with no code free", err)
	}
	checkCodes(t, db)
}

// A cancel racing the outcome of a chunk in flight: a worker leased batch 0's recipients and sent them,
// and their outcome comes back unknown (the provider's answer was lost) just as the campaign is cancelled.
// Whichever gets there first, the chunk's recipients end unknown and keep their codes (the cancel leaves
// leased recipients to their run), and only the recipients nobody leased are cancelled with their codes
// back in the pool.
func TestCancelRacingAnUnknownOutcomeKeepsItsCodes(t *testing.T) {
	t.Parallel()
	db, url := testdb.New(t)
	ctx := context.Background()
	const size, batchSize = 100, 50
	seedCrowd(t, db, size)
	planner := newPlanners(t, url, 1)[0]
	recorder, canceller := campaign.NewStore(newPool(t, url, 1)), campaign.NewStore(newPool(t, url, 1))
	for round := 1; round <= 6; round++ {
		pool := fmt.Sprintf("inflight%d", round)
		addCodes(t, db, pool, size)
		rep, err := planner.Plan(ctx, crowdSpec(fmt.Sprintf("inflight%d", round), pool, size))
		if err != nil {
			t.Fatal(err)
		}
		c, err := recorder.Get(ctx, rep.ID)
		if err != nil {
			t.Fatal(err)
		}
		sent := recipientsOf(t, db, rep.ID, 0)
		lease := campaign.Lease{Batch: 0, Token: fmt.Sprintf("run-%d", round), Epoch: "e", TTL: time.Hour}
		if ch, err := recorder.LeaseChunk(ctx, c, sent, lease); err != nil || len(ch.Leased) != batchSize {
			t.Fatalf("lease: %d leased (%v)", len(ch.Leased), err)
		}
		planned := map[string]string{}
		outs := make([]campaign.Outcome, len(sent))
		for i, u := range sent {
			planned[u], _ = codeOf(t, db, rep.ID, u)
			outs[i] = campaign.Outcome{UserID: u, Status: campaign.StatusUnknown, Reason: "timeout after the request was written"}
		}
		var moved map[string]int64
		var cancelled int64
		errs := together(
			func() (err error) { moved, err = recorder.Record(ctx, rep.ID, outs, lease, nil); return err },
			func() error {
				if _, err := canceller.Transition(ctx, rep.ID, []campaign.State{campaign.StateRunning}, campaign.StateCancelled); err != nil {
					return err
				}
				n, err := canceller.CancelUnleased(ctx, rep.ID)
				cancelled = n
				return err
			},
		)
		if errs[0] != nil || moved[campaign.StatusUnknown] != batchSize {
			t.Fatalf("round %d: the unknown outcome moved %v (%v), want %d unknown: did the cancel take recipients whose send was in flight?",
				round, moved, errs[0], batchSize)
		}
		if errs[1] != nil || cancelled != size-batchSize {
			t.Fatalf("round %d: cancel skipped %d (%v), want the %d recipients nobody leased", round, cancelled, errs[1], size-batchSize)
		}
		for _, u := range sent {
			if got, _ := codeOf(t, db, rep.ID, u); got != planned[u] {
				t.Errorf("round %d: %s (unknown) holds %q, want its code %q", round, u, got, planned[u])
			}
		}
		if free, err := codes.Free(ctx, db, pool); err != nil || free != size-batchSize {
			t.Errorf("round %d: %d codes free (%v), want %d: the cancelled recipients'", round, free, err, size-batchSize)
		}
		checkCodes(t, db)
		if t.Failed() {
			t.FailNow()
		}
	}
}
