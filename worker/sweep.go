package worker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/hibiken/asynq"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
)

// Sweep settles the chunks of batch runs that died (their leases expired, or their worker process's
// liveness lock has been gone for goneAfter) from their claims, while Redis still has them: a recipient
// whose claim holds an answer gets it recorded, a claim left without an answer makes the recipient unknown
// (the lease outlived the provider's timeout, or the process that made the call is dead, so the call is
// over), and
// a recipient without a claim was never sent and simply becomes free again. Without the sweep a dead run's
// chunk waits for its batch to run again (Asynq gives a dead worker's task back after about a minute); if
// Redis lost its data meanwhile, its recipients could only be marked unknown. It sends nothing. It returns
// how many recipients it settled or freed.
func (h *Handler) Sweep(ctx context.Context) (int, error) {
	if l := h.cfg.Liveness; l != nil && (!l.Held() || l.Gen() > 1 && l.HeldFor() < h.cfg.LivenessGrace) {
		// Postgres came back a moment ago (a restart, a failover): this process's own lock went with it and
		// is held again. While Postgres was away no run could renew its lease, so every lease may have run
		// out; the live runs renew theirs, or record their chunks (record), within seconds of its return.
		// Taken over now, a live run's chunk would be settled from its claims, which Redis may have lost
		// meanwhile: its recipients never sent would become unknown. So expired leases wait, as gone
		// holders do (goneHolders), until the lock has been held again for LivenessGrace. A process that
		// has just started (its first hold) sweeps expired leases at once: a dead run's chunk is settled
		// before Redis can lose its claims. A process whose lock is not held (lost, not held again yet)
		// sweeps nothing either: Postgres may have come back a moment ago, before the live holders took
		// their locks back, and their leases that ran out would look like a dead process's.
		return 0, nil
	}
	gone, err := h.goneHolders(ctx)
	if err != nil {
		return 0, err
	}
	expired, err := h.cfg.Store.ExpiredLeases(ctx, 2000, gone, h.cfg.LivenessGrace)
	if err != nil || len(expired) == 0 {
		return 0, err
	}
	epoch, err := h.state.Epoch(ctx)
	if err != nil {
		return 0, err
	}
	campaigns := map[int64]*campaign.Campaign{}
	n := 0
	for _, e := range expired {
		c, ok := campaigns[e.CampaignID]
		if !ok {
			if c, err = h.cfg.Store.Get(ctx, e.CampaignID); err != nil {
				return n, err
			}
			campaigns[e.CampaignID] = c
		}
		run := &batchRun{c: c, nonce: Nonce(c), batch: e.Batch, counts: map[string]int64{}, snapshots: map[string]campaign.ConsentRecord{},
			lease: campaign.Lease{Batch: e.Batch, Token: state.Token(), Epoch: epoch, TTL: h.cfg.LeaseTTL, AnyState: true, Holder: h.holder(), Gone: gone, HolderGrace: h.cfg.LivenessGrace},
		}
		run.guard = state.Guard{Epoch: epoch, Fence: state.FenceKey(run.lease.Token), Halt: state.HaltKey(c.ID)}
		got, err := h.leaseChunk(ctx, run, e.Users)
		if err != nil {
			return n, err
		}
		if !got.TookOver {
			// No dead run's chunk any more: another worker's sweep, or a run of the batch, got there first
			// (the sweeps of all workers find a dead process in the same second). Nothing to settle, and the
			// batch is queued already. What this lease took (rows the other sweep freed) is let go again.
			if len(got.Leased) > 0 {
				if err := h.flush(ctx, run); err != nil {
					return n, err
				}
				if err := h.cfg.Store.ReleaseBatch(ctx, c.ID, run.lease); err != nil {
					return n, err
				}
			}
			continue
		}
		var serr error
		var users, keys []string
		// Everyone the lease took, not only the users in hand when the expired leases were listed: the lease
		// may have changed hands since (its run renewed it and leased its next chunk, or another run took it
		// and died too), and what is in hand now is what the fenced run may have sent.
		for _, u := range slices.Sorted(maps.Keys(got.Leased)) {
			suspect := got.Leased[u]
			switch {
			case suspect:
				if serr == nil {
					serr = h.settleUnverifiable(ctx, run, &campaign.Recipient{UserID: u, Suspect: true})
				}
			default:
				users, keys = append(users, u), append(keys, ClaimKey(c.ID, u))
			}
		}
		// The claims of the chunk, in one round trip, under the epoch. The dead run's lease was fenced before
		// it was taken (leaseChunk): a run judged dead that is in fact still going (paused, stalled, cut off
		// from Postgres) claims nobody since, so a recipient read here without a claim is never sent by it.
		var vals []any
		if serr == nil && len(keys) > 0 {
			vals, serr = h.state.ReadClaims(ctx, epoch, keys)
		}
		for i := range vals {
			val, ok := vals[i].(string)
			if !ok {
				continue // never claimed: never sent; the lease is let go below
			}
			st := state.ParseValueOf(val, run.nonce)
			if st.Kind == state.Foreign {
				continue // an earlier campaign's claim
			}
			if st.Kind == state.InFlight {
				run.add(campaign.Outcome{UserID: users[i], Status: campaign.StatusUnknown, Reason: reasonDiedMidCall})
				continue
			}
			h.fromClaim(ctx, run, users[i], val[len(run.nonce)+1:])
		}
		if serr != nil {
			// Redis could not be read (gone, or its epoch changed since): the claims are the only record of
			// what the dead run sent, so nothing is recorded and nothing let go. The sweep's own lease keeps the chunk in hand until it expires,
			// and the next sweep reads the claims again (or, if Redis lost them meanwhile, finds another epoch
			// and makes the chunk unknown).
			return n, serr
		}
		// Records the outcomes and lets every row of the chunk go: those without a claim were never sent.
		if err := h.flush(ctx, run); err != nil {
			return n, err
		}
		if err := h.cfg.Store.ReleaseBatch(ctx, c.ID, run.lease); err != nil {
			return n, err
		}
		// The chunk may have held the batch's last pending recipients, and its task may never come back
		// (archived after its retries): the batch is closed here too, and the campaign completed if it was
		// the last.
		if open, err := h.closeBatch(ctx, c.ID, e.Batch); err != nil {
			h.log.Warn("swept batch not closed; its next run or a resume closes it", "campaign_id", c.ID, "batch", e.Batch, "err", fmt.Sprint(err))
		} else if open {
			h.followUp(ctx, c, e.Batch)
		}
		n += len(got.Leased)
	}
	return n, nil
}

// followUp queues a run of batch b of c now: the sweep settled a dead run's chunk of it and it still has
// pending recipients. The dead run's task stays active in Asynq until its lease there runs out and Asynq's
// recovery gives it back, up to a minute and a half after the death, while the workers that are left may sit
// idle. The follow-up has an ID of its own (the batch's and the second of the sweep: sweeps of the batch in
// the same second queue one); the dead run's task, when it comes back, finds the batch done or waits for
// the follow-up's lease, as any two runs of one batch do. A cancelled campaign's batch is queued too: its
// run sends nothing and closes the rows the cancel left to the dead run (they stayed pending, with no
// waiting reason, until Asynq gave the task back). A campaign paused or scheduled, or whose send window is
// closed, waits for its own tasks.
func (h *Handler) followUp(ctx context.Context, c *campaign.Campaign, b int) {
	now := time.Now()
	if h.cfg.Redis == nil || !(c.State == campaign.StateRunning && c.Window.Open(now) || c.State == campaign.StateCancelled) {
		return
	}
	queued, err := enqueueFollowUp(ctx, asynq.NewClientFromRedisClient(h.cfg.Redis), c.ID, b, "swept", now)
	switch {
	case err != nil:
		h.log.Warn("batch of a run that died not queued again; its own task comes back later", "campaign_id", c.ID, "batch", b, "err", fmt.Sprint(err))
	case queued:
		h.log.Info("queued the batch of a run that died again, now", "campaign_id", c.ID, "batch", b)
	}
}

// followUpID is the task ID of a sweep's follow-up of batch b of campaign id queued at now.
func followUpID(id int64, b int, now time.Time) string { return followUpTaskID(id, b, "swept", now) }

// followUpTaskID is the task ID of a follow-up of batch b of campaign id, queued at now by kind (swept,
// resumed): "<campaign>:<batch>/<kind>-<unix second>". The DLQ and status read it as the batch's.
func followUpTaskID(id int64, b int, kind string, now time.Time) string {
	return TaskID(id, b) + "/" + kind + "-" + strconv.FormatInt(now.Unix(), 10)
}

// enqueueFollowUp queues a run of batch b of campaign id beside the batch's own task (followUpTaskID; the
// follow-ups of one second are one). It reports whether it queued one: false, with no error, when that
// second's is queued already.
func enqueueFollowUp(ctx context.Context, client *asynq.Client, id int64, b int, kind string, now time.Time) (bool, error) {
	task, err := NewBatchTask(id, b)
	if err != nil {
		return false, err
	}
	_, err = client.EnqueueContext(ctx, task, asynq.TaskID(followUpTaskID(id, b, kind, now)))
	if errors.Is(err, asynq.ErrTaskIDConflict) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("queue batch %d of campaign %d: %w", b, id, err)
	}
	return true, nil
}

const reasonDiedMidCall = "a worker stopped after claiming and before the provider answered; the message may have been sent"

// reasonNoAnswerInGrace is the reason of a claim a run that took a chunk over found with no answer and older
// than the in-flight grace (the longest the fleet noted: inFlightGrace): its worker stopped, or its call
// was still out past it. Either way the message may have been sent.
const reasonNoAnswerInGrace = "a worker stopped after claiming and before the provider answered, or its provider call outlasted the in-flight grace (3 × the longest --provider-timeout of the workers); the message may have been sent"

// sweepLoop runs Sweep every interval until ctx ends.
func (h *Handler) sweepLoop(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	orphans := map[string]time.Time{}
	var lookedForOrphans time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if time.Since(lookedForOrphans) >= orphanCheckEvery {
			lookedForOrphans = time.Now()
			if err := h.requeueOrphans(ctx, orphans); err != nil && ctx.Err() == nil {
				h.log.Warn("look for batches Asynq holds with nobody running them failed; it looks again shortly", "err", fmt.Sprint(err))
			}
		}
		n, err := h.Sweep(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			h.log.Warn("sweep of expired leases failed; it runs again shortly", "err", fmt.Sprint(err))
		case n > 0:
			h.log.Info("settled the chunks of batch runs that died", "recipients", n)
		}
	}
}

// orphanCheckEvery is how often a worker looks for batch tasks that Asynq holds active with nobody running
// them (requeueOrphans).
const orphanCheckEvery = 5 * time.Second

// requeueOrphans queues a follow-up run (followUp) of each batch whose task Asynq holds active with its
// lease run out. Its worker let the task go while Redis was away for longer than the lease (30 s), and the
// hand back to Asynq's retry queue was lost with Redis; or the worker died. Asynq gives such a task back by
// itself only a minute and a half after its lease ended (its recovery looks once a minute, at leases that
// ended 30 s before), and meanwhile the batch's recipients stay pending with nothing said about why. The
// follow-up runs the batch as soon as a worker is free; the task itself, when Asynq gives it back, finds the
// batch done or waits for the follow-up's lease, as any two runs of one batch do. followed holds the tasks
// this process followed up already (by task ID, with when), so that one orphan is followed up once.
func (h *Handler) requeueOrphans(ctx context.Context, followed map[string]time.Time) error {
	if h.cfg.Redis == nil {
		return nil
	}
	now := time.Now()
	for id, at := range followed {
		if now.Sub(at) > 5*time.Minute {
			delete(followed, id)
		}
	}
	type orphan struct {
		id    string
		c     int64
		batch int
	}
	var found []orphan
	insp := asynq.NewInspectorFromRedisClient(h.cfg.Redis)
	err := batchTasks(insp.ListActiveTasks, 0, func(t *asynq.TaskInfo, cid int64, batch int) {
		if _, done := followed[t.ID]; t.IsOrphaned && !done {
			found = append(found, orphan{t.ID, cid, batch})
		}
	})
	if err != nil {
		return err
	}
	campaigns := map[int64]*campaign.Campaign{}
	for _, o := range found {
		c, ok := campaigns[o.c]
		if !ok {
			if c, err = h.cfg.Store.Get(ctx, o.c); err != nil {
				if errors.Is(err, campaign.ErrNotFound) {
					followed[o.id] = now
					continue
				}
				return err
			}
			campaigns[o.c] = c
		}
		h.log.Info("Asynq holds a batch that nobody runs (its worker let it go while Redis was away, or died): queued again", "campaign_id", o.c, "batch", o.batch, "task_id", o.id)
		h.followUp(ctx, c, o.batch)
		followed[o.id] = now
	}
	return nil
}
