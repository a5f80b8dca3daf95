package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/supervisor"
)

// QueueObserver is what the worker supervisor sizes its pool by: the batch queue read through Asynq's
// Inspector, the running campaigns and their caps from Postgres, and their provider calls so far from
// their progress counters. It implements supervisor.Observer.
type QueueObserver struct {
	Store *campaign.Store
	Redis redis.UniversalClient
	// Caps is each channel's provider cap a second (0 = none): in messages, or in SMS segments for the
	// channels CapsInSegments names.
	Caps map[string]float64
	// CapsInSegments names the channels whose provider cap counts SMS segments (Twilio's does): a running
	// campaign's messages take the segments its progress counters say they have taken on average.
	CapsInSegments map[string]bool
	// Lookahead is how far ahead a scheduled or retrying task counts as due.
	Lookahead time.Duration
	// DueLimit stops counting due tasks where more could not change the decision (max × concurrency).
	DueLimit int
	// Name, when set, is this supervisor's name among those sizing pools from the same queue
	// (state.Supervisors); a look not renewed within Alive no longer counts. Empty: it is taken to be
	// alone.
	Name  string
	Alive time.Duration
	// JoinWait: the first look, having counted this supervisor in, waits this long and counts again, so
	// that supervisors started together (a deployment that starts every machine at once) count each other
	// from their first decision instead of each starting a whole pool until its next look.
	JoinWait time.Duration

	joined bool
}

var _ supervisor.Observer = (*QueueObserver)(nil)

// Observe implements supervisor.Observer.
func (q *QueueObserver) Observe(ctx context.Context) (supervisor.Observation, error) {
	o := supervisor.Observation{At: time.Now()}
	all, err := q.Store.ListIn(ctx, campaign.StateRunning, campaign.StatePaused)
	if err != nil {
		return o, err
	}
	// A paused campaign's batches come back every 30 s only to find it paused, and go back to wait: they
	// call for no worker. Counted, they made the supervisor start a worker for each such return under
	// --min 0, and stop it again.
	paused := map[int64]bool{}
	for _, c := range all {
		if c.State == campaign.StatePaused {
			paused[c.ID] = true
		}
	}
	waits := func(t *asynq.TaskInfo) bool {
		var p BatchPayload
		return len(paused) > 0 && t.Type == TaskBatch && json.Unmarshal(t.Payload, &p) == nil && paused[p.CampaignID]
	}
	insp := asynq.NewInspectorFromRedisClient(q.Redis)
	queues, err := insp.Queues()
	if err != nil {
		return o, fmt.Errorf("list queues: %w", err)
	}
	// Before the first launch the queue does not exist yet: nothing is queued.
	if slices.Contains(queues, Queue) {
		info, err := insp.GetQueueInfo(Queue)
		if err != nil {
			return o, fmt.Errorf("queue %s: %w", Queue, err)
		}
		o.Pending, o.Active, o.Latency, o.Paused = info.Pending, info.Active, info.Latency, info.Paused
		horizon := o.At.Add(q.Lookahead)
		if info.Scheduled > 0 {
			n, err := countDue(insp.ListScheduledTasks, horizon, q.DueLimit, waits)
			if err != nil {
				return o, fmt.Errorf("scheduled tasks: %w", err)
			}
			o.Due += n
		}
		if info.Retry > 0 && o.Due < q.DueLimit {
			n, err := countDue(insp.ListRetryTasks, horizon, q.DueLimit-o.Due, waits)
			if err != nil {
				return o, fmt.Errorf("retry tasks: %w", err)
			}
			o.Due += n
		}
	}

	if o.Beating, err = beatingHere(ctx, q.Redis); err != nil {
		return o, err
	}
	o.Supervisors = 1
	if q.Name != "" {
		if !q.joined && q.JoinWait > 0 {
			if _, err := state.Supervisors(ctx, q.Redis, q.Name, q.Alive); err != nil {
				return o, err
			}
			select {
			case <-time.After(q.JoinWait):
			case <-ctx.Done():
				return o, ctx.Err()
			}
		}
		if o.Supervisors, err = state.Supervisors(ctx, q.Redis, q.Name, q.Alive); err != nil {
			return o, err
		}
		q.joined = true
	}
	var running []supervisor.Running
	var ids []int64
	for _, c := range all {
		if c.State == campaign.StateRunning {
			ids = append(ids, c.ID)
		}
	}
	if len(ids) == 0 {
		return o, nil
	}
	progress, err := providerProgress(ctx, q.Redis, ids)
	if err != nil {
		return o, err
	}
	o.Sends = make(map[int64]int64, len(ids))
	for _, c := range all {
		if c.State != campaign.StateRunning {
			continue
		}
		p := progress[c.ID]
		o.Sends[c.ID] = p.calls
		r := supervisor.Running{Provider: string(c.Channel), Rate: c.Rate}
		if q.CapsInSegments[string(c.Channel)] {
			r.PerMessage = p.perMessage()
		}
		running = append(running, r)
	}
	o.RateCap, o.Uncapped = supervisor.RateCap(running, q.Caps)
	return o, nil
}

// Leave takes this supervisor out of those sizing pools from the queue, when it stops: the others take its
// share at their next look instead of after Alive.
func (q *QueueObserver) Leave(ctx context.Context) error {
	if q.Name == "" {
		return nil
	}
	return state.LeaveSupervisors(ctx, q.Redis, q.Name)
}

// beatingHere returns the process IDs of the workers on this machine whose heartbeat is live.
func beatingHere(ctx context.Context, rdb redis.UniversalClient) (map[int]bool, error) {
	ws, err := state.Workers(ctx, rdb)
	if err != nil {
		return nil, err
	}
	beating := map[int]bool{}
	for _, w := range ws {
		if pid, ok := state.LocalPID(w.Owner); ok {
			beating[pid] = true
		}
	}
	return beating, nil
}

// countDue counts the tasks of a sorted set (scheduled or retry, earliest first) that are due by horizon, up
// to limit, but those that skip says need no worker.
func countDue(list func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error), horizon time.Time, limit int, skip func(*asynq.TaskInfo) bool) (int, error) {
	const pageSize = 100
	n := 0
	for page := 1; n < limit; page++ {
		tasks, err := list(Queue, asynq.PageSize(pageSize), asynq.Page(page))
		if errors.Is(err, asynq.ErrQueueNotFound) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		for _, t := range tasks {
			if t.NextProcessAt.After(horizon) || n >= limit {
				return n, nil
			}
			if !skip(t) {
				n++
			}
		}
		if len(tasks) < pageSize {
			break
		}
	}
	return n, nil
}
