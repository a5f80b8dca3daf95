package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"

	"github.com/campaignctl/campaignctl/campaign"
)

// TaskBatch is the Asynq task type of one campaign batch.
const TaskBatch = "campaign:batch"

// Queue is the Asynq queue campaign batches go to.
const Queue = "campaigns"

// BatchPayload is the whole payload of a batch task: recipients are read from Postgres.
type BatchPayload struct {
	CampaignID int64 `json:"campaign_id"`
	Batch      int   `json:"batch"`
}

// TaskID is the deterministic Asynq task ID of a batch, so that enqueueing it twice is a no-op.
func TaskID(campaignID int64, batch int) string { return fmt.Sprintf("%d:%d", campaignID, batch) }

// MaxRetry is how many times a failing batch is retried before it is archived (the DLQ). With the
// exponential back-off capped at 10 minutes this spans several hours.
const MaxRetry = 25

// BatchTimeout bounds one run of a batch; a batch that waits on a slow rate cap hands what is left back to
// the queue before it.
const BatchTimeout = time.Hour

// NewBatchTask builds the task for one batch.
func NewBatchTask(campaignID int64, batch int) (*asynq.Task, error) {
	payload, err := json.Marshal(BatchPayload{CampaignID: campaignID, Batch: batch})
	if err != nil {
		return nil, err
	}
	return asynq.NewTask(TaskBatch, payload,
		asynq.TaskID(TaskID(campaignID, batch)),
		asynq.Queue(Queue),
		asynq.MaxRetry(MaxRetry),
		asynq.Timeout(BatchTimeout),
	), nil
}

// Enqueue hands the campaign's batches that still have pending recipients to the queue (with onlyNew,
// only those never enqueued). A batch already queued, retrying or archived keeps its task: the task ID
// makes the second enqueue a no-op. Tasks of a campaign that starts later, or whose send window is
// closed now, are scheduled for that moment. It returns how many tasks were newly enqueued and how many
// were already there.
func Enqueue(ctx context.Context, client *asynq.Client, store *campaign.Store, c *campaign.Campaign, onlyNew bool) (added, existing int, err error) {
	campaignID := c.ID
	at := time.Now()
	if c.StartAt != nil && c.StartAt.After(at) {
		at = *c.StartAt
	}
	at = c.Window.NextOpen(at)
	batches, err := store.PendingBatches(ctx, campaignID, onlyNew)
	if err != nil {
		return 0, 0, err
	}
	// The batches handed over are marked as they go, a group at a time, not only at the end: a launch
	// killed halfway leaves the ones it queued marked (status and resume tell them from the others).
	done := make([]int, 0, min(len(batches), markEvery))
	mark := func() error {
		if len(done) == 0 {
			return nil
		}
		err := store.MarkEnqueued(context.WithoutCancel(ctx), campaignID, done)
		done = done[:0]
		return err
	}
	defer func() {
		if merr := mark(); merr != nil && err == nil {
			err = merr
		}
	}()
	for _, b := range batches {
		task, err := NewBatchTask(campaignID, b)
		if err != nil {
			return added, existing, err
		}
		_, err = client.EnqueueContext(ctx, task, asynq.ProcessAt(at))
		switch {
		case err == nil:
			added++
		case errors.Is(err, asynq.ErrTaskIDConflict):
			existing++
		default:
			return added, existing, fmt.Errorf("enqueue batch %d of campaign %d: %w", b, campaignID, err)
		}
		if done = append(done, b); len(done) == markEvery {
			if err := mark(); err != nil {
				return added, existing, err
			}
		}
	}
	return added, existing, nil
}

// markEvery is how many batches Enqueue hands to the queue between two marks in Postgres.
const markEvery = 200
