package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// The reason Postgres could not be reached is always said: a connection lost during a restart (a bare
// error, wrapping nothing) printed "<nil>", and pgx's error of two attempts, the same reason each, said it
// twice.
func TestPostgresUnreachableSaysItsReasonOnce(t *testing.T) {
	t.Parallel()
	cc, err := pgx.ParseConfig("postgres://postgres@127.0.0.1:5482/campaignctl")
	if err != nil {
		t.Fatal(err)
	}
	attempt := "127.0.0.1:5482 (127.0.0.1): dial error: connection refused"
	for name, tc := range map[string]struct {
		err  error
		want string
	}{
		"a bare error":          {io.ErrUnexpectedEOF, "unexpected EOF"},
		"two attempts, one why": {fmt.Errorf("failed to connect: %w", errors.New(attempt+"\n"+attempt)), attempt},
	} {
		msg := dbError(tc.err, cc, "DATABASE_URL").Error()
		if strings.Contains(msg, "<nil>") || strings.Count(msg, tc.want) != 1 {
			t.Errorf("%s: %q; want %q once, and no <nil>", name, msg, tc.want)
		}
	}
}
