package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/campaignctl/campaignctl/iys"
)

func (a *app) newIYSCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "iys", Short: "İYS consents: import", Example: "  campaignctl iys import consents.csv"}
	cmd.AddCommand(a.newIYSImportCmd())
	return cmd
}

func (a *app) newIYSImportCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "import FILE.csv",
		Short: "Load consents from a CSV (recipient,type,recipient_type,status,source,consent_date); all or nothing",
		Example: `  campaignctl iys import consents.csv
  # header: recipient,type,recipient_type,status,source,consent_date
  # row:    +905321234567,MESAJ,BIREYSEL,ONAY,HS_WEB,2026-01-15 10:30:00`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := os.Open(args[0])
			if err != nil {
				return usagef("cannot read the consent file: %v", err)
			}
			defer f.Close()
			pool, err := a.openEngine(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			bar := a.taskBar(-1, "importing consents")
			rep, err := iys.Import(cmd.Context(), pool, f, iys.ImportOptions{Progress: func(rows int64) { bar.Set64(rows) }}) //nolint:errcheck
			bar.Finish()                                                                                                      //nolint:errcheck
			if err != nil {
				return fmt.Errorf("%s: %w (nothing was imported)", args[0], err)
			}
			fmt.Fprintf(a.stdout, "imported %d consent rows: %d new, %d updated, %d unchanged\n", rep.Rows, rep.Inserted, rep.Updated, rep.Unchanged)
			return nil
		},
	}
}
