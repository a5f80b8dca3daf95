package campaign

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrateLockID is the advisory lock key that serialises concurrent migrations (two workers starting at
// once, or tests migrating the same database).
const migrateLockID = 0x63616d70 // "camp"

// Migrate creates or upgrades the schema. It is idempotent and safe to run concurrently: each migration file
// is applied once, in name order, inside its own transaction, under an advisory lock. It returns the names of
// the files it applied.
func Migrate(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	defer conn.Release()

	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, migrateLockID); err != nil {
		return nil, fmt.Errorf("migrate: lock: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, migrateLockID) //nolint:errcheck

	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}

	names, err := fs.Glob(migrationFiles, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)

	var applied []string
	for _, path := range names {
		name := strings.TrimSuffix(strings.TrimPrefix(path, "migrations/"), ".sql")
		var done bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE name = $1)`, name).Scan(&done); err != nil {
			return applied, fmt.Errorf("migrate %s: %w", name, err)
		}
		if done {
			continue
		}
		sql, err := migrationFiles.ReadFile(path)
		if err != nil {
			return applied, err
		}
		tx, err := conn.Begin(ctx)
		if err != nil {
			return applied, fmt.Errorf("migrate %s: %w", name, err)
		}
		if _, err := tx.Exec(ctx, string(sql)); err != nil {
			tx.Rollback(ctx) //nolint:errcheck
			return applied, fmt.Errorf("migrate %s: %w", name, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (name) VALUES ($1)`, name); err != nil {
			tx.Rollback(ctx) //nolint:errcheck
			return applied, fmt.Errorf("migrate %s: %w", name, err)
		}
		if err := tx.Commit(ctx); err != nil {
			return applied, fmt.Errorf("migrate %s: %w", name, err)
		}
		applied = append(applied, name)
	}
	return applied, nil
}

// ErrCreateDatabase: the server refused to create the engine database (wrapping its reason).
var ErrCreateDatabase = errors.New("create database")

// CreateDatabase creates the database cfg names when the server says it does not exist, connecting to the
// server's postgres database as cfg's user. It reports whether it created it; a database created meanwhile
// by another process counts as there. Other connection errors are returned as they are.
func CreateDatabase(ctx context.Context, cfg *pgx.ConnConfig) (bool, error) {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err == nil {
		return false, conn.Close(ctx)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "3D000" { // invalid_catalog_name: no such database
		return false, err
	}
	admin := cfg.Copy()
	admin.Database = "postgres"
	aconn, err := pgx.ConnectConfig(ctx, admin)
	if err != nil {
		return false, err
	}
	defer aconn.Close(ctx)
	if _, err := aconn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{cfg.Database}.Sanitize()); err != nil {
		if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // duplicate_database: created meanwhile
			return false, nil
		}
		return false, fmt.Errorf("%w %q: %w", ErrCreateDatabase, cfg.Database, err)
	}
	return true, nil
}

// ErrSchema: the engine database lacks the schema this binary needs.
var ErrSchema = errors.New("the engine database's schema is missing or out of date")

// CheckSchema reports, wrapping ErrSchema, when the database behind pool lacks any of the migrations this
// binary carries: never migrated, or migrated by an older version. A database migrated further (a newer
// version rolled out first) is fine: migrations only add.
func CheckSchema(ctx context.Context, pool *pgxpool.Pool) error {
	names, err := migrationNames()
	if err != nil {
		return err
	}
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('schema_migrations') IS NOT NULL`).Scan(&exists); err != nil {
		return fmt.Errorf("schema check: %w", err)
	}
	if !exists {
		return fmt.Errorf("%w: this database has no campaignctl schema; run `campaignctl migrate` (with the same DATABASE_URL) first", ErrSchema)
	}
	var missing []string
	if err := pool.QueryRow(ctx, `SELECT coalesce(array_agg(n ORDER BY n), '{}') FROM unnest($1::text[]) n
		WHERE NOT EXISTS (SELECT 1 FROM schema_migrations m WHERE m.name = n)`, names).Scan(&missing); err != nil {
		return fmt.Errorf("schema check: %w", err)
	}
	if len(missing) > 0 {
		what := fmt.Sprintf("%d migrations of this version are not applied", len(missing))
		if len(missing) == 1 {
			what = "1 migration of this version is not applied"
		}
		return fmt.Errorf("%w: %s (%s); run `campaignctl migrate`", ErrSchema, what, strings.Join(missing, ", "))
	}
	return nil
}

func migrationNames() ([]string, error) {
	paths, err := fs.Glob(migrationFiles, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	names := make([]string, len(paths))
	for i, p := range paths {
		names[i] = strings.TrimSuffix(strings.TrimPrefix(p, "migrations/"), ".sql")
	}
	sort.Strings(names)
	return names, nil
}

// MigrationFS returns the embedded migration files (for tools that fingerprint the schema).
func MigrationFS() fs.FS { return migrationFiles }
