package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/limiter"
)

// PauseOptions configures Pause.
type PauseOptions struct {
	Store      *campaign.Store
	Redis      redis.UniversalClient
	CampaignID int64
	// Logger is told when the pause is recorded in Postgres but not in Redis; nil discards.
	Logger *slog.Logger
}

// PauseReport is what Pause did.
type PauseReport struct {
	CampaignID int64
	// Was is the state the campaign was paused from: running or scheduled.
	Was campaign.State
	// Halted says the halt mark is in Redis, so no new send starts on any worker once Pause returned.
	// Without it (Redis failed) Postgres still holds the pause and workers stop at their next chunk.
	Halted bool
}

// Pause stops a running or scheduled campaign's sends on every worker: Postgres records the pause, and
// a halt mark in Redis makes every worker check it before its next claim. Sends already waiting for the
// provider finish and are recorded; the recipients not sent stay pending until Resume.
func Pause(ctx context.Context, o PauseOptions) (PauseReport, error) {
	rep := PauseReport{CampaignID: o.CampaignID}
	was, err := o.Store.Transition(ctx, o.CampaignID, []campaign.State{campaign.StateRunning, campaign.StateScheduled}, campaign.StatePaused)
	if errors.Is(err, campaign.ErrWrongState) && was == campaign.StatePaused {
		// Pausing a paused campaign is what a script that repeats a pause asks for: done already (its halt
		// is set again, in case Redis lost it).
		err = nil
	}
	if err != nil {
		return rep, fmt.Errorf("%w; only a running or scheduled campaign can be paused", err)
	}
	rep.Was = was
	if err := haltAs(ctx, o.Redis, o.CampaignID, campaign.StatePaused); err != nil {
		orDiscard(o.Logger).Warn("pause recorded in Postgres, but not in Redis; workers stop at their next chunk instead of their next send", "err", err)
	} else {
		rep.Halted = true
		settleHalt(ctx, was)
	}
	return rep, nil
}

// haltSettle is how long a pause or cancel waits, once its halt mark is written, before it says that no
// new send starts: a send whose claim (or its guard read again) came just before the mark may still be
// on its way to the provider. It leaves within guardAgainAfter of its claim, or at once after its guard
// is read again, plus what a loaded machine delays a goroutine (up to 26 ms seen in an outside run with
// Redis stalled: sends started after the pause had returned).
const haltSettle = guardAgainAfter + 50*time.Millisecond

// settleHalt waits haltSettle after a halt mark was written on a campaign that was running (was); one that
// was not has no send on its way.
func settleHalt(ctx context.Context, was campaign.State) {
	if was == campaign.StateRunning {
		limiter.Sleep(ctx, haltSettle) //nolint:errcheck // cut short by ctx: the command is ending anyway
	}
}

// CancelOptions configures Cancel.
type CancelOptions struct {
	Store      *campaign.Store
	Redis      redis.UniversalClient
	CampaignID int64
	// Wait is how long Cancel waits for live workers to let go of the batches they are sending; 0 makes
	// one pass only.
	Wait time.Duration
	// Owner names this process in the leases it takes to close batches (host:pid:cancel); default
	// "cancel".
	Owner  string
	Logger *slog.Logger
	// Recorded, when set, is called once the cancel is recorded (CampaignID, Was and Halted set), before
	// the batches are closed, which may take up to Wait.
	Recorded func(CancelReport)
	// Waiting, when set, is told once, two seconds into the wait, how many batches workers still hold and
	// how long the cancel waits for them at most: a dead worker's lease runs out before its batch is
	// closed, and the command must not look hung meanwhile.
	Waiting func(held int, upTo time.Duration)
}

// CancelReport is what Cancel did.
type CancelReport struct {
	CampaignID int64
	// Was is the state the campaign was cancelled from: running, scheduled or paused.
	Was campaign.State
	// Halted says the halt mark is in Redis (see PauseReport.Halted).
	Halted bool
	// Cancelled counts the campaign's recipients skipped because of the cancel; their codes went back to
	// CodePool (empty when the campaign has none). Recipients once recorded unknown are not among them:
	// they stay unknown, with their codes (campaign.CancelledUnsure).
	Cancelled int64
	CodePool  string
	// Counts are the recipients by status once Cancel let go (zero until then). Those still pending are
	// held by a live worker that did not let go within Wait.
	Counts campaign.Counts
	// Requeued counts the batch tasks queued so that a worker closes what is still pending.
	Requeued int
	// Dequeued counts the batch tasks taken out of the queue (waiting, scheduled or retrying) once nothing
	// was left pending: they had nothing to do.
	Dequeued int
	// QueueLeft: the campaign's batches still in Redis's queue or DLQ were not taken out (Redis did not
	// answer the halt mark); each finds nothing to do, and a cancel run again once Redis answers takes
	// them out.
	QueueLeft bool
}

// dropQueued deletes the queued tasks (pending, scheduled, retrying) of the batches of a campaign whose
// recipients are all settled; a task being run is left to finish. It returns how many it deleted.
func dropQueued(rdb redis.UniversalClient, campaignID int64, batches int) (int, error) {
	insp := asynq.NewInspectorFromRedisClient(rdb)
	n := 0
	for b := 0; b < batches; b++ {
		deleted, err := deleteTaskIn(insp, TaskID(campaignID, b), asynq.TaskStatePending, asynq.TaskStateScheduled, asynq.TaskStateRetry)
		if err != nil {
			return n, err
		}
		if deleted {
			n++
		}
	}
	return n, nil
}

// Cancel ends a running, scheduled or paused campaign for good. No new send starts on any worker once
// it is recorded; every recipient not sent yet becomes skipped (cancelled) and its code goes back to the
// pool, while recipients whose send was answered keep that outcome. Rows no run holds are closed at
// once; batches a live worker is sending are closed when it lets them go (Cancel looks again every second
// for up to Wait), and those of a worker that died are closed from their Redis claims.
func Cancel(ctx context.Context, o CancelOptions) (CancelReport, error) {
	rep := CancelReport{CampaignID: o.CampaignID}
	id := o.CampaignID
	was, err := o.Store.Transition(ctx, id, []campaign.State{campaign.StateRunning, campaign.StateScheduled, campaign.StatePaused},
		campaign.StateCancelled)
	if errors.Is(err, campaign.ErrWrongState) && was == campaign.StateCancelled {
		// Cancelling a cancelled campaign finishes what the first cancel could not: rows a live run held
		// then, and batches that reached the DLQ since (their recipients would otherwise stay pending, as
		// `dlq retry` and `resume` leave a cancelled campaign alone). Its halt is written again too.
		err = nil
	}
	if err != nil {
		return rep, fmt.Errorf("%w; only a running, scheduled or paused campaign can be cancelled", err)
	}
	rep.Was = was
	log := orDiscard(o.Logger)
	// away: Redis did not answer the halt mark (down, frozen, out of reach): the cancel is recorded in
	// Postgres alone. The recipients runs hold are left to the workers (their claims are in Redis: reading
	// them would only wait on each timeout), and nothing is queued or taken out of the queue; the cancel
	// says what is left.
	away := false
	if err := haltAs(ctx, o.Redis, id, campaign.StateCancelled); err != nil {
		log.Warn("cancel recorded in Postgres, but not in Redis; workers stop at their next chunk instead of their next send", "err", err)
		away = redisUnanswered(err)
	} else {
		rep.Halted = true
		settleHalt(ctx, was)
	}
	if o.Recorded != nil {
		o.Recorded(rep)
	}

	if _, err := o.Store.CancelUnleased(ctx, id); err != nil {
		return rep, err
	}
	owner := o.Owner
	if owner == "" {
		owner = "cancel"
	}
	// A batch run of a cancelled campaign sends nothing: it records what the claims say and skips the rest.
	// Its line a batch is a worker's log, not the command's answer: it is kept for --log-level debug.
	hlog := log
	if !log.Enabled(ctx, slog.LevelDebug) {
		hlog = slog.New(atLeast{log.Handler(), slog.LevelWarn})
	}
	h := NewHandler(Config{Store: o.Store, Redis: o.Redis, Logger: hlog, Owner: owner})
	start := time.Now()
	deadline := start.Add(o.Wait)
	told := false
	for !away {
		batches, err := o.Store.PendingBatches(ctx, id, false)
		if err != nil {
			return rep, err
		}
		held := 0
		for _, b := range batches {
			var re *RetryError
			if err := h.RunBatch(ctx, id, b); errors.As(err, &re) {
				held++
			} else if err != nil {
				return rep, err
			}
		}
		if held == 0 || time.Now().After(deadline) {
			break
		}
		if !told && o.Waiting != nil && time.Since(start) >= 2*time.Second {
			o.Waiting(held, time.Until(deadline))
			told = true
		}
		if err := limiter.Sleep(ctx, time.Second); err != nil {
			return rep, err
		}
	}
	counts, err := o.Store.Counts(ctx, id)
	if err != nil {
		return rep, err
	}
	c, err := o.Store.Get(ctx, id)
	if err != nil {
		return rep, err
	}
	cancelled, err := o.Store.CountReason(ctx, id, campaign.StatusSkipped, campaign.ReasonCancelled)
	if err != nil {
		return rep, err
	}
	rep.Counts, rep.Cancelled, rep.CodePool = counts, cancelled, c.CodePool
	if away {
		if counts.Pending > 0 {
			return rep, fmt.Errorf("%s that runs hold are not closed yet: Redis, which holds their claims, did not answer", countRecipients(int(counts.Pending)))
		}
		rep.QueueLeft = true
		return rep, nil
	}
	if counts.Pending == 0 {
		// Nothing is left to close: a batch of the campaign in the DLQ has no work left, and would only
		// stand in the campaign's status as one.
		// Redis failing now: what it leaves in the DLQ and the queue has nothing to do; a cancel run again
		// takes it out.
		if _, err := PurgeDLQ(ctx, DLQOptions{Store: o.Store, Redis: o.Redis, CampaignID: id}); err != nil {
			log.Warn("the cancelled campaign's batches in the DLQ were not taken out (run campaignctl cancel again once Redis answers); none has anything left to do", "campaign_id", id, "err", err)
			return rep, nil
		}
		// Nor do its batches still queued (the rest of a large campaign, waiting or scheduled): each would
		// run only to find nothing to do, ahead of other campaigns' batches (1,610 of a cancelled campaign
		// of a million held a new campaign back for minutes, with no reason said).
		if rep.Dequeued, err = dropQueued(o.Redis, id, c.Batches); err != nil {
			log.Warn("the cancelled campaign's batches still queued were not all taken out; each runs and finds nothing to do", "campaign_id", id, "err", err)
		}
	}
	if counts.Pending > 0 {
		// A live worker still holds them; its batch tasks close them when it lets go. A batch whose task is
		// in the DLQ (its retries used up) would have no task to close them, and its task ID would keep a
		// new one out: it is taken out of the DLQ first. A run of a cancelled campaign sends nothing; it
		// only closes its recipients.
		fromDLQ, _, err := requeueArchived(ctx, o.Redis, id)
		if err != nil {
			return rep, err
		}
		if rep.Requeued, _, err = Enqueue(ctx, asynq.NewClientFromRedisClient(o.Redis), o.Store, c, false); err != nil {
			return rep, err
		}
		rep.Requeued += fromDLQ
	}
	return rep, nil
}

// redisUnanswered says whether err is Redis not answering (a timeout, a connection refused or lost)
// rather than an answer that refused the command (out of memory, read-only), after which Redis still
// answers reads at once.
func redisUnanswered(err error) bool {
	var reply redis.Error
	return err != nil && !errors.As(err, &reply) && !errors.Is(err, context.Canceled)
}

// haltWait is how long a halt mark's write may take: a Redis that answers takes it in milliseconds, and
// one that does not is not waited for through its client's timeouts and retries (the state is in Postgres
// already, and the workers stop at their next chunk).
const haltWait = time.Second

// haltAs writes the halt mark of a campaign paused or cancelled (st): a pause's lasts until Resume clears
// it, a cancel's as long as the claims, which it outlives. The write gets haltWait: the client's retries
// stop there, and so do its reads when its contexts bound them (the commands' client does).
func haltAs(ctx context.Context, rdb redis.UniversalClient, id int64, st campaign.State) error {
	ttl := time.Duration(0)
	if st == campaign.StateCancelled {
		ttl = DefaultClaimTTL
	}
	ctx, cancel := context.WithTimeout(ctx, haltWait)
	defer cancel()
	return Halt(ctx, rdb, id, string(st), ttl)
}

// ResumeOptions configures Resume.
type ResumeOptions struct {
	Store      *campaign.Store
	Redis      redis.UniversalClient
	CampaignID int64
	// ResendUnknown sends the recipients whose outcome is unknown once more, with the codes they hold,
	// unless their claim shows the provider had accepted them; it also lets a completed campaign resume.
	ResendUnknown bool
}

// ResumeReport is what Resume found and did. When Resume fails part way, it holds what was done.
type ResumeReport struct {
	CampaignID int64
	// Was is the state Resume found. To is the state it moved a paused (or, with ResendUnknown, completed)
	// campaign to, running or scheduled; empty when the campaign stayed as it was.
	Was, To campaign.State
	// Found are the recipients by status when Resume took the campaign up; nil when it could not.
	Found *campaign.Counts
	// Resent counts the unknown recipients moved back to pending (ResendUnknown).
	Resent int64
	// Unprovable counts the unknown recipients found with no provider message ID, when the campaign's
	// sends went through a provider whose receipts cannot name a recipient (UnprovableVia: those
	// providers, with the recipients sent or left unknown through each). Nothing can show whether such a
	// provider accepted their messages: a resend sends a second message to each one it did. Zero when the
	// campaign used none.
	Unprovable    int64
	UnprovableVia map[string]int64
	// UnprovableWhy says, for each provider of UnprovableVia, why its receipts cannot clear those
	// recipients: it sends none that names the recipient (NoRecipientReceipts), or none of its receipts
	// has reached this engine for the campaign (NoReceiptCame).
	UnprovableWhy map[string]string
	// StillInFlight counts the unknown recipients not resent because their claims were taken, or they
	// were recorded unknown, less than Grace ago: the calls they were taken for may still be answered.
	StillInFlight int
	// AwaitingReceipts counts the unknown recipients not resent because they were recorded unknown less
	// than ReceiptGrace ago through a provider whose receipts name the recipient: a receipt may still
	// show that their first message was accepted. ReceiptWait is how long until the last of them may be
	// resent.
	AwaitingReceipts int
	ReceiptWait      time.Duration
	// Grace is how old a claim in flight had to be for its recipient to be resent: ResendGrace, or the
	// longest in-flight grace a worker noted (3 × its --provider-timeout) when longer.
	Grace time.Duration
	// Counts are the recipients by status after the resend: the progress counters were rebuilt from them.
	Counts campaign.Counts
	// Enqueued counts the batch tasks newly queued; AlreadyQueued those that were in the queue already
	// (queued, scheduled, retrying or running); FromDLQ those taken back from the dead-letter queue with
	// a fresh retry budget.
	Enqueued, AlreadyQueued, FromDLQ int
	// FollowUps counts the batches already queued whose task was found still running (a dead worker's,
	// which Asynq gives back only a minute or more later) and that got a follow-up task to run beside it
	// (counted in AlreadyQueued, not in Enqueued).
	FollowUps int
	// Hastened counts the queued batch tasks that were waiting for a later retry or their scheduled time
	// and were made to run now (a running campaign whose send window is open).
	Hastened int
	// Completed says the campaign had nothing pending and is now completed.
	Completed bool
	// QueuePaused says the whole Asynq queue is paused (asynqmon's Pause): Resume does not unpause it
	// (it holds every campaign), so nothing moves until someone unpauses it there.
	QueuePaused bool
}

// ResendGrace is how old the claim of an unknown recipient must be at least before `resume
// --resend-unknown` sends it again: a worker's chunk lease with the default provider timeout (3 × 10 s);
// longer when a worker noted a longer one (its heartbeat: state.NoteInFlightGrace). A younger claim may belong to a call still
// under way, whose worker was judged dead while it was only slow or paused.
const ResendGrace = 30 * time.Second

// ReceiptGrace is how long `resume --resend-unknown` holds back an unknown recipient whose provider's
// receipts name the recipient (Twilio's status callbacks, SendGrid's events), from when it was recorded
// unknown: such a receipt proves its first message was accepted, and it can come minutes after the
// message (SendGrid posts its events in batches, and retries a post its endpoint did not take).
const ReceiptGrace = 10 * time.Minute

// NoReceiptCame is why a provider that does send receipts naming the recipient cannot clear a
// campaign's unknown recipients when none of its receipts reached this engine for the campaign.
var NoReceiptCame = map[string]string{
	"twilio":   "no status callback has come for any of this campaign's messages through Twilio (TWILIO_STATUS_CALLBACK not set on the workers, or its callbacks do not reach `campaignctl webhooks`)",
	"sendgrid": "no event has come for any of this campaign's e-mails through SendGrid (the Event Webhook not set up, or its posts do not reach `campaignctl webhooks`)",
}

// NoRecipientReceipts names the providers whose receipts cannot name a recipient whose answer was lost,
// each with why. Twilio's status callbacks (with TWILIO_STATUS_CALLBACK) and SendGrid's events name the
// campaign and user (providers.ReceiptsNameRecipient).
var NoRecipientReceipts = map[string]string{
	"netgsm":  "Netgsm's reports are asked for by job ID, which came only in the lost answer",
	"fcm":     "FCM sends no receipts",
	"webhook": "webhooks send no receipts",
}

// unprovable reads proof for the unknown recipients nothing can clear: those with no message ID left
// unknown through a provider whose receipts cannot name them (NoRecipientReceipts) or whose receipts never
// reached this engine for the campaign (NoReceiptCame), or through none known while the campaign used
// such a provider. It returns their count, the recipients sent or left unknown through each such
// provider, and why each cannot clear them; zero when there are none.
func unprovable(proof campaign.UnknownProof) (n int64, via map[string]int64, why map[string]string) {
	via, why = map[string]int64{}, map[string]string{}
	for p, pp := range proof {
		if p == "" || pp.Via == 0 {
			continue
		}
		if w, ok := NoRecipientReceipts[p]; ok {
			via[p], why[p] = pp.Via, w
			n += pp.NoMessageID
		} else if pp.Receipts == 0 {
			w, ok := NoReceiptCame[p]
			if !ok {
				w = "no receipt has come for any of this campaign's messages through " + p
			}
			via[p], why[p] = pp.Via, w
			n += pp.NoMessageID
		}
	}
	if len(via) == 0 {
		return 0, nil, nil
	}
	n += proof[""].NoMessageID
	if n == 0 {
		return 0, nil, nil
	}
	return n, via, why
}

// receiptsMayCome says whether a receipt may still name one of the campaign's unknown recipients, by the
// providers its rows name (proof): one of them is not in NoRecipientReceipts, or none is named at all
// (every claim that named one was lost), so any of the channel's might have sent.
func receiptsMayCome(proof campaign.UnknownProof) bool {
	named := false
	for p, pp := range proof {
		if p == "" || pp.Via == 0 {
			continue
		}
		if _, never := NoRecipientReceipts[p]; !never {
			return true
		}
		named = true
	}
	return !named
}

// Resume continues a campaign after a pause or after any incident (a killed worker or launch, Redis
// restarted empty, Postgres restarted), from Postgres, the source of truth: a paused campaign runs again
// (or waits for its start), its halt mark is cleared, with ResendUnknown the unknown recipients go back
// to pending, the progress counters are rebuilt, its dead-lettered batches are queued again and every
// batch with pending recipients that is not queued is queued. Task IDs are deterministic, so Resume is
// safe to repeat and to run while workers run. A campaign with nothing pending is completed.
func Resume(ctx context.Context, o ResumeOptions) (ResumeReport, error) {
	id := o.CampaignID
	rep := ResumeReport{CampaignID: id}
	// The halts written so far, read before anything changes: the halt is cleared below only if no pause
	// or cancel wrote one since (state.UnhaltIf). One that lands while this runs keeps its halt, so no
	// send starts after it was acknowledged. Redis unreachable: nothing is changed.
	halts, err := state.Halts(ctx, o.Redis, id)
	if err != nil {
		return rep, err
	}
	c, err := o.Store.Get(ctx, id)
	if err != nil {
		return rep, err
	}
	counts, err := o.Store.Counts(ctx, id)
	if err != nil {
		return rep, err
	}
	rep.Was = c.State
	resumable := c.State == campaign.StateRunning || c.State == campaign.StateScheduled || c.State == campaign.StatePaused ||
		c.State == campaign.StateCompleted && o.ResendUnknown && counts.Unknown > 0
	if why := c.ConsentStaleThen(fmt.Sprintf("`campaignctl resume %d`", id)); why != "" && resumable {
		// Every batch it queued would go straight to the DLQ, and its sends would stay stopped: nothing is
		// changed, and the way on is said.
		return rep, &campaign.ConsentStaleError{Msg: fmt.Sprintf("campaign %d is not resumed (nothing was changed): %s", id, why)}
	}
	switch c.State {
	case campaign.StateRunning, campaign.StateScheduled:
	case campaign.StatePaused, campaign.StateCompleted:
		if c.State == campaign.StateCompleted && (!o.ResendUnknown || counts.Unknown == 0) {
			hint := ""
			if counts.Unknown > 0 {
				hint = fmt.Sprintf(" (%d recipients are unknown: `campaignctl resume %d --resend-unknown` sends them again)", counts.Unknown, id)
			} else if o.ResendUnknown {
				hint = " and none of its recipients is unknown: --resend-unknown has nobody to send again"
			}
			return rep, fmt.Errorf("%w: campaign %d is completed; there is nothing to resume%s", campaign.ErrWrongState, id, hint)
		}
		_, to, err := o.Store.Start(ctx, id, []campaign.State{c.State})
		if errors.Is(err, campaign.ErrWrongState) {
			// Another resume started it meanwhile (two run at once): go on from the state it is in now,
			// as a resume of a running campaign does.
			if now, gerr := o.Store.Get(ctx, id); gerr == nil && (now.State == campaign.StateRunning || now.State == campaign.StateScheduled) {
				to, err = now.State, nil
			}
		}
		if err != nil {
			return rep, err
		}
		rep.To, c.State = to, to
	default:
		return rep, fmt.Errorf("%w: campaign %d is %s and cannot be resumed; only a running, scheduled, paused (or, with --resend-unknown, completed) campaign can",
			campaign.ErrWrongState, id, c.State)
	}
	gone, err := state.UnhaltIf(ctx, o.Redis, id, halts)
	if err != nil {
		// The campaign would run in Postgres and stay halted in Redis, its batches handed back for good:
		// it is put back as it was, for the resume to be tried again.
		if rep.To != "" {
			if _, berr := o.Store.Transition(ctx, id, []campaign.State{rep.To}, rep.Was); berr == nil {
				rep.To, c.State = "", rep.Was
			}
		}
		return rep, err
	}
	// A pause or cancel that landed while this ran keeps its halt (gone is false); one whose Postgres
	// change landed after the transition but whose halt came after the unhalt writes it anew. Either way
	// the state is read again: paused or cancelled, it stands, its halt written (again).
	now, err := o.Store.Get(ctx, id)
	if err != nil {
		return rep, err
	}
	if !gone && (now.State == campaign.StateRunning || now.State == campaign.StateScheduled) {
		// A pause of the campaign still paused landed meanwhile (it found it paused and only wrote its
		// halt again): it was acknowledged after this began, so it wins.
		if _, err := o.Store.Transition(ctx, id, []campaign.State{now.State}, campaign.StatePaused); err == nil {
			now.State = campaign.StatePaused
		} else if !errors.Is(err, campaign.ErrWrongState) {
			return rep, err
		} else if now, err = o.Store.Get(ctx, id); err != nil {
			return rep, err
		}
	}
	if now.State == campaign.StatePaused || now.State == campaign.StateCancelled {
		if err := haltAs(ctx, o.Redis, id, now.State); err != nil {
			return rep, err
		}
		// It did not go on: the report must not say it runs again (it said both).
		rep.To = ""
		return rep, fmt.Errorf("%w: campaign %d was %s while it was being resumed; it stays %s", campaign.ErrWrongState, id, now.State, now.State)
	}
	found := counts
	rep.Found = &found
	var proof campaign.UnknownProof
	if counts.Unknown > 0 {
		// Whether anything can still clear the unknown recipients that a resend sends again.
		if proof, err = o.Store.UnknownProof(ctx, id); err != nil {
			return rep, err
		}
		rep.Unprovable, rep.UnprovableVia, rep.UnprovableWhy = unprovable(proof)
	}

	if o.ResendUnknown && counts.Unknown > 0 {
		// Claims first: a recipient back in pending with its old claim would only be found unknown again.
		// One whose claim was taken moments ago stays unknown: its call may still be answered.
		grace, err := state.InFlightGrace(ctx, o.Redis)
		if err != nil {
			return rep, err
		}
		rep.Grace = max(grace, ResendGrace)
		// Those recorded unknown less than the grace ago are held back (UnknownToResend): a worker that gave
		// up on the answer records them at once, while the provider may still take the request; and a
		// takeover that found the claims gone with Redis's data has no claim to say how old the calls are.
		// Those recorded unknown less than ReceiptGrace ago through a provider whose receipts name the
		// recipient are held back too: its receipt may still come. A campaign that sent only through
		// providers whose receipts never can holds nobody back for it.
		receiptGrace := time.Duration(0)
		if receiptsMayCome(proof) {
			receiptGrace = ReceiptGrace
		}
		h, err := o.Store.UnknownToResend(ctx, id, rep.Grace, receiptGrace, slices.Sorted(maps.Keys(NoRecipientReceipts)))
		if err != nil {
			return rep, err
		}
		users := h.Resend
		rep.AwaitingReceipts, rep.ReceiptWait = len(h.AwaitingReceipts), h.Wait.Round(time.Second)
		kept, err := ForgetUnanswered(ctx, o.Redis, c, users, rep.Grace)
		if err != nil {
			return rep, err
		}
		rep.StillInFlight = len(h.Held) + len(kept)
		if len(kept) > 0 {
			skip := make(map[string]bool, len(kept))
			for _, u := range kept {
				skip[u] = true
			}
			users = slices.DeleteFunc(users, func(u string) bool { return skip[u] })
		}
		if rep.Resent, err = o.Store.Resend(ctx, id, users); err != nil {
			return rep, err
		}
		if counts, err = o.Store.Counts(ctx, id); err != nil {
			return rep, err
		}
	}
	rep.Counts = counts

	// Counters are a fast view for the progress bars; Postgres has the truth.
	if err := rebuildProgress(ctx, o.Redis, id, counts); err != nil {
		return rep, err
	}
	var ownDLQ int
	if rep.FromDLQ, ownDLQ, err = requeueArchived(ctx, o.Redis, id); err != nil {
		return rep, err
	}
	added, existing, err := Enqueue(ctx, asynq.NewClientFromRedisClient(o.Redis), o.Store, c, false)
	rep.Enqueued = added
	if err != nil {
		return rep, err
	}
	// The batches taken back from the DLQ under their own task ID were queued a moment ago: Enqueue found
	// them there.
	rep.AlreadyQueued = max(existing-ownDLQ, 0)
	if (rep.Resent > 0 || rep.Was == campaign.StatePaused && rep.To != "") && rep.AlreadyQueued > 0 {
		// A batch's task found running may be at its very end, past its last look for pending recipients
		// and about to be deleted: the recipients made pending again here would then wait for a task
		// that is gone. Such a task ends within moments; the batch is queued again once it has.
		// After a pause, a task still running is a worker's that died (a live run hands its batch back
		// when it meets the pause): the sweep, which queues a dead run's batch again, does not while the
		// campaign is paused, and the task comes back only when Asynq gives it back, a minute or more on.
		again, followUps, err := enqueueAfterActive(ctx, o.Redis, o.Store, c, activeEndWait)
		rep.Enqueued += again
		rep.FollowUps = followUps
		rep.AlreadyQueued = max(rep.AlreadyQueued-again, 0)
		if err != nil {
			return rep, err
		}
	}
	if rep.AlreadyQueued > 0 && c.State == campaign.StateRunning && c.Window.Open(time.Now()) {
		// Batches that met the pause (or a wait of the incident) are waiting to be retried, up to 30 s
		// from now: they run now.
		if rep.Hastened, err = runNow(o.Redis, id, asynq.TaskStateRetry, asynq.TaskStateScheduled); err != nil {
			return rep, err
		}
	}
	if rep.Completed, err = o.Store.CompleteIfDone(ctx, id); err != nil {
		return rep, err
	}
	if rep.Completed {
		// Nothing of the campaign is pending: whatever of it the DLQ holds has no work left.
		if _, err := dropArchived(o.Redis, id); err != nil {
			return rep, err
		}
	}
	if !rep.Completed {
		// Best effort: what is resumed is done; the queue's pause is only said.
		rep.QueuePaused, _ = QueuePaused(o.Redis)
	}
	// A cancel (or pause) that committed after the state was read above stands: its halt stops every
	// send, and the report must not say the campaign runs (it said "recipients pending" and exited 0).
	if now, err := o.Store.Get(ctx, id); err == nil && (now.State == campaign.StateCancelled || now.State == campaign.StatePaused) {
		rep.To = ""
		return rep, fmt.Errorf("%w: campaign %d was %s while it was being resumed; it stays %s", campaign.ErrWrongState, id, now.State, now.State)
	}
	return rep, nil
}

// activeEndWait bounds how long resume waits for the campaign's running batch tasks to end before it
// queues their batches again (enqueueAfterActive).
const activeEndWait = 2 * time.Second

// enqueueAfterActive waits, up to wait, until none of campaign c's batch tasks is running, then queues
// again the batches with pending recipients whose tasks are gone meanwhile. A batch whose task still runs
// then gets a follow-up task of its own (`<campaign>:<batch>/resumed-<unix second>`): the task may be
// a dead worker's, which Asynq gives back only a minute or more later, and the recipients made pending
// again are in no lease for a sweep to find; if its run is alive, the follow-up waits for that run's
// lease and finds the batch done. It returns how many batches it queued again, and how many follow-ups.
func enqueueAfterActive(ctx context.Context, rdb redis.UniversalClient, store *campaign.Store, c *campaign.Campaign, wait time.Duration) (again, followUps int, err error) {
	insp := asynq.NewInspectorFromRedisClient(rdb)
	deadline := time.Now().Add(wait)
	var running map[int]bool
	for {
		running = map[int]bool{}
		if err := batchTasks(insp.ListActiveTasks, c.ID, func(_ *asynq.TaskInfo, _ int64, b int) { running[b] = true }); err != nil {
			return 0, 0, fmt.Errorf("read the queue: %w", err)
		}
		if len(running) == 0 || !time.Now().Before(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	client := asynq.NewClientFromRedisClient(rdb)
	again, _, err = Enqueue(ctx, client, store, c, false)
	if err != nil || len(running) == 0 {
		return again, 0, err
	}
	pending, err := store.PendingBatches(ctx, c.ID, false)
	if err != nil {
		return again, 0, err
	}
	now := time.Now()
	for _, b := range pending {
		if !running[b] {
			continue
		}
		queued, err := enqueueFollowUp(ctx, client, c.ID, b, "resumed", now)
		if err != nil {
			return again, followUps, err
		}
		if queued {
			followUps++
		}
	}
	return again, followUps, nil
}

// orDiscard is l, or a logger that discards.
func orDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}

// runNow makes campaign id's batch tasks in the given states (archived, retry, scheduled) run now: one
// listing of each state, a page at a time, not a lookup a batch. A task that started meanwhile is left as
// it is.
func runNow(rdb redis.UniversalClient, id int64, states ...asynq.TaskState) (int, error) {
	insp := asynq.NewInspectorFromRedisClient(rdb)
	lists := map[asynq.TaskState]func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){
		asynq.TaskStateArchived: insp.ListArchivedTasks, asynq.TaskStateRetry: insp.ListRetryTasks,
		asynq.TaskStateScheduled: insp.ListScheduledTasks,
	}
	var ids []string
	var batchOf []int
	collect := func(t *asynq.TaskInfo, _ int64, batch int) { ids, batchOf = append(ids, t.ID), append(batchOf, batch) }
	for _, st := range states {
		if err := batchTasks(lists[st], id, collect); err != nil {
			return 0, fmt.Errorf("read the queue: %w", err)
		}
	}
	// Batches, not tasks: a batch's follow-ups (queued by a sweep or a resume) run with it, and counting
	// them said 101 batches of a campaign of 34.
	ran := map[int]bool{}
	for i, tid := range ids {
		if insp.RunTask(Queue, tid) == nil {
			ran[batchOf[i]] = true
		}
	}
	return len(ran), nil
}

// atLeast is a handler that drops the records below a level.
type atLeast struct {
	slog.Handler
	min slog.Level
}

func (h atLeast) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h atLeast) WithAttrs(as []slog.Attr) slog.Handler {
	return atLeast{h.Handler.WithAttrs(as), h.min}
}
func (h atLeast) WithGroup(name string) slog.Handler {
	return atLeast{h.Handler.WithGroup(name), h.min}
}
