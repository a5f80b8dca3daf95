package main

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/campaignctl/campaignctl/iys"
	"github.com/campaignctl/campaignctl/providers"
)

func (a *app) newIYSPushCmd() *cobra.Command {
	var asJSON bool
	var wait, resultAfter time.Duration
	var batchFrom int
	cmd := &cobra.Command{
		Use:   "push",
		Short: "Register the refusals received through the messages in İYS, once, and exit",
		Long: `Send the İYS outbox once and exit: every RET that a refusal received through the brand's own messages
(a one-click unsubscribe, a SendGrid unsubscribe or spam report, an SMS "RET" to the sender) turned from
ONAY, for the brand of IYS_BRAND_CODE (and those recorded without a brand). Law 6563 wants such a refusal
in İYS within three business days: run this from cron (every 15 minutes, say).

A few RETs go one request each (İYS's idempotent V2 add); from --batch-from on they go in asynchronous
batches of up to 1000, whose results İYS gives no sooner than --result-after later: a later run (or
--wait) collects them. Each RET reaches İYS once however many times its refusal arrived. İYS holding RET
already (H174) is recorded as such; any other refusal by İYS (H175, H178, H467, …) is recorded with its code
and not tried again. 429 and 5xx answers are retried by later runs with back-off. A RET still not
registered two business days after its refusal is reported as overdue (here, in campaignctl iys outbox,
in campaignctl status, and in the worker metric campaignctl_iys_outbox_overdue).

Runs of one brand take turns (a Postgres advisory lock): a push started while another runs (a slow cron
run, an operator's) logs that it waits, waits for it, and then sends what is still due.`,
		Example: `  campaignctl iys push
  campaignctl iys push --wait 10m --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if wait < 0 || resultAfter < 0 || batchFrom < 0 {
				return usagef("--wait, --result-after and --batch-from take positive values")
			}
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
			rep, err := iys.Push(ctx, pool, client, iys.PushOptions{BatchFrom: batchFrom, ResultAfter: resultAfter, Wait: wait, PollEvery: min(10*time.Second, max(time.Second, resultAfter/10))})
			log := a.logger()
			if rep.Overdue > 0 {
				log.Error("refusals not registered in İYS two business days after they were received: the law allows three; see campaignctl iys outbox --state waiting,sent", "overdue", rep.Overdue)
			}
			if rep.OtherBrand > 0 {
				log.Warn("refusals wait for another brand: run campaignctl iys push with that brand's IYS_BRAND_CODE", "waiting", rep.OtherBrand)
			}
			if err != nil {
				return iysRunError(err, "answered before the error is recorded")
			}
			if wait > 0 && wait < resultAfter && rep.Awaiting > 0 {
				log.Warn("--wait is shorter than --result-after: the batches' results are asked for from --result-after on; a later run collects them", "wait", wait.String(), "result_after", resultAfter.String())
			}
			if asJSON {
				if err := json.NewEncoder(a.stdout).Encode(rep); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(a.stdout, "İYS took %d RETs: accepted %d, already RET there %d, refused %d; %d were not taken (İYS unreachable, busy or failing: retried by a later run), %d awaiting İYS's batch result, %d still waiting; %d overdue\n",
					rep.Sent, rep.Accepted, rep.Already, rep.Refused, rep.Retrying, rep.Awaiting, rep.Waiting, rep.Overdue)
			}
			if n := rep.RefusedCodes["H178"]; n > 0 {
				log.Info("İYS holds a later decision for some refusals (H178: the person gave consent there after refusing here); nothing to register for them, and the next campaignctl iys sync brings that decision here", "refusals", n)
			}
			// A RET İYS refused for another reason than those must be registered by hand; one that could
			// not reach İYS is a failure of this run, for cron to see.
			hand := byHand(rep.RefusedCodes)
			switch {
			case hand > 0:
				return fmt.Errorf("İYS refused %d RETs (%v): register them by hand in İYS; campaignctl iys outbox --state refused lists them with İYS's message", hand, rep.RefusedCodes)
			case rep.Retrying > 0:
				return fmt.Errorf("%d RETs could not reach İYS (429, 5xx or no answer): a later run retries them with back-off; see campaignctl iys outbox --state waiting", rep.Retrying)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().DurationVar(&wait, "wait", 0, "stay up to this long for the results of the batches sent (0: collect them at the next run)")
	cmd.Flags().DurationVar(&resultAfter, "result-after", 5*time.Minute, "how long after a batch its result is first asked for (İYS: at least 5m)")
	cmd.Flags().IntVar(&batchFrom, "batch-from", 50, "from this many waiting RETs on, send them in batches of up to 1000")
	return cmd
}

func (a *app) newIYSOutboxCmd() *cobra.Command {
	var asJSON, withAddress bool
	var states []string
	var limit int
	cmd := &cobra.Command{
		Use:   "outbox",
		Short: "Show the refusals waiting for İYS, sent, and done, with where each came from",
		Example: `  campaignctl iys outbox
  campaignctl iys outbox --state waiting,sent --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			for _, s := range states {
				switch s {
				case iys.OutboxWaiting, iys.OutboxSent, iys.OutboxAccepted, iys.OutboxAlready, iys.OutboxRefused:
				default:
					return usagef("--state %q: use waiting, sent, accepted, already or refused (comma-separated)", s)
				}
			}
			if limit < 0 {
				return usagef("--limit %d: give 0 (all) or more", limit)
			}
			pool, err := a.openEngine(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			now := time.Now()
			sum, err := iys.Outbox(ctx, pool, now)
			if err != nil {
				return err
			}
			items, err := iys.OutboxItems(ctx, pool, now, limit, states...)
			if err != nil {
				return err
			}
			if !withAddress {
				for i := range items {
					items[i].Recipient = providers.MaskAddress(items[i].Recipient)
					// The evidence may name the person too (a user ID that is their e-mail address, in a row
					// written before such IDs were masked there, or a provider's text).
					items[i].Evidence = providers.ScrubText(items[i].Evidence)
				}
			}
			if sum.Overdue > 0 {
				a.logger().Error("refusals not registered in İYS two business days after they were received: run campaignctl iys push (the law allows three business days)", "overdue", sum.Overdue)
			}
			if asJSON {
				if items == nil {
					items = []iys.OutboxItem{}
				}
				return json.NewEncoder(a.stdout).Encode(struct {
					iys.OutboxSummary
					Items []iys.OutboxItem `json:"items"`
				}{sum, items})
			}
			fmt.Fprintf(a.stdout, "waiting %d, sent %d (result awaited), accepted %d, already RET %d, refused %d; overdue %d\n",
				sum.States[iys.OutboxWaiting], sum.States[iys.OutboxSent], sum.States[iys.OutboxAccepted], sum.States[iys.OutboxAlready], sum.States[iys.OutboxRefused], sum.Overdue)
			if len(items) == 0 {
				return nil
			}
			tw := tabwriter.NewWriter(a.stdout, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSTATE\tRECIPIENT\tTYPE\tREFUSED AT\tVIA\tATTEMPTS\tRESULT")
			for _, it := range items {
				result := it.TransactionID
				if it.ErrorCode != "" || it.Error != "" {
					result = it.ErrorCode + " " + it.Error
				}
				if it.Overdue {
					result = "OVERDUE " + result
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", it.ID, it.State, it.Recipient, it.Type, it.RefusedAt.In(iys.Istanbul()).Format("2006-01-02 15:04 MST"), it.Via, it.Attempts, result)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVar(&withAddress, "with-address", false, "show the addresses in full (masked otherwise)")
	cmd.Flags().StringSliceVar(&states, "state", nil, "only these states: waiting, sent, accepted, already, refused")
	cmd.Flags().IntVar(&limit, "limit", 100, "at most this many rows, newest first (0: all)")
	return cmd
}

// byHand counts the RETs İYS refused that must be registered by hand, of refused (by İYS code): not those
// it never had the consent of (H175: nothing to withdraw there), nor those it holds a later decision for
// (H178: a consent given in İYS after the refusal; registering the older refusal by hand would undo it).
func byHand(refused map[string]int) int {
	n := 0
	for code, k := range refused {
		if code != "H175" && code != "H178" {
			n += k
		}
	}
	return n
}
