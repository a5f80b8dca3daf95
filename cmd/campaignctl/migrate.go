package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/campaignctl/campaignctl/campaign"
)

func (a *app) newMigrateCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "migrate",
		Short: "Create or upgrade the schema (idempotent); creates the database if it is missing",
		Example: `  campaignctl migrate
  DATABASE_URL=postgres://app@db:5432/campaignctl campaignctl migrate`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if err := a.ensureDatabase(ctx); err != nil {
				return err
			}
			pool, err := a.openDB(ctx, a.dbURL(), a.dbName(), 0)
			if err != nil {
				return err
			}
			defer pool.Close()
			applied, err := campaign.Migrate(ctx, pool)
			if err != nil {
				return err
			}
			if len(applied) == 0 {
				fmt.Fprintln(a.stdout, "schema is up to date")
				return nil
			}
			for _, m := range applied {
				fmt.Fprintln(a.stdout, "applied", m)
			}
			return nil
		},
	}
}

// ensureDatabase creates the engine database when the server is up but the database is not there yet, so
// that `migrate` is the only set-up step on a new server.
func (a *app) ensureDatabase(ctx context.Context) error {
	cfg, err := pgx.ParseConfig(a.dbURL())
	if err != nil {
		return usagef("%s is not a valid Postgres URL (%s); use postgres://user[:password]@host:port/database", a.dbName(), redact(a.dbURL()))
	}
	created, err := campaign.CreateDatabase(ctx, cfg)
	if errors.Is(err, campaign.ErrCreateDatabase) {
		return err
	}
	if err != nil {
		return dbError(err, cfg, a.dbName())
	}
	if created {
		fmt.Fprintf(a.stdout, "created database %s\n", cfg.Database)
	}
	return nil
}
