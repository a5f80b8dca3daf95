package campaign

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// RefusedForGood says whether Postgres refused a write for what it holds (a data exception or an integrity
// violation, SQLSTATE classes 22 and 23): every attempt would fail alike, so it is not worth waiting out,
// holding for later or trying again.
func RefusedForGood(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (strings.HasPrefix(pe.Code, "22") || strings.HasPrefix(pe.Code, "23"))
}
