package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/campaignctl/campaignctl/iys"
	"github.com/campaignctl/campaignctl/providers"
)

func (a *app) newIYSCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "iys", Short: "İYS consents: import, sync with the İYS API, check one recipient, register refusals",
		Example: "  campaignctl iys import consents.csv\n  campaignctl iys sync\n  campaignctl iys check +905321234567\n  campaignctl iys push\n  campaignctl iys outbox"}
	cmd.AddCommand(a.newIYSImportCmd(), a.newIYSSyncCmd(), a.newIYSCheckCmd(), a.newIYSPushCmd(), a.newIYSOutboxCmd())
	return cmd
}

// brandCode returns IYS_BRAND_CODE: "" when unset, or digits (İYS's brand codes are numbers); anything
// else is bad input (exit 2), refused before anything is read or written under it.
func (a *app) brandCode() (string, error) {
	b := a.getenv("IYS_BRAND_CODE")
	if b != "" && strings.Trim(b, "0123456789") != "" {
		return "", usagef("IYS_BRAND_CODE=%q: an İYS brand code is digits only; set your brand's code (İYS gives it with the API user), or unset it for consents recorded without a brand", b)
	}
	return b, nil
}

// iysClient builds the İYS API client from IYS_BASE_URL, IYS_USERNAME, IYS_PASSWORD, IYS_CODE and
// IYS_BRAND_CODE; a missing one is named in the error.
func (a *app) iysClient() (*iys.Client, error) {
	var missing []string
	for _, k := range []string{"IYS_BASE_URL", "IYS_USERNAME", "IYS_PASSWORD", "IYS_CODE", "IYS_BRAND_CODE"} {
		if a.getenv(k) == "" {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		return nil, usagef("the İYS API is not configured: set %s (your İYS API user and your İYS and brand codes)", strings.Join(missing, ", "))
	}
	c, err := iys.NewClient(iys.Config{BaseURL: a.getenv("IYS_BASE_URL"), Username: a.getenv("IYS_USERNAME"),
		Password: a.getenv("IYS_PASSWORD"), IYSCode: a.getenv("IYS_CODE"), BrandCode: a.getenv("IYS_BRAND_CODE"), Logger: a.logger()})
	if err != nil {
		return nil, usageError{err}
	}
	return c, nil
}

func (a *app) newIYSSyncCmd() *cobra.Command {
	var reverify, asJSON bool
	cmd := &cobra.Command{
		Use:   "sync",
		Short: "Pull consent changes from the İYS API (the brand's and the citizens'), from where the last sync stopped",
		Long: `Pull the consent changes İYS recorded since the last sync, for both sources: the brand's own (HS) and
the citizens' (IYS: the 3338 short number, web, app, e-Devlet). Each page is stored with its cursor in one
transaction, so an interrupted sync resumes where it stopped. Every change is kept in the consent history
with its İYS transaction ID. A RET pulled here blocks the next send to that person, also in campaigns
already running.

Launches refuse consents older than --max-consent-age (24 h): run this at least that often (e.g. from cron
every 15 minutes). İYS leaves the changes of its last hour out of the pull, so a sync brings the consents
up to date with İYS as it was an hour before the sync began, and that is the time launches judge. --reverify also asks İYS for the status of every stored SMS and e-mail consent
(multi-status), the full pass that catches anything the pull missed. Syncs of one brand take turns: one
started while another runs waits for it, then pulls from where it stopped.`,
		Example: `  campaignctl iys sync
  campaignctl iys sync --reverify --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			client, err := a.iysClient()
			if err != nil {
				return err
			}
			pool, err := a.openEngine(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			client.KeepTokensIn(pool)
			rep, err := iys.Sync(ctx, pool, client)
			if err != nil {
				return iysRunError(err, "pulled before the error is stored")
			}
			if reverify {
				for _, k := range [][2]string{{iys.TypeMessage, iys.RecipientIndividual}, {iys.TypeMessage, iys.RecipientMerchant},
					{iys.TypeEmail, iys.RecipientIndividual}, {iys.TypeEmail, iys.RecipientMerchant}} {
					rv, err := iys.Reverify(ctx, pool, client, k[0], k[1])
					if err != nil {
						return err
					}
					rep.Reverified += rv.Reverified
					rep.Corrected += rv.Corrected
				}
				if brand := client.BrandCode(); rep.Reverified == 0 && brand != "" {
					// Nothing of the brand to ask about: consents imported without a brand are not its.
					if unbranded, err := iys.Unbranded(ctx, pool); err == nil && unbranded > 0 {
						fmt.Fprintf(a.stderr, "warning: no consent of brand %s is stored to re-verify; %d consents were imported without a brand: import them again with IYS_BRAND_CODE set\n", brand, unbranded)
					}
				}
			}
			if asJSON {
				return json.NewEncoder(a.stdout).Encode(rep)
			}
			fmt.Fprintf(a.stdout, "pulled %d changes (brand %d, citizens %d); %d consents changed", rep.Changes[iys.PullHS]+rep.Changes[iys.PullIYS],
				rep.Changes[iys.PullHS], rep.Changes[iys.PullIYS], rep.Applied)
			if reverify {
				fmt.Fprintf(a.stdout, "; re-verified %d, %d corrected", rep.Reverified, rep.Corrected)
			}
			fmt.Fprintf(a.stdout, "; consents up to date with İYS as of %s", rep.UpToDateAt.UTC().Format(time.RFC3339))
			if !reverify {
				fmt.Fprintf(a.stdout, " (the pull leaves out İYS's last hour; --reverify asks İYS about every consent now)")
			}
			fmt.Fprintln(a.stdout)
			return nil
		},
	}
	cmd.Flags().BoolVar(&reverify, "reverify", false, "also ask İYS for the status of every stored consent (multi-status)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func (a *app) newIYSCheckCmd() *cobra.Command {
	var typ, recipientType string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "check ADDRESS",
		Short: "Show one recipient's consent: what this engine holds, its history, and (when configured) what İYS says now",
		Example: `  campaignctl iys check +905321234567
  campaignctl iys check ayse@example.com --type EPOSTA --json`,
		Args: exactlyOne("an address", "a phone number or an e-mail, e.g. `campaignctl iys check +905321234567`"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if typ == "" {
				typ = iys.TypeMessage
				if strings.Contains(args[0], "@") {
					typ = iys.TypeEmail
				}
			}
			canon, err := iys.CanonicalRecipient(typ, args[0])
			if err != nil {
				return usagef("%v: give a phone number as +905321234567 or an e-mail address as ayse@example.com", err)
			}
			if recipientType != iys.RecipientIndividual && recipientType != iys.RecipientMerchant {
				return usagef("--recipient-type %q: use BIREYSEL or TACIR", recipientType)
			}
			brand, err := a.brandCode()
			if err != nil {
				return err
			}
			pool, err := a.openEngine(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			view := iysCheckView{Recipient: canon, Type: typ, RecipientType: recipientType}
			var refused error // İYS refused the credentials: said after the view (exit 2)
			c, err := iys.LookupBrand(ctx, pool, brand, canon, typ, recipientType)
			if errors.Is(err, iys.ErrNoConsent) && brand != "" {
				// Consents imported without a brand are this brand's too until a sync records it.
				if c, err = iys.LookupBrand(ctx, pool, "", canon, typ, recipientType); err == nil {
					brand = ""
				}
			}
			switch {
			case err == nil:
				view.Local = &c
			case !errors.Is(err, iys.ErrNoConsent):
				return err
			}
			if view.History, err = iys.History(ctx, pool, brand, canon, typ, recipientType, 10); err != nil {
				return err
			}
			// The other brands' consents of the address: a campaign of another brand reads those.
			if view.OtherBrands, err = otherBrands(ctx, pool, brand, canon, typ, recipientType); err != nil {
				return err
			}
			if a.getenv("IYS_BASE_URL") != "" {
				client, err := a.iysClient()
				if err != nil {
					// What is stored here is still shown; İYS is not asked.
					view.IYSError = "not asked: " + err.Error()
				} else {
					client.KeepTokensIn(pool)
					live, err := client.Status(ctx, recipientType, typ, canon)
					switch {
					case err == nil:
						view.IYS = &live
					case errors.Is(err, iys.ErrNoConsent):
						view.IYSError = "İYS holds no consent for this recipient"
					default:
						view.IYSError = err.Error()
						if iys.IsAuth(err) {
							// What is stored here is shown all the same; the settings are the user's to fix.
							refused = usagef("İYS refuses the credentials: check IYS_USERNAME and IYS_PASSWORD (and IYS_BASE_URL); what this engine holds is shown above")
						}
					}
				}
			}
			if asJSON {
				if err := json.NewEncoder(a.stdout).Encode(view); err != nil {
					return err
				}
				return refused
			}
			fmt.Fprintf(a.stdout, "%s %s %s\n", providers.MaskAddress(canon), typ, recipientType)
			if view.Local != nil {
				fmt.Fprintf(a.stdout, "  here:  %s (source %s, given %s)\n", c.Status, c.Source, c.ConsentDate.Format("2006-01-02 15:04"))
			} else {
				fmt.Fprintln(a.stdout, "  here:  no consent (nothing may be sent)")
			}
			for _, o := range view.OtherBrands {
				fmt.Fprintf(a.stdout, "  brand %s: %s (source %s, given %s)\n", o.Brand, o.Status, o.Source, o.ConsentDate.Format("2006-01-02 15:04"))
			}
			if view.IYS != nil {
				fmt.Fprintf(a.stdout, "  İYS:   %s (source %s)\n", view.IYS.Status, view.IYS.Source)
			} else if view.IYSError != "" {
				fmt.Fprintf(a.stdout, "  İYS:   %s\n", view.IYSError)
			}
			for _, h := range view.History {
				txn := ""
				if h.TransactionID != "" {
					txn = " (" + h.TransactionID + ")"
				}
				fmt.Fprintf(a.stdout, "  %s  %s %s via %s%s\n", h.RecordedAt.Format(time.RFC3339), h.Status, h.Source, h.Origin, txn)
			}
			return refused
		},
	}
	cmd.Flags().StringVar(&typ, "type", "", "MESAJ or EPOSTA (default: from the address)")
	cmd.Flags().StringVar(&recipientType, "recipient-type", iys.RecipientIndividual, "BIREYSEL or TACIR")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// iysCheckView is the --json shape of iys check.
type iysCheckView struct {
	Recipient     string          `json:"recipient"`
	Type          string          `json:"type"`
	RecipientType string          `json:"recipient_type"`
	Local         *iys.Consent    `json:"local"`
	IYS           *iys.Record     `json:"iys,omitempty"`
	IYSError      string          `json:"iys_error,omitempty"`
	History       []iys.HistEntry `json:"history"`
	// OtherBrands are the address's consents stored under other brands (or none): campaigns of those
	// brands read them.
	OtherBrands []brandConsent `json:"other_brands,omitempty"`
}

// brandConsent is a consent stored under a brand, for iys check.
type brandConsent struct {
	Brand       string    `json:"brand"`
	Status      string    `json:"status"`
	Source      string    `json:"source"`
	ConsentDate time.Time `json:"consent_date"`
}

// otherBrands returns the consents of recipient (type, recipient type) stored under brands other than
// brand, "" (no brand) included.
func otherBrands(ctx context.Context, pool *pgxpool.Pool, brand, recipient, typ, recipientType string) ([]brandConsent, error) {
	rows, err := pool.Query(ctx, `SELECT brand_code, status, source, consent_date FROM iys_consents
		WHERE recipient = $1 AND type = $2 AND recipient_type = $3 AND brand_code <> $4 ORDER BY brand_code`, recipient, typ, recipientType, brand)
	if err != nil {
		return nil, fmt.Errorf("other brands' consents: %w", err)
	}
	defer rows.Close()
	var out []brandConsent
	for rows.Next() {
		var c brandConsent
		if err := rows.Scan(&c.Brand, &c.Status, &c.Source, &c.ConsentDate); err != nil {
			return nil, fmt.Errorf("other brands' consents: %w", err)
		}
		if c.Brand == "" {
			c.Brand = "(none)"
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

func (a *app) newIYSImportCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "import FILE.csv",
		Short: "Load consents from a CSV (recipient,type,recipient_type,status,source,consent_date); all or nothing",
		Long: `Load consents from a CSV (recipient,type,recipient_type,status,source,consent_date), all or nothing,
under IYS_BRAND_CODE. For each number the latest consent_date wins; of two decisions of the same second
(in the file, or one stored and one in the file), the RET wins. A complete export of İYS's consents brings them up to date for launches' --max-consent-age,
as a sync does; a partial file (one that leaves out consents stored from İYS's data before: new
sign-ups, a CRM's extract) is imported but does not, and the import says so. A refusal made here that the
file shows İYS does not hold (an older ONAY) is queued for İYS (iys push).`,
		Example: `  campaignctl iys import consents.csv
  # header: recipient,type,recipient_type,status,source,consent_date
  # row:    +905321234567,MESAJ,BIREYSEL,ONAY,HS_WEB,2026-01-15 10:30:00`,
		Args: exactlyOne("a consent CSV file", "e.g. `campaignctl iys import consents.csv` (header: recipient,type,recipient_type,status,source,consent_date)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := os.Open(args[0])
			if err != nil {
				return usagef("cannot read the consent file: %v", err)
			}
			defer f.Close()
			if fi, err := f.Stat(); err == nil && fi.IsDir() {
				return usagef("%s is a directory; give the consent CSV file in it (nothing was imported)", args[0])
			}
			brand, err := a.brandCode()
			if err != nil {
				return err
			}
			pool, err := a.openEngine(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			bar := a.taskBar(-1, "importing consents")
			rep, err := iys.Import(cmd.Context(), pool, f, iys.ImportOptions{BrandCode: brand, Progress: func(rows int64) { bar.Set64(rows) }}) //nolint:errcheck
			bar.Finish()                                                                                                                        //nolint:errcheck
			if err != nil {
				return fmt.Errorf("%s: %w (nothing was imported)", args[0], err)
			}
			fmt.Fprintf(a.stdout, "imported %d consent rows: %d new, %d updated, %d unchanged", rep.Rows, rep.Inserted, rep.Updated, rep.Unchanged)
			if rep.Superseded > 0 {
				// The rest of the rows: the same number, type and recipient type again in the file.
				fmt.Fprintf(a.stdout, ", %d superseded by another row for the same number in the file (a later date, or a RET of the same second)", rep.Superseded)
			}
			if rep.Requeued > 0 {
				fmt.Fprintf(a.stdout, "; %d refusals made here that İYS does not hold queued for it (iys push)", rep.Requeued)
			}
			fmt.Fprintln(a.stdout)
			if rep.Missing > 0 {
				fmt.Fprintf(a.stderr, "note: %d consents stored for %s from İYS's data are not in this file: it is taken as a partial file, which says nothing of the consents it leaves out, so it does not make the consents count as up to date for launches' --max-consent-age; a complete İYS export or `campaignctl iys sync` does\n",
					rep.Missing, importBrand(brand))
			}
			return nil
		},
	}
}

// importBrand names the brand an import stores its consents under, for a message.
func importBrand(brand string) string {
	if brand == "" {
		return "no brand (IYS_BRAND_CODE is not set)"
	}
	return "brand " + brand
}

// iysRunError is the error of an İYS command that stopped on err, having kept what it did (done): run it
// again to go on, unless İYS refused the credentials, which running it again cannot mend. Those are the
// user's settings to fix (exit 2), as a Postgres or Redis that refuses the URL's user is.
func iysRunError(err error, done string) error {
	if iys.IsAuth(err) {
		return usagef("%w: İYS refuses the credentials; check IYS_USERNAME and IYS_PASSWORD (and IYS_BASE_URL) and run it again (what was %s)", err, done)
	}
	return fmt.Errorf("%w (what was %s; run it again to go on)", err, done)
}
