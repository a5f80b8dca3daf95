package main

import (
	"strings"
	"testing"
)

// Bad input to `codes generate` is the user's to fix (exit 2, a message naming the flag), whatever the
// state of Postgres: a refusal must come before any connection (a missed one fails with exit 1 and a
// message about Postgres, and the operator who starts Postgres only then hears the input was wrong).
// --length, --prefix and a --count above the limit are checked before the connection too.
func TestCodesGenerateRefusesBadFlagsBeforeConnecting(t *testing.T) {
	t.Parallel()
	noPG := map[string]string{"DATABASE_URL": "postgres://postgres@127.0.0.1:1/campaignctl?sslmode=disable", "REDIS_URL": "redis://127.0.0.1:1/0"}
	for _, tt := range []struct {
		name string
		args []string
		says string
	}{
		{"length too short", []string{"--length", "3"}, "length"},
		{"length too long", []string{"--length", "40"}, "length"},
		{"negative length", []string{"--length", "-1"}, "length"},
		{"lower-case prefix", []string{"--prefix", "yaz-"}, "prefix"},
		{"prefix too long", []string{"--prefix", "ABCDEFGHIJKLMNOPQ"}, "prefix"},
		{"count above the limit", []string{"--count", "60000000"}, "count"},
		// 0 is not the default given by another name: it is refused as any length out of range is.
		{"length 0", []string{"--length", "0"}, "--length 0: the random part is 6 to 32 characters (default 8)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"codes", "generate", "--pool", "yaz", "--count", "5"}, tt.args...)
			stdout, stderr, code := cli(t, noPG, args...)
			if code != 2 || !strings.Contains(stderr, tt.says) || strings.Contains(stderr, "not reachable") {
				t.Errorf("codes generate %s with Postgres down: exit %d, want 2 naming %q\nstdout: %s\nstderr: %s",
					strings.Join(tt.args, " "), code, tt.says, stdout, stderr)
			}
		})
	}
	// --count left out is named as missing, not as 0.
	if _, stderr, code := cli(t, noPG, "codes", "generate", "--pool", "yaz"); code != 2 || !strings.Contains(stderr, "--count is missing") {
		t.Errorf("codes generate without --count: exit %d, want 2 saying --count is missing\n%s", code, stderr)
	}
}
