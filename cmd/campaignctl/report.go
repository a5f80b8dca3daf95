package main

import (
	"bufio"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/providers"
)

type reportOptions struct {
	id          int64
	csv, json   bool
	status      string
	statuses    []string
	withAddress bool
}

func (o *reportOptions) validate() error {
	if o.csv && o.json {
		return usagef("--csv and --json exclude each other: choose one (CSV is the default)")
	}
	st, err := campaign.ParseReportStatuses(o.status)
	if err != nil {
		return usageError{fmt.Errorf("--status: %w", err)}
	}
	o.statuses = st
	return nil
}

// reportColumns is the CSV header, and the JSON keys, in order (a contract: change only by adding).
var reportColumns = []string{"user_id", "address", "status", "reason", "code", "provider", "provider_message_id",
	"attempts", "sent_at", "delivery", "delivered_at", "delivery_error"}

func (a *app) newReportCmd() *cobra.Command {
	var o reportOptions
	cmd := &cobra.Command{
		Use:   "report ID",
		Short: "List every audience row of a campaign, excluded ones too, with its status and reason",
		Long: `List one row per audience row of the campaign: every planned recipient with its status (sent, failed,
skipped, unknown or pending) and every row the launch excluded (status excluded), each with its reason,
promo code, provider, the provider's message ID, attempts, when its request went out (sent_at) and when
it was delivered, and the last receipt's word (delivery) with why it says the message was not delivered
(delivery_error).

Output is CSV with a header line (--csv, the default) or, with --json, one JSON array of objects
with the same snake_case keys. Rows come in no particular order and are written as they are read, so a
campaign of millions reports in constant memory. Addresses are masked unless --with-address.
In the CSV, a value that a spreadsheet would run as a formula (one that starts with =, @, a tab or a
carriage return, or with + or - and is more than a number, such as a provider's error text or a code
from an imported pool) starts with a ' so that it is shown as text; phone numbers such as +905321234567
(masked or not) and plain numbers are printed as they are. The JSON prints every value as it is.

The provider is the fallback when the send failed over to it, and otherwise the channel's provider as
this environment configures it (for rows that reached a provider). Times are UTC, RFC 3339.
Campaigns launched before this version list their excluded rows only as counts (campaignctl status).`,
		Example: `  campaignctl report 42 > campaign-42.csv
  campaignctl report 42 --status failed,unknown
  campaignctl report 42 --status excluded --json
  campaignctl report 42 --with-address --csv`,
		Args: exactlyOne("a campaign ID", campaignIDHint("report")),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if o.id, err = parseID(args[0]); err != nil {
				return err
			}
			if err := o.validate(); err != nil {
				return err
			}
			return a.report(cmd.Context(), o)
		},
	}
	cmd.Flags().BoolVar(&o.csv, "csv", false, "print CSV with a header line (the default)")
	cmd.Flags().BoolVar(&o.json, "json", false, "print one JSON array of objects")
	cmd.Flags().StringVar(&o.status, "status", "", "only rows with these statuses, comma-separated: sent, failed, skipped, unknown, pending, excluded")
	cmd.Flags().BoolVar(&o.withAddress, "with-address", false, "print addresses, and user IDs that are phone numbers or e-mail addresses, in full instead of masked")
	return cmd
}

func (a *app) report(ctx context.Context, o reportOptions) error {
	pool, err := a.openEngine(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	store := campaign.NewStore(pool)
	c, err := store.Get(ctx, o.id)
	if err != nil {
		return err
	}
	provider := a.channelProvider(c.Channel)

	w := bufio.NewWriterSize(a.stdout, 64<<10)
	fix := func(r *campaign.ReportRow) {
		if !o.withAddress {
			if r.Address != "" {
				r.Address = providers.MaskAddress(r.Address)
			}
			// An audience keyed by phone number or e-mail address: its user IDs are addresses too.
			r.UserID = providers.MaskUserID(r.UserID)
		}
		// A message whose template failed for its row never reached a provider.
		if r.Provider == "" && !strings.HasPrefix(r.Reason, campaign.TemplateFailure) {
			switch r.Status {
			case campaign.StatusSent, campaign.StatusFailed, campaign.StatusUnknown:
				r.Provider = provider
			}
		}
	}
	if o.json {
		enc := json.NewEncoder(w)
		first := true
		if _, err := w.WriteString("["); err != nil {
			return err
		}
		err := store.Report(ctx, o.id, o.statuses, func(r campaign.ReportRow) error {
			fix(&r)
			sep := ",\n"
			if first {
				sep, first = "\n", false
			}
			if _, err := w.WriteString(sep); err != nil {
				return err
			}
			// Encode ends each object with a newline; the separator that follows starts the next line.
			return enc.Encode(jsonReportRow(r))
		})
		if err != nil {
			return err
		}
		if _, err := w.WriteString("]\n"); err != nil {
			return err
		}
		return w.Flush()
	}
	cw := csv.NewWriter(w)
	if err := cw.Write(reportColumns); err != nil {
		return err
	}
	rec := make([]string, len(reportColumns))
	err = store.Report(ctx, o.id, o.statuses, func(r campaign.ReportRow) error {
		fix(&r)
		rec[0], rec[1], rec[2], rec[3], rec[4], rec[5], rec[6] = r.UserID, r.Address, r.Status, r.Reason, r.Code, r.Provider, r.ProviderMessageID
		rec[7], rec[8], rec[9], rec[10], rec[11] = strconv.Itoa(r.Attempts), csvTime(r.SentAt), r.Delivery, csvTime(r.DeliveredAt), r.DeliveryError
		for i := range rec {
			rec[i] = spreadsheetText(rec[i])
		}
		return cw.Write(rec)
	})
	if err != nil {
		return err
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return err
	}
	return w.Flush()
}

// jsonReportRow gives a row's times in UTC, like the CSV.
func jsonReportRow(r campaign.ReportRow) campaign.ReportRow {
	for _, t := range []**time.Time{&r.SentAt, &r.DeliveredAt} {
		if *t != nil {
			u := (*t).UTC()
			*t = &u
		}
	}
	return r
}

// spreadsheetText keeps a CSV value from being run as a formula when the report is opened in a spreadsheet:
// the audience's columns, the provider's error texts and imported codes are not the engine's own, and a
// value such as =HYPERLINK(…), +cmd|… or -2+3 would be a formula there. Such a value gets a leading ' (the
// spreadsheets' mark for text). Left as they are: a phone number in E.164, masked or not (+905321234567,
// +905*****4567), and a plain number (-1, -0.5), which a spreadsheet reads as the same number.
func spreadsheetText(s string) string {
	if s == "" {
		return s
	}
	switch s[0] {
	case '=', '@', '\t', '\r':
		return "'" + s
	case '+', '-':
		if !e164OrNumber.MatchString(s) {
			return "'" + s
		}
	}
	return s
}

// e164OrNumber matches the values starting with + or - that spreadsheetText leaves as they are.
var e164OrNumber = regexp.MustCompile(`^(\+[0-9*]+|-[0-9]+(\.[0-9]+)?)$`)

func csvTime(t *time.Time) string {
	if t == nil {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

// channelProvider names the provider that sends ch as this environment configures it: the first
// configured one in providerSpecs' order (see worker's primary), "" when none is.
func (a *app) channelProvider(ch campaign.Channel) string {
	for _, ps := range providerSpecs() {
		if ps.channel == ch && a.anySet(ps.settings...) {
			return ps.name
		}
	}
	return ""
}
