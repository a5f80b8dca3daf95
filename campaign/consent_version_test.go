package campaign_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/internal/testdb"
)

// Every way of writing the consents moves their version, even a statement that changes no row (the
// version only has to move at least as often as a consent changes), and reading them does not: the leases
// trust a campaign's planned consents only while the version is the one the launch read.
func TestEveryConsentWriteMovesTheVersion(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	version := func() int64 {
		t.Helper()
		var v int64
		if err := db.QueryRow(ctx, `SELECT version FROM iys_consents_version`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, w := range []struct {
		name  string
		write func() error
		moves bool
	}{
		{"insert", exec(db, `INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date)
			VALUES ('+905320000001', 'MESAJ', 'BIREYSEL', 'ONAY', 'HS_WEB', now()), ('+905320000002', 'MESAJ', 'BIREYSEL', 'ONAY', 'HS_WEB', now())`), true},
		{"select", exec(db, `SELECT count(*) FROM iys_consents`), false},
		{"update", exec(db, `UPDATE iys_consents SET status = 'RET' WHERE recipient = '+905320000001'`), true},
		{"update of no row", exec(db, `UPDATE iys_consents SET status = 'RET' WHERE recipient = 'nobody'`), true},
		{"upsert", exec(db, `INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date)
			VALUES ('+905320000002', 'MESAJ', 'BIREYSEL', 'RET', 'IYS_WEB', now())
			ON CONFLICT (recipient, type, recipient_type, brand_code) DO UPDATE SET status = excluded.status`), true},
		{"delete", exec(db, `DELETE FROM iys_consents WHERE recipient = '+905320000002'`), true},
		{"copy", func() error {
			conn, err := db.Acquire(ctx)
			if err != nil {
				return err
			}
			defer conn.Release()
			_, err = conn.Conn().PgConn().CopyFrom(ctx, strings.NewReader("+905320000003\tEPOSTA\tBIREYSEL\tONAY\tHS_WEB\t2026-01-01\n"),
				`COPY iys_consents (recipient, type, recipient_type, status, source, consent_date) FROM STDIN`)
			return err
		}, true},
		{"copy through pgx", func() error {
			_, err := db.CopyFrom(ctx, pgx.Identifier{"iys_consents"}, []string{"recipient", "type", "recipient_type", "status", "consent_date"},
				pgx.CopyFromRows([][]any{{"+905320000004", "MESAJ", "TACIR", "ONAY", time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}}))
			return err
		}, true},
		{"update in a replica session", func() error {
			// As a restore or a replication tool runs: ordinary triggers are off there.
			conn, err := db.Acquire(ctx)
			if err != nil {
				return err
			}
			defer conn.Release()
			_, err = conn.Exec(ctx, `SET session_replication_role = replica;
				UPDATE iys_consents SET status = 'RET' WHERE recipient = '+905320000003';
				RESET session_replication_role`)
			return err
		}, true},
		{"truncate", exec(db, `TRUNCATE iys_consents`), true},
	} {
		before := version()
		if err := w.write(); err != nil {
			t.Fatalf("%s: %v", w.name, err)
		}
		if moved := version() != before; moved != w.moves {
			t.Errorf("%s: version moved %v, want %v", w.name, moved, w.moves)
		}
	}
}

// exec is a write of the table above: one statement.
func exec(db *pgxpool.Pool, sql string) func() error {
	return func() error {
		_, err := db.Exec(context.Background(), sql)
		return err
	}
}
