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
				if want := (codes.ImportReport{Lines: imported + 41, Inserted: imported, Duplicates: 41}); errs[3] != nil || imp.Lines != want.Lines || imp.Inserted != want.Inserted || imp.Duplicates != want.Duplicates {
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
