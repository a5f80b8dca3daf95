package codes

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// progressEvery is how many codes pass between two Progress calls.
const progressEvery = 10_000

// maxFruitlessRounds is how many rounds in a row may add no code at all before Generate gives up: with a
// sane length that never happens, so it means the code space of this prefix and length is used up.
const maxFruitlessRounds = 3

// generateWorkers is how many connections Generate inserts through at once. Each new code costs Postgres
// a foreign-key check and three index insertions in a single-threaded backend, so on the 2-core target two
// backends nearly halve the time (about 22 s to 12 s for a million codes).
const generateWorkers = 2

// writeLockKey is the transaction-level advisory lock taken by everything that inserts codes (Generate,
// Import). Generate's connections wait for each other at the end, out of Postgres's sight; if another
// writer could wait for one of them while the other waited for it, Postgres could not see the deadlock.
// Serialising the writers rules that out. The launch planner takes it too, while it reserves (see
// WriteLockKey).
const writeLockKey = WriteLockKey

// WriteLockKey is the transaction-level advisory lock that serialises everything that adds codes or moves
// a pool's cursor (Generate, Import and the launch planner's reservation): a code can then never be
// committed with an id below a cursor that already passed it.
const WriteLockKey = 0x636f6465 // "code"

// Generate adds exactly opts.Count new random codes to the pool opts.Pool, creating the pool if it is new.
//
// Codes are streamed into temporary tables with COPY as they are generated (memory stays flat), then added
// with INSERT … SELECT … ON CONFLICT (code) DO NOTHING, so the database's unique index is what makes them
// unique, across every pool and against concurrent writers; codes lost to a collision (at length 8, a
// million codes meet one about every other time, by the birthday bound) are made up in further rounds
// until exactly Count are new. The work is split between two connections by the first random character,
// so their codes can never collide with each other; their transactions commit together at the end, and
// on any error both roll back and no code is added. (The pool row itself is created and committed first,
// so a failed Generate may leave a new, empty pool; and a crash in the instant between the two commits
// would leave only one share of the codes.) About 12 s for a million codes on a 2-core machine with a
// local Postgres 15 (BenchmarkGenerate).
func Generate(ctx context.Context, pool *pgxpool.Pool, opts GenerateOptions) (GenerateReport, error) {
	return generate(ctx, pool, opts, func(int) io.Reader { return rand.Reader })
}

// generate is Generate with the source of randomness of each worker as a parameter, for tests that need
// collisions.
func generate(ctx context.Context, pool *pgxpool.Pool, opts GenerateOptions, random func(worker int) io.Reader) (GenerateReport, error) {
	if err := opts.validate(); err != nil {
		return GenerateReport{}, err
	}
	rep := GenerateReport{Pool: opts.Pool}
	var err error
	if rep.PoolCreated, err = ensurePool(ctx, pool, opts.Pool); err != nil {
		return rep, fmt.Errorf("generate codes: %w", err)
	}

	// Split Count in proportion to the share of the alphabet each worker's first character is drawn
	// from, so that every character stays equally likely in every position.
	n := generateWorkers
	if opts.Count < n || pool.Config().MaxConns < int32(n) {
		n = 1
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	prog := &progressSum{fn: opts.Progress, done: make([]int, n)}
	workers := make([]*genWorker, n)
	lo, given := 0, 0
	for i := range workers {
		hi := len(Alphabet) * (i + 1) / n
		quota := (opts.Count*hi + len(Alphabet)/2) / len(Alphabet)
		if i == n-1 {
			quota = opts.Count
		}
		gen := newGenerator(random(i), opts.Prefix, opts.Length)
		gen.lo, gen.hi = lo, hi
		workers[i] = &genWorker{id: i, pool: opts.Pool, quota: quota - given, gen: gen, prog: prog}
		lo, given = hi, quota
	}
	for _, w := range workers {
		if w.tx, err = pool.Begin(ctx); err != nil {
			break
		}
		defer w.tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck

		// Worker 0 takes the lock before any worker inserts.
		if w.id == 0 {
			if _, err = w.tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, writeLockKey); err != nil {
				break
			}
		}
	}
	if err != nil {
		return rep, fmt.Errorf("generate codes: %w", err)
	}

	errs := make(chan error, n)
	for _, w := range workers {
		go func() {
			err := w.run(ctx)
			if err != nil {
				cancel() // the others' work is going to be rolled back anyway
			}
			errs <- err
		}()
	}
	var firstErr error
	for range workers {
		if err := <-errs; err != nil && (firstErr == nil || errors.Is(firstErr, context.Canceled)) {
			firstErr = err
		}
	}
	for _, w := range workers {
		rep.Generated += w.added
		rep.Collisions += w.collisions
		rep.Rounds = max(rep.Rounds, w.rounds)
	}
	if firstErr != nil {
		rep.Generated = 0
		return rep, fmt.Errorf("generate codes: %w", firstErr)
	}
	// Worker 0 holds the lock, so it commits last.
	for i := n - 1; i >= 0; i-- {
		if err := workers[i].tx.Commit(ctx); err != nil {
			rep.Generated = workersAdded(workers[i+1:])
			if rep.Generated > 0 {
				return rep, fmt.Errorf("generate codes: commit: %w (only %d of the %d codes were added; check the pool with codes stats)", err, rep.Generated, opts.Count)
			}
			return rep, fmt.Errorf("generate codes: commit: %w", err)
		}
	}
	if opts.Progress != nil {
		opts.Progress(opts.Count)
	}
	return rep, nil
}

func workersAdded(ws []*genWorker) int {
	n := 0
	for _, w := range ws {
		n += w.added
	}
	return n
}

// genWorker adds its quota of new codes through its own transaction.
type genWorker struct {
	id    int
	pool  string
	quota int
	gen   *generator
	prog  *progressSum
	tx    pgx.Tx

	added, collisions, rounds int
}

func (w *genWorker) run(ctx context.Context) error {
	if _, err := w.tx.Exec(ctx, `CREATE TEMP TABLE codes_new (code text NOT NULL) ON COMMIT DROP`); err != nil {
		return fmt.Errorf("staging table: %w", err)
	}
	fruitless := 0
	for w.added < w.quota {
		w.rounds++
		if w.rounds > 1 {
			if _, err := w.tx.Exec(ctx, `TRUNCATE codes_new`); err != nil {
				return err
			}
		}
		need := w.quota - w.added
		src := &codeSource{gen: w.gen, left: need, report: func(done int) { w.prog.set(w.id, w.added+done) }}
		if _, err := w.tx.CopyFrom(ctx, pgx.Identifier{"codes_new"}, []string{"code"}, src); err != nil {
			if src.err != nil {
				err = src.err
			}
			return fmt.Errorf("copy: %w", err)
		}
		tag, err := w.tx.Exec(ctx, `
			INSERT INTO promo_codes (pool, code)
			SELECT $1, code FROM codes_new
			ON CONFLICT (code) DO NOTHING`, w.pool)
		if err != nil {
			return fmt.Errorf("insert: %w", err)
		}
		added := int(tag.RowsAffected())
		w.added += added
		w.collisions += need - added
		if added > 0 {
			fruitless = 0
		} else if fruitless++; fruitless == maxFruitlessRounds {
			return fmt.Errorf("%d rounds added no new code: the space of %d-character codes with prefix %q looks used up; use a longer length or another prefix",
				fruitless, w.gen.length, w.gen.prefix)
		}
	}
	return nil
}

// progressSum adds up the workers' progress for GenerateOptions.Progress, which must not be called
// concurrently.
type progressSum struct {
	mu   sync.Mutex
	fn   func(int)
	done []int
}

func (p *progressSum) set(worker, done int) {
	if p.fn == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done[worker] = done
	sum := 0
	for _, d := range p.done {
		sum += d
	}
	p.fn(sum)
}

// execer is what ensurePool needs: a pool (to commit at once) or a transaction.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// ensurePool creates the pool if it does not exist and reports whether it did.
func ensurePool(ctx context.Context, db execer, name string) (bool, error) {
	tag, err := db.Exec(ctx, `INSERT INTO code_pools (name) VALUES ($1) ON CONFLICT (name) DO NOTHING`, name)
	if err != nil {
		return false, fmt.Errorf("create pool %s: %w", name, err)
	}
	return tag.RowsAffected() == 1, nil
}

// codeSource feeds COPY freshly generated codes, left of them. pgx calls it from its own goroutine.
type codeSource struct {
	gen    *generator
	left   int
	done   int
	report func(done int)
	code   string
	vals   [1]any
	err    error
}

func (s *codeSource) Next() bool {
	if s.left == 0 || s.err != nil {
		return false
	}
	s.code, s.err = s.gen.next()
	if s.err != nil {
		return false
	}
	s.left--
	s.done++
	if s.done%progressEvery == 0 {
		s.report(s.done)
	}
	return true
}

func (s *codeSource) Values() ([]any, error) {
	s.vals[0] = s.code
	return s.vals[:], nil
}

func (s *codeSource) Err() error { return s.err }

// Import adds the codes in r, one per line, to the pool poolName, creating the pool if it is new.
//
// Lines are trimmed and blank ones skipped, and so is a first line that names the column (headerWords:
// "code", "promo_code", "kupon", …; ImportReport.SkippedHeader); every code must be 4 to 64 of A–Z, a–z, 0–9, '-' and '_'
// (case is kept and matters). The first bad line fails the import with a *LineError and nothing is added.
// Codes that already exist, in this pool or any other, or that repeat in the file, are skipped and counted
// as duplicates. The file is streamed through COPY and added in one statement, in one transaction.
func Import(ctx context.Context, pool *pgxpool.Pool, poolName string, r io.Reader) (ImportReport, error) {
	var rep ImportReport
	if err := checkPoolName(poolName); err != nil {
		return rep, err
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return rep, fmt.Errorf("import codes: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck

	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, writeLockKey); err != nil {
		return rep, fmt.Errorf("import codes: %w", err)
	}
	created, err := ensurePool(ctx, tx, poolName)
	if err != nil {
		return rep, fmt.Errorf("import codes: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE TEMP TABLE codes_import (line bigint NOT NULL, code text NOT NULL) ON COMMIT DROP`); err != nil {
		return rep, fmt.Errorf("import codes: staging table: %w", err)
	}
	src := newLineSource(r)
	n, err := tx.CopyFrom(ctx, pgx.Identifier{"codes_import"}, []string{"line", "code"}, src)
	rep.SkippedHeader = src.header
	if src.err != nil {
		return rep, src.err // a *LineError or a read error, already with its context
	}
	if err != nil {
		return rep, fmt.Errorf("import codes: copy: %w", err)
	}
	rep.Lines = n
	if n == 0 {
		return rep, fmt.Errorf("%w: the file holds no code (one code a line)", ErrInvalidOptions)
	}
	// ORDER BY line: when codes are handed out in id order, they go out in the file's order.
	tag, err := tx.Exec(ctx, `
		INSERT INTO promo_codes (pool, code)
		SELECT $1, code FROM codes_import ORDER BY line
		ON CONFLICT (code) DO NOTHING`, poolName)
	if err != nil {
		return rep, fmt.Errorf("import codes: insert: %w", err)
	}
	rows, err := tx.Query(ctx, `SELECT p.pool, count(DISTINCT p.code) FROM codes_import i JOIN promo_codes p ON p.code = i.code
		WHERE p.pool <> $1 GROUP BY p.pool`, poolName)
	if err != nil {
		return rep, fmt.Errorf("import codes: %w", err)
	}
	for rows.Next() {
		var other string
		var k int64
		if err := rows.Scan(&other, &k); err != nil {
			rows.Close()
			return rep, fmt.Errorf("import codes: %w", err)
		}
		if rep.InOtherPools == nil {
			rep.InOtherPools = map[string]int64{}
		}
		rep.InOtherPools[other] = k
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return rep, fmt.Errorf("import codes: %w", err)
	}
	if created && tag.RowsAffected() == 0 {
		// A new pool that would get none of the file's codes: they all belong to other pools (the pool
		// name is likely wrong). An empty pool would only make the next launch fail later.
		return rep, fmt.Errorf("%w: none of the file's codes is new: %s (a code is in one pool only); pool %s was not created; import into that pool with --pool, or check the file", ErrInvalidOptions, inPools(rep.InOtherPools), poolName)
	}
	if err := tx.Commit(ctx); err != nil {
		return rep, fmt.Errorf("import codes: commit: %w", err)
	}
	rep.Inserted = tag.RowsAffected()
	rep.Duplicates = rep.Lines - rep.Inserted
	return rep, nil
}

// inPools says how many codes belong to each pool of counts, in the pools' order.
func inPools(counts map[string]int64) string {
	parts := make([]string, 0, len(counts))
	for _, p := range slices.Sorted(maps.Keys(counts)) {
		parts = append(parts, fmt.Sprintf("%d belong to pool %s", counts[p], p))
	}
	return strings.Join(parts, ", ")
}

// lineSource feeds COPY the validated codes of a file, one line at a time.
type lineSource struct {
	sc   *bufio.Scanner
	line int
	code string
	vals [2]any
	err  error
	// header is the file's first code-bearing line when it names the column (headerWords) and was
	// skipped: a partner's CSV export.
	header string
	seen   bool // a non-blank line was read
}

// headerWords are first lines that name a column of codes rather than being one: imported, "code" went out
// to a customer as their promo code.
var headerWords = map[string]bool{"code": true, "codes": true, "kod": true, "kodlar": true, "promo": true, "promo_code": true,
	"promocode": true, "promo-code": true, "coupon": true, "coupon_code": true, "coupons": true, "kupon": true, "kupon_kodu": true,
	"voucher": true, "voucher_code": true, "vouchers": true, "promo_kodu": true}

func newLineSource(r io.Reader) *lineSource {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	return &lineSource{sc: sc}
}

func (s *lineSource) Next() bool {
	for s.err == nil {
		if !s.sc.Scan() {
			if err := s.sc.Err(); errors.Is(err, bufio.ErrTooLong) {
				s.err = &LineError{Line: s.line + 1, Msg: fmt.Sprintf("line is too long: a code is at most %d characters", MaxImportLength)}
			} else if err != nil {
				s.err = fmt.Errorf("import codes: read: %w", err)
			}
			return false
		}
		s.line++
		code := strings.TrimSpace(s.sc.Text())
		if s.line == 1 {
			code = strings.TrimSpace(strings.TrimPrefix(code, "\uFEFF"))
		}
		if code == "" {
			continue
		}
		if first := !s.seen; first {
			s.seen = true
			if headerWords[strings.ToLower(code)] {
				s.header = code
				continue
			}
		}
		if s.line == 1 && (strings.HasPrefix(code, "\xff\xfe") || strings.HasPrefix(code, "\xfe\xff")) {
			s.err = &LineError{Line: 1, Msg: "the file is UTF-16 (Excel's \"Unicode text\"); save it as UTF-8 or plain text (CSV UTF-8), one code per line"}
			return false
		}
		if !validImportCode(code) {
			shown := code
			if len(shown) > 80 {
				shown = shown[:80] + "…"
			}
			s.err = &LineError{Line: s.line, Msg: fmt.Sprintf("code %q must be %d to %d characters of A-Z, a-z, 0-9, '-' and '_', one code per line",
				shown, MinImportLength, MaxImportLength)}
			return false
		}
		s.code = code
		return true
	}
	return false
}

func (s *lineSource) Values() ([]any, error) {
	s.vals = [2]any{int64(s.line), s.code}
	return s.vals[:], nil
}

func (s *lineSource) Err() error { return s.err }

// heldTest is the SQL condition that the released code rc is held by a recipient all the same. Only a
// faulty release leaves such a code, and it is not free: the launch planner drops it from released_codes
// before it counts, and the counts here never count it.
const heldTest = `EXISTS (SELECT 1 FROM campaign_recipients r WHERE r.code_id = rc.code_id)`

// Stats returns the code counts of every pool, empty ones included, ordered by pool name.
func Stats(ctx context.Context, pool *pgxpool.Pool) ([]PoolStats, error) {
	rows, err := pool.Query(ctx, `
		SELECT p.name, t.total, t.fresh + r.released, t.total - t.fresh - r.released
		FROM code_pools p,
		     LATERAL (SELECT count(*) AS total, count(*) FILTER (WHERE c.id > p.next_id) AS fresh
		              FROM promo_codes c WHERE c.pool = p.name) t,
		     LATERAL (SELECT count(*) AS released FROM released_codes rc WHERE rc.pool = p.name AND NOT `+heldTest+`) r
		ORDER BY p.name`)
	if err != nil {
		return nil, fmt.Errorf("code pool stats: %w", err)
	}
	stats, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (PoolStats, error) {
		var s PoolStats
		err := row.Scan(&s.Pool, &s.Total, &s.Free, &s.Reserved)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("code pool stats: %w", err)
	}
	return stats, nil
}

// Free returns how many codes of the pool poolName are not reserved, or an error wrapping ErrPoolNotFound.
func Free(ctx context.Context, pool *pgxpool.Pool, poolName string) (int64, error) {
	var free int64
	err := pool.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM promo_codes c WHERE c.pool = p.name AND c.id > p.next_id)
		     + (SELECT count(*) FROM released_codes rc WHERE rc.pool = p.name AND NOT `+heldTest+`)
		FROM code_pools p WHERE p.name = $1`, poolName).Scan(&free)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("free codes of %q: %w", poolName, ErrPoolNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("free codes of %q: %w", poolName, err)
	}
	return free, nil
}
