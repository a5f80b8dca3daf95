package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// reserveCode reserves the code for a new campaign named after it, as the launch planner would.
func reserveCode(t *testing.T, count func(string) int64, code string) {
	t.Helper()
	// The planner gives codes out in id order and moves the pool's cursor past them.
	n := count(`
		WITH r AS (
			UPDATE code_pools p SET next_id = c.id FROM promo_codes c
			WHERE c.code = '` + code + `' AND p.name = c.pool AND p.next_id < c.id RETURNING 1)
		SELECT count(*) FROM r`)
	if n != 1 {
		t.Fatalf("reserved %d codes %q, want 1", n, code)
	}
}

func poolStatsJSON(t *testing.T, env map[string]string, args ...string) []map[string]any {
	t.Helper()
	stdout, stderr, code := cli(t, env, append([]string{"codes", "stats", "--json"}, args...)...)
	if code != 0 {
		t.Fatalf("codes stats --json: exit %d\nstderr: %s", code, stderr)
	}
	var got []map[string]any
	if err := json.Unmarshal([]byte(stdout), &got); err != nil {
		t.Fatalf("codes stats --json printed no JSON array: %v\n%s", err, stdout)
	}
	return got
}

func TestCodesGenerateThenStats(t *testing.T) {
	t.Parallel()
	env, count := badInputDB(t) // pool small: X1 and X2, free
	reserveCode(t, count, "X1")

	stdout, stderr, code := cli(t, env, "codes", "generate", "--pool", "yaz", "--count", "25")
	if code != 0 || stdout != "pool yaz: 25 new codes\n" {
		t.Fatalf("codes generate: exit %d, stdout %q\nstderr: %s", code, stdout, stderr)
	}

	// Every pool, in name order, with the JSON field names of the contract and numbers as numbers.
	want := []map[string]any{
		{"pool": "small", "total": 2.0, "free": 1.0, "reserved": 1.0},
		{"pool": "yaz", "total": 25.0, "free": 25.0, "reserved": 0.0},
	}
	if diff := cmp.Diff(want, poolStatsJSON(t, env)); diff != "" {
		t.Errorf("codes stats --json (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want[1:], poolStatsJSON(t, env, "--pool", "yaz")); diff != "" {
		t.Errorf("codes stats --json --pool yaz (-want +got):\n%s", diff)
	}

	stdout, stderr, code = cli(t, env, "codes", "stats")
	if code != 0 {
		t.Fatalf("codes stats: exit %d\nstderr: %s", code, stderr)
	}
	var rows [][]string
	for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
		rows = append(rows, strings.Fields(line))
	}
	wantRows := [][]string{
		{"POOL", "TOTAL", "FREE", "RESERVED"},
		{"small", "2", "1", "1"},
		{"yaz", "25", "25", "0"},
	}
	if diff := cmp.Diff(wantRows, rows); diff != "" {
		t.Errorf("codes stats table (-want +got):\n%s\n%s", diff, stdout)
	}
	if stderr != "" {
		t.Errorf("codes stats wrote to stderr off a terminal: %q", stderr)
	}
}

func TestCodesImportCountsDuplicates(t *testing.T) {
	t.Parallel()
	env, count := badInputDB(t)

	// A file without a code is refused, and no pool is made for it.
	empty := writeFile(t, "empty.txt", "\n  \n")
	if _, stderr, code := cli(t, env, "codes", "import", "--pool", "nothing", empty); code != 2 || !strings.Contains(stderr, "holds no code") {
		t.Fatalf("empty file: exit %d, %s", code, stderr)
	}
	if n := count(`SELECT count(*) FROM code_pools WHERE name = 'nothing'`); n != 0 {
		t.Fatalf("an empty import made the pool")
	}

	// A code that is already stored, in another pool.
	other := writeFile(t, "other.txt", "KNOWN-0001\n")
	if stdout, stderr, code := cli(t, env, "codes", "import", "--pool", "other", other); code != 0 {
		t.Fatalf("first import: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}

	// One known code, one line repeated, a blank line, surrounding spaces, CRLF line ends.
	file := writeFile(t, "codes.txt", "NEW-0001\r\n  KNOWN-0001 \r\n\r\nNEW-0002\r\nNEW-0001\r\nnew-0001\r\n")
	stdout, stderr, code := cli(t, env, "codes", "import", "--pool", "yaz", file)
	if code != 0 {
		t.Fatalf("codes import: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	if want := "pool yaz: 5 codes read, 3 new, 2 already known\n  1 of them belong to pool other (a code is in one pool only; they stay there)\n"; stdout != want {
		t.Errorf("codes import printed %q, want %q", stdout, want)
	}
	if n := count(`SELECT count(*) FROM promo_codes WHERE pool = 'yaz' AND code IN ('NEW-0001', 'NEW-0002', 'new-0001')`); n != 3 {
		t.Errorf("pool yaz holds %d of the 3 new codes", n)
	}
	if n := count(`SELECT count(*) FROM promo_codes WHERE code = 'KNOWN-0001' AND pool = 'other'`); n != 1 {
		t.Errorf("the known code left its pool")
	}

	// Importing the same file again adds nothing.
	stdout, _, code = cli(t, env, "codes", "import", "--pool", "yaz", file)
	if want := "pool yaz: 5 codes read, 0 new, 5 already known\n  1 of them belong to pool other (a code is in one pool only; they stay there)\n"; code != 0 || stdout != want {
		t.Errorf("second import: exit %d, printed %q, want %q", code, stdout, want)
	}
	want := []map[string]any{{"pool": "yaz", "total": 3.0, "free": 3.0, "reserved": 0.0}}
	if diff := cmp.Diff(want, poolStatsJSON(t, env, "--pool", "yaz")); diff != "" {
		t.Errorf("codes stats --json --pool yaz (-want +got):\n%s", diff)
	}
}

func TestCodesImportRefusesBadInput(t *testing.T) {
	t.Parallel()
	env, count := badInputDB(t)
	bad := writeFile(t, "bad.txt", "GOOD-0001\nGOOD-0002\nnot a code\nGOOD-0003\n")
	good := writeFile(t, "good.txt", "GOOD-0001\n")
	tests := []struct {
		name string
		args []string
		says []string
	}{
		{"bad line", []string{"--pool", "yaz", bad}, []string{bad, "line 3", `"not a code"`, "A-Z, a-z, 0-9", "fix that line", "nothing was imported"}},
		{"unknown file", []string{"--pool", "yaz", "/nonexistent/codes.txt"}, []string{"cannot read the code file /nonexistent/codes.txt", "no such file"}},
		{"a directory", []string{"--pool", "yaz", t.TempDir()}, []string{"is a directory"}},
		{"no pool", []string{good}, []string{"--pool is required"}},
		{"bad pool name", []string{"--pool", "Yaz 2026", good}, []string{`--pool "yaz 2026"`, "a-z, 0-9"}},
		{"no file", []string{"--pool", "yaz"}, []string{"give the file of codes"}},
		{"two files", []string{"--pool", "yaz", good, good}, []string{"one file"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stdout, stderr, code := cli(t, env, append([]string{"codes", "import"}, tt.args...)...)
			if code != 2 {
				t.Fatalf("exit %d, want 2\nstdout: %s\nstderr: %s", code, stdout, stderr)
			}
			if stdout != "" {
				t.Errorf("a refused import printed a result: %q", stdout)
			}
			for _, s := range tt.says {
				if !strings.Contains(stderr, s) {
					t.Errorf("stderr does not say %q:\n%s", s, stderr)
				}
			}
		})
	}
	if n := count(`SELECT count(*) FROM promo_codes WHERE code LIKE 'GOOD-%'`); n != 0 {
		t.Errorf("refused imports added %d codes", n)
	}
	// The pool the bad file named was not created either: stats knows only the fixture's pool.
	want := []map[string]any{{"pool": "small", "total": 2.0, "free": 2.0, "reserved": 0.0}}
	if diff := cmp.Diff(want, poolStatsJSON(t, env)); diff != "" {
		t.Errorf("codes stats --json after refused imports (-want +got):\n%s", diff)
	}
}

func TestCodesStatsOfUnknownPool(t *testing.T) {
	t.Parallel()
	env, _ := badInputDB(t)
	for _, args := range [][]string{{"--pool", "nope"}, {"--pool", "nope", "--json"}} {
		stdout, stderr, code := cli(t, env, append([]string{"codes", "stats"}, args...)...)
		if code != 2 || stdout != "" {
			t.Fatalf("codes stats %v: exit %d, stdout %q; want exit 2 and nothing on stdout", args, code, stdout)
		}
		for _, s := range []string{`code pool "nope" does not exist`, "the pools are small", "codes generate --pool nope"} {
			if !strings.Contains(stderr, s) {
				t.Errorf("codes stats %v: stderr does not say %q:\n%s", args, s, stderr)
			}
		}
	}
	// A name no pool can have: no command that would fail is suggested (it said `codes generate --pool bad
	// pool`, unquoted).
	_, stderr, code := cli(t, env, "codes", "stats", "--pool", "BAD POOL")
	if code != 2 || !strings.Contains(stderr, "no pool can have that name") || strings.Contains(stderr, "codes generate") {
		t.Errorf("codes stats --pool 'BAD POOL': exit %d, %s; want 2, the name's rule and no command", code, stderr)
	}
}

func TestCodesHelpHasExamples(t *testing.T) {
	t.Parallel()
	for _, sub := range []string{"generate", "import", "stats"} {
		stdout, stderr, code := cli(t, nil, "codes", sub, "--help")
		if code != 0 || !strings.Contains(stdout, "Examples:") || !strings.Contains(stdout, "campaignctl codes "+sub) {
			t.Errorf("codes %s --help: exit %d, no example\nstdout: %s\nstderr: %s", sub, code, stdout, stderr)
		}
	}
	stdout, _, _ := cli(t, nil, "codes", "import", "--help")
	if !strings.Contains(stdout, "created if it does not exist") {
		t.Errorf("codes import --help does not say a new pool is created:\n%s", stdout)
	}
}
