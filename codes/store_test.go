package codes_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/codes"
	"github.com/campaignctl/campaignctl/internal/testdb"
)

func poolCodes(t *testing.T, db *pgxpool.Pool, pool string) []string {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT code FROM promo_codes WHERE pool = $1 ORDER BY id`, pool)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestGenerate(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()

	var last atomic.Int64
	rep, err := codes.Generate(ctx, db, codes.GenerateOptions{Pool: "yaz26", Count: 25_000, Prefix: "YAZ-",
		Progress: func(done int) { last.Store(int64(done)) }})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(codes.GenerateReport{Pool: "yaz26", PoolCreated: true, Generated: 25_000, Rounds: 1}, rep); diff != "" {
		t.Errorf("report (-want +got):\n%s", diff)
	}
	if last.Load() != 25_000 {
		t.Errorf("last progress %d, want 25000", last.Load())
	}
	shape := regexp.MustCompile(`^YAZ-[` + codes.Alphabet + `]{8}$`)
	got := poolCodes(t, db, "yaz26")
	seen := map[string]bool{}
	for _, c := range got {
		if !shape.MatchString(c) {
			t.Fatalf("code %q does not match %v", c, shape)
		}
		if seen[c] {
			t.Fatalf("code %q twice", c)
		}
		seen[c] = true
	}
	if len(got) != 25_000 {
		t.Fatalf("%d codes stored, want 25000", len(got))
	}

	// A second call adds to the existing pool, with another length and no prefix.
	rep, err = codes.Generate(ctx, db, codes.GenerateOptions{Pool: "yaz26", Count: 1000, Length: 12})
	if err != nil {
		t.Fatal(err)
	}
	if rep.PoolCreated || rep.Generated != 1000 {
		t.Errorf("second Generate: %+v", rep)
	}
	var total, distinct int64
	if err := db.QueryRow(ctx, `SELECT count(*), count(DISTINCT code) FROM promo_codes WHERE pool = 'yaz26'`).Scan(&total, &distinct); err != nil {
		t.Fatal(err)
	}
	if total != 26_000 || distinct != total {
		t.Errorf("after two Generates: %d codes, %d distinct; want 26000 and 26000", total, distinct)
	}
	if free, err := codes.Free(ctx, db, "yaz26"); err != nil || free != 26_000 {
		t.Errorf("Free = %d, %v; want 26000", free, err)
	}
}

// seeded gives each worker the same stream of "random" bytes for the same seed.
func seeded(seed byte) func(int) io.Reader {
	return func(worker int) io.Reader { return mrand.NewChaCha8([32]byte{seed, byte(worker)}) }
}

// constant gives worker i an endless stream of the byte 16·i, so that it only ever makes one code.
func constant(worker int) io.Reader { return constantReader(16 * worker) }

type constantReader byte

func (c constantReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(c)
	}
	return len(p), nil
}

// TestGenerateTopsUpAfterCollisions replays the random stream of an earlier Generate, so that the first
// 1000 codes of the second one all exist already: it must make them up in a second round and still add
// exactly Count new codes.
func TestGenerateTopsUpAfterCollisions(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	if _, err := codes.GenerateWithRandom(ctx, db, codes.GenerateOptions{Pool: "first", Count: 1000}, seeded(1)); err != nil {
		t.Fatal(err)
	}
	rep, err := codes.GenerateWithRandom(ctx, db, codes.GenerateOptions{Pool: "second", Count: 1500}, seeded(1))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(codes.GenerateReport{Pool: "second", PoolCreated: true, Generated: 1500, Collisions: 1000, Rounds: 2}, rep); diff != "" {
		t.Errorf("report (-want +got):\n%s", diff)
	}
	first, second := poolCodes(t, db, "first"), poolCodes(t, db, "second")
	if len(first) != 1000 || len(second) != 1500 {
		t.Fatalf("pools hold %d and %d codes, want 1000 and 1500", len(first), len(second))
	}
	var total, distinct int64
	if err := db.QueryRow(ctx, `SELECT count(*), count(DISTINCT code) FROM promo_codes`).Scan(&total, &distinct); err != nil {
		t.Fatal(err)
	}
	if total != 2500 || distinct != 2500 {
		t.Errorf("%d codes, %d distinct; want 2500 of each", total, distinct)
	}
}

// TestGenerateGivesUpWhenNothingIsNew feeds a random source that only ever yields one code: Generate must
// stop with an error instead of looping, and add nothing.
func TestGenerateGivesUpWhenNothingIsNew(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	rep, err := codes.GenerateWithRandom(ctx, db, codes.GenerateOptions{Pool: "stuck", Count: 10}, constant)
	if err == nil || !strings.Contains(err.Error(), "looks used up") {
		t.Fatalf("Generate = %+v, %v; want the used-up error", rep, err)
	}
	var n int64
	if err := db.QueryRow(ctx, `SELECT count(*) FROM promo_codes`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d codes stored after a failed Generate (%v)", n, err)
	}
}

func TestGenerateInvalid(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	_, err := codes.Generate(context.Background(), db, codes.GenerateOptions{Pool: "yaz", Count: 0})
	if !errors.Is(err, codes.ErrInvalidOptions) {
		t.Errorf("Count 0: %v, want ErrInvalidOptions", err)
	}
	if _, err := codes.Free(context.Background(), db, "yaz"); !errors.Is(err, codes.ErrPoolNotFound) {
		t.Errorf("a failed Generate created the pool: Free = %v", err)
	}
}

func TestImport(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	file := "\uFEFFKOD-0001\r\n  kod_0002  \n\n\tKOD-0003\nKOD-0001\nkod-0001\n"
	rep, err := codes.Import(ctx, db, "partner", strings.NewReader(file))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(codes.ImportReport{Lines: 5, Inserted: 4, Duplicates: 1}, rep); diff != "" {
		t.Errorf("report (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"KOD-0001", "kod_0002", "KOD-0003", "kod-0001"}, poolCodes(t, db, "partner")); diff != "" {
		t.Errorf("codes in file order (-want +got):\n%s", diff)
	}

	// Importing again: everything is a duplicate, also when offered to another pool.
	rep, err = codes.Import(ctx, db, "other", strings.NewReader("KOD-0003\nKOD-0004\n"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(codes.ImportReport{Lines: 2, Inserted: 1, Duplicates: 1, InOtherPools: map[string]int64{"partner": 1}}, rep); diff != "" {
		t.Errorf("second import (-want +got):\n%s", diff)
	}

	// A file whose codes all belong to other pools, offered to a new pool (a wrong --pool): refused, and
	// the pool is not created. Before, an empty pool was left behind, for a launch to fail on later.
	_, err = codes.Import(ctx, db, "typo", strings.NewReader("KOD-0001\nKOD-0004\nKOD-0003\n"))
	if !errors.Is(err, codes.ErrInvalidOptions) || !strings.Contains(err.Error(), "1 belong to pool other, 2 belong to pool partner") ||
		!strings.Contains(err.Error(), "pool typo was not created") {
		t.Fatalf("import of other pools' codes into a new pool: %v; want ErrInvalidOptions naming the pools", err)
	}
	if _, err := codes.Free(ctx, db, "typo"); !errors.Is(err, codes.ErrPoolNotFound) {
		t.Errorf("the refused import created its pool: Free = %v", err)
	}
	// The same file into a pool that exists is a repeat, not an error: nothing new, each code counted.
	rep, err = codes.Import(ctx, db, "other", strings.NewReader("KOD-0001\nKOD-0004\n"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(codes.ImportReport{Lines: 2, Inserted: 0, Duplicates: 2, InOtherPools: map[string]int64{"partner": 1}}, rep); diff != "" {
		t.Errorf("a repeat into an existing pool (-want +got):\n%s", diff)
	}
}

// A partner's CSV export names its column on the first line: that line is not a code. Imported, "code" was
// a valid code of four letters, and went out to a customer as their promo code. A word that names the
// column further down is a code like any other.
func TestImportSkipsTheColumnsName(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	for i, tc := range []struct{ file, header string }{
		{"\uFEFFCode\r\nKOD-0001\r\nKOD-0002\r\n", "Code"},
		{"\n  promo_code \nKOD-0003\nKOD-0004\n", "promo_code"},
		{"KUPON\nKOD-0005\nKOD-0006\n", "KUPON"},
	} {
		rep, err := codes.Import(ctx, db, fmt.Sprintf("p%d", i), strings.NewReader(tc.file))
		if err != nil || rep.SkippedHeader != tc.header || rep.Lines != 2 || rep.Inserted != 2 {
			t.Errorf("%q: %+v, %v; want the header %q skipped, 2 codes imported", tc.file, rep, err, tc.header)
		}
	}
	rep, err := codes.Import(ctx, db, "later", strings.NewReader("KOD-0101\ncode\n"))
	if err != nil || rep.SkippedHeader != "" || rep.Inserted != 2 {
		t.Errorf("a header word on line 2: %+v, %v; want it imported as a code", rep, err)
	}
}

func TestImportBadLine(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	tests := []struct {
		name, file string
		want       codes.LineError
	}{
		{"too short", "KOD-0001\n\nABC\nKOD-0002\n", codes.LineError{Line: 3, Msg: `code "ABC" must be 4 to 64 characters of A-Z, a-z, 0-9, '-' and '_', one code per line`}},
		{"UTF-16", "\xff\xfeK\x00O\x00D\x00-\x001\x00\n\x00", codes.LineError{Line: 1, Msg: `the file is UTF-16 (Excel's "Unicode text"); save it as UTF-8 or plain text (CSV UTF-8), one code per line`}},
		{"space inside", "KOD-0001\nKOD 0002\n", codes.LineError{Line: 2, Msg: `code "KOD 0002" must be 4 to 64 characters of A-Z, a-z, 0-9, '-' and '_', one code per line`}},
		{"two per line", "KOD-0001,KOD-0002\n", codes.LineError{Line: 1, Msg: `code "KOD-0001,KOD-0002" must be 4 to 64 characters of A-Z, a-z, 0-9, '-' and '_', one code per line`}},
		{"non-ASCII", "KOD-0001\nKOD-ĞÜŞ1\n", codes.LineError{Line: 2, Msg: `code "KOD-ĞÜŞ1" must be 4 to 64 characters of A-Z, a-z, 0-9, '-' and '_', one code per line`}},
		{"too long", "KOD-0001\n" + strings.Repeat("A", 65) + "\n", codes.LineError{Line: 2, Msg: `code "` + strings.Repeat("A", 65) + `" must be 4 to 64 characters of A-Z, a-z, 0-9, '-' and '_', one code per line`}},
		{"huge line", "KOD-0001\n" + strings.Repeat("A", 2<<20) + "\n", codes.LineError{Line: 2, Msg: "line is too long: a code is at most 64 characters"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := codes.Import(ctx, db, "bad", strings.NewReader(tc.file))
			var le *codes.LineError
			if !errors.As(err, &le) {
				t.Fatalf("Import = %+v, %v; want a *LineError", rep, err)
			}
			if diff := cmp.Diff(tc.want, *le); diff != "" {
				t.Errorf("LineError (-want +got):\n%s", diff)
			}
		})
	}
	// Nothing was written, not even the pool.
	var n int64
	if err := db.QueryRow(ctx, `SELECT count(*) FROM promo_codes`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d codes stored after failed imports (%v)", n, err)
	}
	if _, err := codes.Free(ctx, db, "bad"); !errors.Is(err, codes.ErrPoolNotFound) {
		t.Errorf("Free of the pool of a failed import: %v, want ErrPoolNotFound", err)
	}
	if _, err := codes.Import(ctx, db, "Bad Pool", strings.NewReader("KOD-0001\n")); !errors.Is(err, codes.ErrInvalidOptions) {
		t.Errorf("bad pool name: %v, want ErrInvalidOptions", err)
	}
}

func TestStatsAndFree(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	if _, err := codes.Free(ctx, db, "nope"); !errors.Is(err, codes.ErrPoolNotFound) {
		t.Errorf("Free of an unknown pool: %v, want ErrPoolNotFound", err)
	}
	if stats, err := codes.Stats(ctx, db); err != nil || len(stats) != 0 {
		t.Errorf("Stats of an empty database = %v, %v", stats, err)
	}
	if _, err := codes.Generate(ctx, db, codes.GenerateOptions{Pool: "b", Count: 10}); err != nil {
		t.Fatal(err)
	}
	if _, err := codes.Import(ctx, db, "a", strings.NewReader("A-0001\nA-0002\nA-0003\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO code_pools (name) VALUES ('empty')`); err != nil {
		t.Fatal(err)
	}
	// Give out three codes of pool b and take one back, the way the planner and the worker do: the
	// cursor passes the first three, and the third returns to released_codes.
	if _, err := db.Exec(ctx, `UPDATE code_pools SET next_id = (SELECT id FROM promo_codes WHERE pool = 'b' ORDER BY id OFFSET 2 LIMIT 1)
		WHERE name = 'b'`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO released_codes (code_id, pool) SELECT id, pool FROM promo_codes WHERE pool = 'b' ORDER BY id OFFSET 2 LIMIT 1`); err != nil {
		t.Fatal(err)
	}

	stats, err := codes.Stats(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	want := []codes.PoolStats{
		{Pool: "a", Total: 3, Free: 3},
		{Pool: "b", Total: 10, Free: 8, Reserved: 2},
		{Pool: "empty"},
	}
	if diff := cmp.Diff(want, stats); diff != "" {
		t.Errorf("Stats (-want +got):\n%s", diff)
	}
	for pool, want := range map[string]int64{"a": 3, "b": 8, "empty": 0} {
		if got, err := codes.Free(ctx, db, pool); err != nil || got != want {
			t.Errorf("Free(%s) = %d, %v; want %d", pool, got, err, want)
		}
	}
}
