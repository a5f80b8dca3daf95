package main

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/campaignctl/campaignctl/worker"
)

type resumeOptions struct {
	id            int64
	resendUnknown bool
}

func (a *app) newResumeCmd() *cobra.Command {
	var o resumeOptions
	cmd := &cobra.Command{
		Use:   "resume ID",
		Short: "Continue a campaign after a pause or any incident: re-queue, rebuild counters, report (safe to repeat while it runs or is paused)",
		Long: `Continue a campaign after a pause or after any incident: a killed worker or launch, Redis restarted
empty (queues, claims and counters gone), Postgres restarted.

resume reads Postgres, the source of truth, and
  - continues a paused campaign,
  - queues every batch that still has pending recipients and is not queued (task IDs are deterministic:
    a batch already queued, retrying or running keeps its task, so resume is safe to run twice or while
    workers run),
  - takes the campaign's batches out of the dead-letter queue and queues them with a fresh retry budget,
  - rebuilds the progress counters,
and prints what it found and did.

Recipients whose outcome is unknown (the provider's answer was lost, or a worker died after claiming
them) are not sent again unless you say so with --resend-unknown: then each is sent once more with the
same promo code, unless its claim or a receipt shows the provider had accepted it. A recipient left
unknown through Twilio or SendGrid, whose receipts can come minutes late, is held back for 10 minutes
from when it was recorded unknown, so that its receipt can still show its first message went. Netgsm, FCM
and webhooks give no receipt that can name a recipient whose answer was lost: resume warns when the
campaign sent through them and such recipients are unknown, and so it does for Twilio or SendGrid when
none of their receipts came for the campaign. A completed campaign can be resumed only with
--resend-unknown. A campaign whose İYS consents are older than its --max-consent-age is not resumed
(nothing is changed): run campaignctl iys sync first.`,
		Example: `  campaignctl resume 42
  campaignctl resume 42 --resend-unknown`,
		Args: exactlyOne("a campaign ID", campaignIDHint("resume")),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if o.id, err = parseID(args[0]); err != nil {
				return err
			}
			return a.resume(cmd.Context(), o)
		},
	}
	cmd.Flags().BoolVar(&o.resendUnknown, "resend-unknown", false, "send again the recipients whose outcome is unknown (each may get the message twice, with the same code)")
	return cmd
}

func (a *app) resume(ctx context.Context, o resumeOptions) error {
	svc, err := a.openServices(ctx, o.id)
	if err != nil {
		return err
	}
	defer svc.Close()
	rep, err := worker.Resume(ctx, worker.ResumeOptions{Store: svc.store, Redis: svc.redis, CampaignID: o.id, ResendUnknown: o.resendUnknown})
	a.printResume(rep, o, err)
	return err
}

// printResume prints what resume found and did; after an error, what it did before.
func (a *app) printResume(rep worker.ResumeReport, o resumeOptions, err error) {
	id := rep.CampaignID
	if rep.To != "" {
		fmt.Fprintf(a.stdout, "campaign %d was %s and is %s again\n", id, rep.Was, rep.To)
	}
	if rep.Found == nil {
		return
	}
	f := rep.Found
	fmt.Fprintf(a.stdout, "campaign %d found: %d planned, %d sent, %d failed, %d skipped, %d unknown, %d pending\n",
		id, f.Planned, f.Sent, f.Failed, f.Skipped, f.Unknown, f.Pending)
	if rep.Unprovable > 0 {
		then := fmt.Sprintf("`--resend-unknown` would send a second message to each whose first was accepted: check them against the provider's own records first (SELECT user_id, address FROM campaign_recipients WHERE campaign_id = %d AND status = 'unknown' AND coalesce(provider_message_id, '') = '' AND delivery IS NULL)", id)
		if o.resendUnknown {
			then = "those made pending again get a second message wherever the first was accepted"
		}
		via, why := viaList(rep.UnprovableVia, rep.UnprovableWhy)
		fmt.Fprintf(a.stderr, "warning: %d of the unknown recipients have no provider message ID, and this campaign's messages went through %s: %s; nothing can show whether their messages were accepted; %s\n",
			rep.Unprovable, via, why, then)
	}
	// "0 will be sent again" only when nothing failed and nothing was held back as still in flight.
	if o.resendUnknown && f.Unknown > 0 && (rep.Resent > 0 || err == nil && rep.StillInFlight == 0 && rep.AwaitingReceipts == 0) {
		fmt.Fprintf(a.stdout, "%d unknown recipients will be sent again, with the codes they already hold\n", rep.Resent)
	}
	if rep.StillInFlight > 0 {
		fmt.Fprintf(a.stdout, "%d unknown recipients were claimed or recorded unknown less than %v ago and may still be answered (a provider may take a request after its sender gave up, and say so in a receipt): they stay unknown; run `campaignctl resume %d --resend-unknown` again after %v\n",
			rep.StillInFlight, rep.Grace, id, rep.Grace)
	}
	if rep.AwaitingReceipts > 0 {
		fmt.Fprintf(a.stdout, "%d unknown recipients were recorded unknown less than %v ago through a provider whose receipts name the recipient (Twilio's status callbacks, SendGrid's events), which can come minutes after the message: they stay unknown, so that a receipt coming meanwhile proves their first message; run `campaignctl resume %d --resend-unknown` again in %v\n",
			rep.AwaitingReceipts, worker.ReceiptGrace, id, rep.ReceiptWait)
	}
	if err != nil {
		return
	}
	c := rep.Counts
	fmt.Fprintf(a.stdout, "campaign %d: %d batches re-enqueued, %d already queued, %d taken back from the DLQ; %d recipients pending, %d unknown\n",
		id, rep.Enqueued, rep.AlreadyQueued, rep.FromDLQ, c.Pending, c.Unknown)
	if rep.FollowUps > 0 {
		fmt.Fprintf(a.stdout, "%d of the queued batches still had a task running (a stopped worker's, which Asynq gives back a minute or more later): each got a follow-up task that runs now\n", rep.FollowUps)
	}
	if rep.Hastened > 0 {
		fmt.Fprintf(a.stdout, "%d of the queued batches were waiting to be retried and run now\n", rep.Hastened)
	}
	if c.Unknown > 0 && !o.resendUnknown {
		fmt.Fprintf(a.stdout, "unknown recipients are not sent again by default; `campaignctl resume %d --resend-unknown` does\n", id)
	}
	if rep.Completed {
		fmt.Fprintf(a.stdout, "campaign %d had nothing pending and is now completed\n", id)
	}
	if rep.QueuePaused {
		fmt.Fprintf(a.stderr, "warning: the Asynq queue %s is paused (asynqmon's Pause): no worker takes a batch of any campaign until it is unpaused there (campaignctl ui: Queues, %s, Resume)\n", worker.Queue, worker.Queue)
	}
}

// viaList writes providers and their recipients as "netgsm (3417 recipients sent or left unknown through
// it) and fcm (2)", the most used first, and why says why each cannot clear an unknown recipient
// (whys, from worker.ResumeReport.UnprovableWhy).
func viaList(via map[string]int64, whys map[string]string) (list, why string) {
	names := slices.SortedFunc(maps.Keys(via), func(a, b string) int {
		if c := cmp.Compare(via[b], via[a]); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	parts, reasons := make([]string, len(names)), make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s (%d)", n, via[n])
		reasons[i] = whys[n]
	}
	parts[0] = fmt.Sprintf("%s (%d recipients sent or left unknown through it)", names[0], via[names[0]])
	return strings.Join(parts, " and "), strings.Join(reasons, "; ")
}
