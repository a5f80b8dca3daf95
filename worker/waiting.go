package worker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
)

// The reasons a campaign is not moving (CampaignStatus.Waiting.Reason).
const (
	WaitScheduled          = "scheduled"             // its --at is still ahead
	WaitWindowClosed       = "window_closed"         // outside its --window
	WaitPaused             = "paused"                // campaignctl pause
	WaitProviderPaused     = "provider_paused"       // the provider asked every request to wait (Retry-After)
	WaitProviderDown       = "provider_down"         // the provider fails (nearly) every request: only probes go
	WaitProviderAuth       = "provider_auth"         // the provider refuses the account (credentials, sender)
	WaitOptInsUnreadable   = "opt_ins_unreadable"    // the audience cannot be read for the push/webhook opt-ins
	WaitRefusalsHeld       = "refusals_held"         // refusals posted while Postgres was away are still being recorded
	WaitNoWorker           = "no_worker"             // no worker is running
	WaitNoWorkerForChannel = "no_worker_for_channel" // no running worker sends the campaign's channel
	WaitRedisLostData      = "redis_lost_data"       // its batches are gone from the queue: resume
	WaitDLQ                = "dlq"                   // its remaining batches used up their retries
	WaitRetry              = "retry_backoff"         // every batch left waits out the back-off of a retry
)

// Waiting is what a campaign waits on (CampaignStatus.Waiting).
type Waiting = state.Waiting

// consentsFirst is what a redis_lost_data detail adds when the campaign's consents are older than its
// --max-consent-age: resume refuses them until they are brought up to date, so the sync comes first.
func consentsFirst(c *campaign.Campaign) string {
	if c.ConsentStale() == "" {
		return ""
	}
	return fmt.Sprintf(". First run campaignctl iys sync (or import a fresh complete İYS export): the campaign's consents are older than its --max-consent-age %v, and resume refuses them until they are brought up to date", c.MaxConsentAge)
}

// waitingOf says why campaign c, with counts and dlq batches in the dead-letter queue, is not moving, or
// nil when nothing holds it (it moves, or it is over). Each reason is read from where it lives: the
// campaign (scheduled, paused, window), the workers' heartbeats (no worker, none for the channel), the
// queue (batches gone, or all in the DLQ), the provider's shared pace and pause, and the notes workers
// leave when a batch waits on the provider's account. Since is when the wait began, where that is known:
// the campaign's start, pause or the window's close; the last heartbeat of a worker (of one for the
// channel) when that came after the campaign could send; when the provider went down or was paused; when
// the last batch in the DLQ failed; when Redis lost its data (lostSince).
func waitingOf(ctx context.Context, env *waitEnv, c *campaign.Campaign, counts campaign.Counts, dlq dlqBatches, now time.Time) (*Waiting, error) {
	if counts.Pending == 0 {
		return nil, nil
	}
	id := c.ID
	if c.State == campaign.StateCancelled {
		// Recipients of a cancelled campaign still pending: a worker closes them when it runs their batch,
		// unless none is queued (Redis lost its data under a cancel that left them to the workers): then
		// only a cancel run again closes them, and resume refuses a cancelled campaign.
		queued, err := env.queued(id)
		if err != nil || queued > 0 {
			return nil, err
		}
		since, err := env.lostSince(ctx, c)
		if err != nil {
			return nil, err
		}
		return &Waiting{Reason: WaitRedisLostData, Detail: fmt.Sprintf("the campaign is cancelled, but %d of its recipients are not closed yet and none of its batches is queued for a worker to close them (Redis lost its data, or they are in the dead-letter queue): run campaignctl cancel %d again, which closes them (nothing is sent)", counts.Pending, id),
			Since: since}, nil
	}
	if c.State.Over() {
		return nil, nil
	}
	// Paused first: a scheduled campaign that was paused waits for its resume, not for its start.
	if c.State == campaign.StatePaused {
		w := &Waiting{Reason: WaitPaused, Detail: fmt.Sprintf("by campaignctl pause; campaignctl resume %d goes on, campaignctl cancel %d ends it", id, id)}
		if c.StateSince != nil {
			w.Since = utc(*c.StateSince)
		}
		return w, nil
	}
	rdb := env.rdb
	// First: after Redis lost its data, the workers' heartbeats are gone for a few seconds too, and
	// starting a worker would not help; resume does.
	queued, err := env.queued(id)
	if err != nil {
		return nil, err
	}
	lost := func(detail string) (*Waiting, error) {
		since, err := env.lostSince(ctx, c)
		if err != nil {
			return nil, err
		}
		return &Waiting{Reason: WaitRedisLostData, Detail: detail + consentsFirst(c), Since: since}, nil
	}
	if queued == 0 && dlq.n == 0 {
		// A launch that stopped (killed, Redis or Postgres away) between its plan's commit and its
		// enqueue: no batch was ever handed to the queue, and Redis lost nothing.
		if never, err := env.neverQueued(ctx, c); err != nil {
			return nil, err
		} else if never {
			return &Waiting{Reason: WaitRedisLostData, Detail: fmt.Sprintf("the launch stopped before it queued any of the campaign's %s (Redis itself lost nothing; a batch missing from the queue is reported as redis_lost_data whatever took it): run campaignctl resume %d, which queues them",
				counted(c.Batches, "batch", "batches"), id) + consentsFirst(c)}, nil
		}
	}
	if c.StartAt != nil && c.StartAt.After(now) {
		if queued == 0 && dlq.n == 0 {
			// Its start would come and nothing would happen: said now, not at the start.
			return lost(fmt.Sprintf("none of the campaign's batches is queued for its start at %s: Redis lost its data (restarted empty, flushed, failed over), or the launch stopped before it queued them, and it would not start. Run campaignctl resume %d",
				c.StartAt.UTC().Format(time.RFC3339), id))
		}
		return &Waiting{Reason: WaitScheduled, Detail: fmt.Sprintf("starts at %s (launch --at)", c.StartAt.UTC().Format(time.RFC3339)),
			Since: utc(c.CreatedAt), Until: utc(*c.StartAt)}, nil
	}
	if queued == 0 && dlq.n == 0 {
		return lost(fmt.Sprintf("%d recipients pending and none of the campaign's batches is queued: Redis lost its data (restarted empty, flushed, failed over), or the batches were dropped from the dead-letter queue (dlq purge), or a launch or resume stopped before it queued them. Run campaignctl resume %d", counts.Pending, id))
	}
	// Some batches queued and others not (a launch killed while it queued them, tasks deleted by hand):
	// the workers send the queued ones and the campaign stops short of the rest.
	places, known, err := env.placesOf(ctx, id, dlq)
	if err != nil {
		return nil, err
	}
	if places.unqueued > 0 {
		return lost(fmt.Sprintf("%s with pending recipients neither queued nor in the dead-letter queue: the launch stopped before it queued them, or Redis lost them, or they were deleted by hand. Run campaignctl resume %d", counted(places.unqueued, "batch", "batches"), id))
	}
	// The whole queue paused in asynqmon (or Inspector.PauseQueue): no worker takes a batch of any
	// campaign, whatever else holds. campaignctl resume does not undo it: the queue is everyone's.
	if paused, err := env.queuePaused(); err != nil {
		return nil, err
	} else if paused {
		return &Waiting{Reason: WaitPaused, Detail: fmt.Sprintf("the Asynq queue %s is paused (asynqmon's Pause): no worker takes a batch of any campaign until it is unpaused there (campaignctl ui: Queues, %s, Resume)", Queue, Queue)}, nil
	}
	// A closed window before the workers: it is a wait the campaign was made for, and no worker would make
	// it move (under `workers --min 0` there is none until its batches are due again, and the reason
	// flipped between the two).
	if !c.Window.Open(now) {
		next := c.Window.NextOpen(now)
		since := c.Window.LastClose(now)
		if since.Before(c.CreatedAt) {
			since = c.CreatedAt // launched while the window was closed
		}
		return &Waiting{Reason: WaitWindowClosed, Detail: fmt.Sprintf("outside its send window %s; it goes on at %s", c.Window, windowTime(c.Window, next)),
			Since: utc(since), Until: utc(next)}, nil
	}
	// Every batch with pending recipients in the DLQ: nothing moves until they are retried, whatever the
	// workers (it said no_worker under `workers --min 0`, which rightly runs none for the DLQ).
	moving := queued
	if known && dlq.n > 0 {
		// Batches in the DLQ beside tasks in the queue: those may be a dead worker's, of batches done (a
		// worker killed mid-batch leaves its task active until Asynq takes it back, a minute later). Only
		// the queued batches that still hold pending recipients move the campaign.
		moving = places.queued
	}
	if moving == 0 {
		w := &Waiting{Reason: WaitDLQ, Detail: dlq.detail(id)}
		if !dlq.last.IsZero() {
			w.Since = utc(dlq.last)
		}
		return w, nil
	}
	workers, err := env.workers(ctx)
	if err != nil {
		return nil, err
	}
	// A wait for a worker began when the campaign could send, or when the last worker that could send it
	// was last seen, whichever came later (the sightings are read only for such a wait).
	since := func(field string) (*time.Time, error) {
		seen, err := env.seen(ctx)
		if err != nil {
			return nil, err
		}
		t := c.CreatedAt
		if c.StartedAt != nil {
			t = *c.StartedAt
		}
		if c.StartAt != nil && c.StartAt.After(t) {
			t = *c.StartAt // launch --at, not started by a worker yet
		}
		if c.StateSince != nil && c.StateSince.After(t) {
			t = *c.StateSince // resumed
		}
		if s, ok := seen[field]; ok && s.After(t) {
			t = s
		}
		return utc(t), nil
	}
	waitWorker := func(reason, detail, field string) (*Waiting, error) {
		t, err := since(field)
		if err != nil {
			return nil, err
		}
		return &Waiting{Reason: reason, Detail: detail, Since: t}, nil
	}
	if len(workers) == 0 {
		return waitWorker(WaitNoWorker, "no worker is running: start campaignctl worker (or campaignctl workers)", state.SeenAny)
	}
	ch := c.Channel.Spec()
	provider, fallback := "", ""
	commercialOK, failedOver := false, false
	for _, w := range workers {
		if p := w.Providers[string(c.Channel)]; p != "" {
			if provider == "" {
				provider = p
			}
			if fb := w.Fallbacks[string(c.Channel)]; fb != "" && fallback == "" {
				fallback = fb
			}
			commercialOK = commercialOK || w.Commercial[string(c.Channel)]
			failedOver = failedOver || w.FailedOver[string(c.Channel)]
		}
	}
	if provider == "" {
		return waitWorker(WaitNoWorkerForChannel, fmt.Sprintf("%s, none sends %s: configure its provider on one (campaignctl worker --help)", counted(len(workers), "worker runs", "workers run"), ch.Title),
			string(c.Channel))
	}
	if c.OneClickUnsubscribe() && !commercialOK {
		return waitWorker(WaitNoWorkerForChannel, "no running worker can make the one-click unsubscribe links of a commercial e-mail: set WEBHOOKS_PUBLIC_URL and UNSUBSCRIBE_SECRET on the workers",
			string(c.Channel)+state.SeenCommercial)
	}
	notes, err := state.Waits(ctx, rdb, id)
	if err != nil {
		return nil, err
	}
	// These two are notes of one worker's batches (its credentials, its access to the audience): while
	// another worker's sends move the campaign, it does not wait on them. It said provider_auth between
	// the good worker's sends in a fleet half through a credentials change.
	if !movedLately(ctx, rdb, id, now) {
		if w, ok := notes[WaitProviderAuth]; ok {
			return &w, nil
		}
		if w, ok := notes[WaitOptInsUnreadable]; ok {
			return &w, nil
		}
	}
	if w, ok := notes[WaitRefusalsHeld]; ok {
		return &w, nil
	}
	// Redis lost its data and the workers are writing the recent sends' frequency marks back: the batches
	// are queued (retrying each second), and nothing is sent until it is done.
	if es, err := env.redisEpoch(ctx); err != nil {
		return nil, err
	} else if es.MarksPending() && env.marksToWriteBack(ctx) {
		return lost("Redis lost its data (restarted empty, flushed, failed over): the frequency marks of the recent sends are being written back from Postgres before anything is sent; the batches go on by themselves")
	}
	// down says whether a provider fails (nearly) every request by every worker's answers, and since when.
	down := func(name string) (bool, *time.Time) {
		pace, _ := rdb.HMGet(ctx, state.PaceKey(state.ProviderBucket(name)), "down", "downat").Result()
		if len(pace) == 2 && pace[0] == "1" {
			return true, unixMilli(pace[1])
		}
		return false, nil
	}
	firstDown, downSince := down(provider)
	if fallback != "" && (firstDown || failedOver) {
		// The sends go through the fallback (the first gets a probe now and then): the campaign waits
		// only if that fails too.
		if fbDown, fbSince := down(fallback); fbDown {
			if downSince == nil || fbSince != nil && fbSince.After(*downSince) {
				downSince = fbSince
			}
			return &Waiting{Reason: WaitProviderDown, Detail: fmt.Sprintf("%s and its fallback %s fail (nearly) every request: sends wait, one probe a second over every worker; nobody's retries are used", provider, fallback),
				Since: downSince}, nil
		}
		provider = fallback // moving through it; a pause of its own stops it
	} else if firstDown {
		return &Waiting{Reason: WaitProviderDown, Detail: fmt.Sprintf("%s fails (nearly) every request: sends wait, one probe a second over every worker; nobody's retries are used", provider),
			Since: downSince}, nil
	}
	bucket := state.ProviderBucket(provider)
	if pttl, err := rdb.PTTL(ctx, state.PauseKey(bucket)).Result(); err == nil && pttl > 0 {
		began, _ := rdb.Get(ctx, state.PauseKey(bucket)).Result()
		return &Waiting{Reason: WaitProviderPaused, Detail: fmt.Sprintf("%s asked every request to wait (Retry-After)", provider), Since: unixMilli(began), Until: utc(now.Add(pttl))}, nil
	}
	// Between two pauses of a run (a provider that answers 429 to every request is paused a second at a
	// time): still paused, since the run began. status said nothing for half of such a minute, and each
	// pause's since began anew.
	if began, err := rdb.Get(ctx, state.PauseRunKey(bucket)).Result(); err == nil {
		return &Waiting{Reason: WaitProviderPaused, Detail: fmt.Sprintf("%s asks every request to wait (Retry-After, 429s): paused again and again, a moment apart", provider), Since: unixMilli(began)}, nil
	}
	// Every batch left waits out a retry's back-off (recipients the provider failed, a run that failed),
	// and the next is not a moment away (a batch handed back for a second between two chunks): nothing
	// moves until then. status said nothing for a minute of it.
	if r, ok := env.allRetrying(id); ok && r.next.Sub(now) >= retryWaitShown {
		w := &Waiting{Reason: WaitRetry, Detail: fmt.Sprintf("every batch left (%s) waits out the back-off of a retry after failures (the provider's errors for some recipients, or a run that failed; campaignctl dlq list shows the errors of batches that used up their retries); the next runs at %s",
			counted(queued, "batch", "batches"), r.next.UTC().Format(time.RFC3339)), Until: utc(r.next)}
		if !r.last.IsZero() {
			w.Since = utc(r.last)
		}
		return w, nil
	}
	return nil, nil
}

// retryWaitShown is how far off the next retry of a campaign whose every batch waits to be retried must
// be for status to say so: a batch handed back for a second (a hold between two chunks, a service's
// blip) is a campaign that moves.
const retryWaitShown = 2 * time.Second

// movingLately is how recently a recipient of a campaign must have settled for the campaign to move
// (state.ProgressMovedAt): longer than a run at a low cap takes between two chunks, short beside the two
// minutes a worker's waiting note lasts.
const movingLately = 30 * time.Second

// movedLately says whether a worker settled one of campaign id's recipients in the last movingLately.
func movedLately(ctx context.Context, rdb redis.UniversalClient, id int64, now time.Time) bool {
	ms, err := rdb.HGet(ctx, state.ProgressKey(id), state.ProgressMovedAt).Int64()
	return err == nil && now.Sub(time.UnixMilli(ms)) < movingLately
}

// windowTime is t as the window's own clock reads it, the zone it was given in (the detail is read next to
// since and until, which status shows in --tz and JSON in UTC).
func windowTime(w campaign.Window, t time.Time) string {
	if w.Zone != nil {
		t = t.In(w.Zone)
	}
	return t.Format("2006-01-02 15:04 MST")
}

// unixMilli reads a time Redis holds as unix milliseconds (a pause's beginning, a pace's fall); nil when v
// holds none (a missing field, or a key written by an earlier version: "1").
func unixMilli(v any) *time.Time {
	s, _ := v.(string)
	ms, _ := strconv.ParseInt(s, 10, 64)
	if ms < 1e12 { // before 2001: not a time
		return nil
	}
	return utc(time.UnixMilli(ms))
}

func utc(t time.Time) *time.Time {
	u := t.UTC()
	return &u
}

// waitEnv is what waitingOf reads that is the same for every campaign: the workers' heartbeats and the
// queue, each read once however many campaigns a status lists.
type waitEnv struct {
	rdb         redis.UniversalClient
	store       *campaign.Store // nil: heartbeats alone say which workers live
	workerList  []state.WorkerInfo
	lastSeen    map[string]time.Time
	byCampaign  map[int64]map[int]bool // the batches in the queue, by campaign
	retries     map[int64]retrying     // the campaigns' batches waiting to be retried, read with byCampaign
	haveWorkers bool
	paused      *bool // the queue's pause, read once
	epoch       *state.EpochState
}

// marksToWriteBack says whether the workers have frequency marks to write back from Postgres after Redis
// lost its data: a new Redis beside a database with no recent send (a first setup) lost nothing, and its
// first moments are not reported as a loss. Without the store, or when Postgres cannot say, it is taken
// that there are.
func (e *waitEnv) marksToWriteBack(ctx context.Context) bool {
	if e.store == nil {
		return true
	}
	any, err := e.store.HasRecentSends(ctx)
	return err != nil || any
}

// redisEpoch returns Redis's epoch, its marks' epoch and its time (state.ReadEpoch), read once.
func (e *waitEnv) redisEpoch(ctx context.Context) (state.EpochState, error) {
	if e.epoch == nil {
		es, err := state.ReadEpoch(ctx, e.rdb)
		if err != nil {
			return es, err
		}
		e.epoch = &es
	}
	return *e.epoch, nil
}

// neverQueued says whether none of campaign c's batches was ever handed to the queue (their enqueued_at
// unset): its launch stopped before it queued them. False without the store.
func (e *waitEnv) neverQueued(ctx context.Context, c *campaign.Campaign) (bool, error) {
	if e.store == nil || c.Batches == 0 {
		return false, nil
	}
	never, err := e.store.PendingBatches(ctx, c.ID, true)
	if err != nil {
		return false, err
	}
	return len(never) == c.Batches, nil
}

// lostSince is when campaign c's batches went missing from the queue, where that is known: when a process
// first saw that Redis had lost its data (the epoch's renewal), if that came after the launch. A launch
// that stopped before it queued its batches, or batches dropped from the dead-letter queue or deleted by
// hand, leave no time in Redis: nil.
func (e *waitEnv) lostSince(ctx context.Context, c *campaign.Campaign) (*time.Time, error) {
	es, err := e.redisEpoch(ctx)
	if err != nil || es.Since == nil || !es.Since.After(c.CreatedAt) {
		return nil, err
	}
	if c.StateSince != nil && !es.Since.After(*c.StateSince) {
		// Redis lost its data before the campaign's last change of state (a resume, which queued its
		// batches again): that loss is not why they are missing now (a resume stopped before it queued
		// them, say), and nothing says when they went.
		return nil, nil
	}
	return utc(*es.Since), nil
}

// seen returns when workers were last seen (state.LastSeen), read once.
func (e *waitEnv) seen(ctx context.Context) (map[string]time.Time, error) {
	if e.lastSeen == nil {
		m, err := state.LastSeen(ctx, e.rdb)
		if err != nil {
			return nil, err
		}
		e.lastSeen = m
	}
	return e.lastSeen, nil
}

func newWaitEnv(rdb redis.UniversalClient, store *campaign.Store) *waitEnv {
	return &waitEnv{rdb: rdb, store: store}
}

// holdGrace is how long after its start a worker's heartbeat counts without its liveness lock: a worker
// publishes its first beat before it has taken the lock.
const holdGrace = 5 * time.Second

// workers returns the workers that live: those whose heartbeat has not expired, less those whose liveness
// lock in Postgres is gone (a process killed outright: its heartbeat lasts up to state.WorkerTTL more).
func (e *waitEnv) workers(ctx context.Context) ([]state.WorkerInfo, error) {
	if !e.haveWorkers {
		ws, err := state.Workers(ctx, e.rdb)
		if err != nil {
			return nil, err
		}
		// The workers whose lock is to be looked at: those with one, started long enough ago to hold it.
		checked := map[int64]bool{}
		for _, w := range ws {
			if w.Holder != 0 && time.Since(w.Started) > holdGrace {
				checked[w.Holder] = true
			}
		}
		if e.store != nil && len(checked) > 0 {
			live, err := e.store.LiveHolders(ctx, slices.Collect(maps.Keys(checked)))
			if err != nil {
				return nil, err
			}
			ws = slices.DeleteFunc(ws, func(w state.WorkerInfo) bool { return checked[w.Holder] && !live[w.Holder] })
		}
		e.workerList, e.haveWorkers = ws, true
	}
	return e.workerList, nil
}

// queued counts the campaign's batches waiting in the queue, running, scheduled or to retry (the queue is
// read once, for every campaign).
func (e *waitEnv) queued(campaignID int64) (int, error) {
	bs, err := e.queuedBatches(campaignID)
	return len(bs), err
}

// queuedBatches is the set of the campaign's batches in the queue (see queued).
func (e *waitEnv) queuedBatches(campaignID int64) (map[int]bool, error) {
	if e.byCampaign == nil {
		m, r, err := queuedByCampaign(e.rdb)
		if err != nil {
			return nil, err
		}
		e.byCampaign, e.retries = m, r
	}
	return e.byCampaign[campaignID], nil
}

// retrying is what the queue says of a campaign's tasks waiting to be retried: whether any of its tasks is
// pending, running or scheduled instead (moving), the earliest next run, and the latest failure that put
// one there.
type retrying struct {
	moving     bool
	next, last time.Time
}

// allRetrying says when every batch campaign id has in the queue waits to be retried (and, in r, until
// and since when); how many they are is len(queuedBatches).
func (e *waitEnv) allRetrying(id int64) (r retrying, ok bool) {
	if _, err := e.queuedBatches(id); err != nil {
		return r, false
	}
	r, ok = e.retries[id]
	return r, ok && !r.moving
}

// pendingPlaces is where the campaign's batches with pending recipients are: queued (waiting, running,
// scheduled or to retry), or neither queued nor in the dead-letter queue (unqueued: nothing sends them
// until resume queues them). Those in the DLQ are the rest.
type pendingPlaces struct{ queued, unqueued int }

// placesOf reads the campaign's batches with pending recipients (one query) and says where they are
// (pendingPlaces); known is false without a store.
func (e *waitEnv) placesOf(ctx context.Context, campaignID int64, dlq dlqBatches) (p pendingPlaces, known bool, err error) {
	if e.store == nil {
		return p, false, nil
	}
	bs, err := e.queuedBatches(campaignID)
	if err != nil {
		return p, false, err
	}
	pending, err := e.store.PendingBatches(ctx, campaignID, false)
	if err != nil {
		return p, false, err
	}
	for _, b := range pending {
		switch {
		case bs[b]:
			p.queued++
		case !dlq.tasks[b]:
			p.unqueued++
		}
	}
	return p, true, nil
}

// queuePaused reports whether the queue is paused (read once).
func (e *waitEnv) queuePaused() (bool, error) {
	if e.paused == nil {
		p, err := QueuePaused(e.rdb)
		if err != nil {
			return false, err
		}
		e.paused = &p
	}
	return *e.paused, nil
}

// QueuePaused reports whether the campaigns' Asynq queue is paused (asynqmon's Pause,
// Inspector.PauseQueue): while it is, no worker takes a batch of any campaign.
func QueuePaused(rdb redis.UniversalClient) (bool, error) {
	info, err := asynq.NewInspectorFromRedisClient(rdb).GetQueueInfo(Queue)
	if err != nil {
		if errors.Is(err, asynq.ErrQueueNotFound) || strings.Contains(err.Error(), "does not exist") {
			return false, nil
		}
		return false, fmt.Errorf("read the queue: %w", err)
	}
	return info.Paused, nil
}

// queuedByCampaign lists the queue's batches waiting, running, scheduled or to retry, by campaign (a batch
// once, whatever tasks it has).
func queuedByCampaign(rdb redis.UniversalClient) (map[int64]map[int]bool, map[int64]retrying, error) {
	insp := asynq.NewInspectorFromRedisClient(rdb)
	const pageSize = 1000
	out := map[int64]map[int]bool{}
	retries := map[int64]retrying{}
	lists := []func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){insp.ListPendingTasks, insp.ListActiveTasks, insp.ListScheduledTasks, insp.ListRetryTasks}
	for i, list := range lists {
		retry := i == len(lists)-1
		for page := 1; ; page++ {
			tasks, err := list(Queue, asynq.Page(page), asynq.PageSize(pageSize))
			if err != nil {
				if errors.Is(err, asynq.ErrQueueNotFound) || strings.Contains(err.Error(), "does not exist") {
					break
				}
				return nil, nil, fmt.Errorf("read the queue: %w", err)
			}
			for _, t := range tasks {
				cid, b, ok := parseTaskID(t.ID)
				if !ok {
					continue
				}
				if out[cid] == nil {
					out[cid] = map[int]bool{}
				}
				out[cid][b] = true
				r := retries[cid]
				switch {
				case !retry:
					r.moving = true
				case r.next.IsZero() || t.NextProcessAt.Before(r.next):
					r.next = t.NextProcessAt
				}
				if retry && t.LastFailedAt.After(r.last) {
					r.last = t.LastFailedAt
				}
				retries[cid] = r
			}
			if len(tasks) < pageSize {
				break
			}
		}
	}
	return out, retries, nil
}

// Heartbeat publishes info (what this worker sends) now and every state.WorkerTTL/3 until ctx ends, and
// removes it then: campaignctl status reads the heartbeats to tell "no worker" and "no worker for the
// channel" apart from a campaign that moves. Between beats it looks every state.WorkerLook whether the
// heartbeat is still there, and writes it again at once when Redis lost it with its data. A failed write
// is retried at the next look. Each update, if any, brings info up to date before a beat
// (Handler.NoteFailover).
func Heartbeat(ctx context.Context, rdb redis.UniversalClient, info state.WorkerInfo, update ...func(*state.WorkerInfo)) {
	if info.Started.IsZero() {
		info.Started = time.Now().UTC()
	}
	t := time.NewTicker(state.WorkerLook)
	defer t.Stop()
	var last time.Time // the last beat written
	for {
		if last.IsZero() || time.Since(last) >= state.WorkerTTL/3-state.WorkerLook/2 || !state.WorkerPublished(ctx, rdb, info.Owner) {
			for _, u := range update {
				u(&info)
			}
			if state.PublishWorker(ctx, rdb, info) == nil {
				last = time.Now()
			}
		}
		select {
		case <-ctx.Done():
			rm, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			state.RemoveWorker(rm, rdb, info.Owner) //nolint:errcheck // it expires anyway
			cancel()
			return
		case <-t.C:
		}
	}
}

// counted is n with the words for one (one) or for any other count (many): "1 batch waits", "3 batches wait".
func counted(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}
