package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/campaignctl/campaignctl/codes"
)

func (a *app) newCodesCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "codes", Short: "Promo code pools"}
	cmd.AddCommand(a.newCodesGenerateCmd())
	return cmd
}

type codesGenerateOptions struct {
	pool   string
	count  int
	prefix string
	length int
}

func (o *codesGenerateOptions) validate() error {
	if o.pool == "" {
		return usagef("--pool is required: the name of the pool to add codes to")
	}
	if o.count < 1 {
		return usagef("--count %d: give the number of new codes to make (at least 1)", o.count)
	}
	return nil
}

func (a *app) newCodesGenerateCmd() *cobra.Command {
	var o codesGenerateOptions
	cmd := &cobra.Command{
		Use:     "generate --pool P --count N",
		Short:   "Make N new unique codes (crypto-random, no look-alike characters); creates the pool if new",
		Example: `  campaignctl codes generate --pool yaz2026 --count 1000000 --prefix YAZ-`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			pool, err := a.openEngine(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			bar := a.taskBar(int64(o.count), "generating codes")
			rep, err := codes.Generate(cmd.Context(), pool, codes.GenerateOptions{
				Pool: o.pool, Count: o.count, Prefix: o.prefix, Length: o.length,
				Progress: func(done int) { bar.Set(done) }, //nolint:errcheck
			})
			bar.Finish() //nolint:errcheck
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "pool %s: %d new codes\n", o.pool, rep.Generated)
			return nil
		},
	}
	cmd.Flags().StringVar(&o.pool, "pool", "", "pool name")
	cmd.Flags().IntVar(&o.count, "count", 0, "how many new codes")
	cmd.Flags().StringVar(&o.prefix, "prefix", "", "optional prefix, e.g. YAZ-")
	cmd.Flags().IntVar(&o.length, "length", 8, "length of the random part")
	return cmd
}
