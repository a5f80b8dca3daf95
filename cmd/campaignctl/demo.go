package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/campaignctl/campaignctl/internal/demo"
)

func (a *app) newDemoCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "demo", Short: "Demo data", Example: "  campaignctl demo seed --users 10000"}
	var users int
	var pool string
	seed := &cobra.Command{
		Use:   "seed --users N",
		Short: "Create a synthetic audience table customers, İYS consents and a code pool",
		Example: `  campaignctl demo seed --users 10000
  campaignctl demo seed --users 1000000 --pool big`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if users < 1 {
				return usagef("--users %d: give the number of customers to create (at least 1)", users)
			}
			db, err := a.openEngine(cmd.Context())
			if err != nil {
				return err
			}
			defer db.Close()
			bar := a.taskBar(-1, "seeding customers, consents and codes")
			rep, err := demo.Seed(cmd.Context(), db, demo.SeedOptions{Users: users, Pool: pool,
				Progress: func(done, total int) { bar.ChangeMax(total); bar.Set(done) }}) //nolint:errcheck
			bar.Finish() //nolint:errcheck
			if err != nil {
				if errors.Is(err, demo.ErrInvalidOptions) {
					return usageError{err}
				}
				return err
			}
			fmt.Fprintf(a.stdout, "customers: %d in table customers (%d with an invalid phone, %d sharing a phone)\n",
				rep.Customers, rep.InvalidPhones, rep.SharedPhones)
			fmt.Fprintf(a.stdout, "İYS consents: SMS %d ONAY / %d RET, e-mail %d ONAY / %d RET\n",
				rep.SMSApproved, rep.SMSRejected, rep.EmailApproved, rep.EmailRejected)
			fmt.Fprintf(a.stdout, "code pool %s: %d new codes, %d free\n", rep.Pool, rep.CodesGenerated, rep.CodesFree)
			return nil
		},
	}
	seed.Flags().IntVar(&users, "users", 10000, "number of customers")
	poolVar(seed.Flags(), &pool, "pool", "demo", "code pool to fill")
	cmd.AddCommand(seed)
	return cmd
}
