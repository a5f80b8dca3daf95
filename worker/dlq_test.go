package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/worker"
)

// jsonKeys lists the keys of a JSON object in the order they are written.
func jsonKeys(t *testing.T, v any) []string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, m := range regexp.MustCompile(`"([a-z_]+)":`).FindAllStringSubmatch(string(b), -1) {
		keys = append(keys, m[1])
	}
	return keys
}

func (e *opsEnv) archive(t *testing.T, c *campaign.Campaign, batches ...int) {
	t.Helper()
	for _, b := range batches {
		if err := e.insp.ArchiveTask(worker.Queue, worker.TaskID(c.ID, b)); err != nil {
			t.Fatal(err)
		}
	}
}

func (e *opsEnv) archived(t *testing.T) int {
	t.Helper()
	info, err := e.insp.GetQueueInfo(worker.Queue)
	if err != nil {
		t.Fatal(err)
	}
	return info.Archived
}

// The DLQ operations select one campaign's batches or every batch; a retry queues them with a fresh
// budget unless their campaign is over; a purge drops them.
func TestDLQListRetryPurge(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t, 3, nil)
	ctx := context.Background()
	a, b := e.launch(t, "a", 1), e.launch(t, "b", 1)
	e.archive(t, a, 0, 2)
	e.archive(t, b, 1)
	opts := func(id int64) worker.DLQOptions {
		return worker.DLQOptions{Store: e.store, Redis: e.rdb, CampaignID: id}
	}

	all, err := worker.ListDLQ(ctx, opts(0))
	if err != nil || len(all) != 3 {
		t.Fatalf("list of every batch: %+v, %v", all, err)
	}
	list, err := worker.ListDLQ(ctx, opts(a.ID))
	if err != nil || len(list) != 2 {
		t.Fatalf("list of campaign a: %+v, %v", list, err)
	}
	got := map[int]bool{}
	for _, en := range list {
		if en.CampaignID != a.ID || en.TaskID != worker.TaskID(a.ID, en.Batch) || en.MaxRetry != worker.MaxRetry {
			t.Errorf("entry %+v", en)
		}
		got[en.Batch] = true
	}
	if !got[0] || !got[2] {
		t.Fatalf("campaign a's entries %+v, want batches 0 and 2", list)
	}
	want := []string{"task_id", "campaign_id", "batch", "retried", "max_retry", "last_error", "last_failed_at"}
	if keys := jsonKeys(t, list[0]); !reflect.DeepEqual(keys, want) {
		t.Fatalf("dlq list --json keys %v, want %v", keys, want)
	}
	// Moved there by hand before they ever ran: no failure time (null, not the year 1).
	if b, _ := json.Marshal(list[0]); list[0].LastFailedAt != nil || !strings.Contains(string(b), `"last_failed_at":null`) {
		t.Fatalf("a batch that never failed: %s", b)
	}
	if _, err := worker.ListDLQ(ctx, opts(987654)); !errors.Is(err, campaign.ErrNotFound) {
		t.Fatalf("list of no campaign: %v, want ErrNotFound", err)
	}

	rep, err := worker.RetryDLQ(ctx, opts(a.ID))
	if err != nil || len(rep.Queued) != 2 || len(rep.Refused) != 0 {
		t.Fatalf("retry of campaign a: %+v, %v", rep, err)
	}
	if e.archived(t) != 1 || e.pending(t) != 5 {
		t.Fatalf("after retry: %d archived, %d pending; want 1 and 5", e.archived(t), e.pending(t))
	}

	// b is over: its batch is not retried, and a retry of b alone is refused with nothing moved.
	e.exec(t, `UPDATE campaigns SET state = 'cancelled' WHERE id = $1`, b.ID)
	_, err = worker.RetryDLQ(ctx, opts(b.ID))
	var refused *worker.DLQRefusedError
	if !errors.As(err, &refused) || !errors.Is(err, campaign.ErrWrongState) || refused.State != campaign.StateCancelled {
		t.Fatalf("retry of a cancelled campaign: %v", err)
	}
	if rep, err = worker.RetryDLQ(ctx, opts(0)); err != nil || len(rep.Queued) != 0 || len(rep.Refused) != 1 ||
		rep.Refused[0].CampaignID != b.ID || rep.Refused[0].State != campaign.StateCancelled {
		t.Fatalf("retry of everything: %+v, %v", rep, err)
	}
	if e.archived(t) != 1 {
		t.Fatalf("a refused retry moved the batch: %d archived", e.archived(t))
	}

	e.archive(t, a, 1)
	purged, err := worker.PurgeDLQ(ctx, opts(a.ID))
	if err != nil || len(purged.Dropped) != 1 || purged.Dropped[0].CampaignID != a.ID || e.archived(t) != 1 {
		t.Fatalf("purge of campaign a: %+v, %v; %d archived, want b's 1 left", purged, err, e.archived(t))
	}
	if purged, err = worker.PurgeDLQ(ctx, opts(0)); err != nil || len(purged.Dropped) != 1 || e.archived(t) != 0 {
		t.Fatalf("purge of everything: %+v, %v", purged, err)
	}
	if got := e.counts(t, a.ID); got.Pending != 3 {
		t.Fatalf("a purge changed the recipients: %+v", got)
	}
}

// The DLQ lists its batches by campaign and batch number: the archive gives them by task ID as text, so
// batch 10 came before batch 2.
func TestDLQListsBatchesInTheirOrder(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t, 12, nil)
	c := e.launch(t, "order", 1)
	e.archive(t, c, 10, 2, 0, 11, 1)
	list, err := worker.ListDLQ(context.Background(), worker.DLQOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID})
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	for _, en := range list {
		got = append(got, en.Batch)
	}
	if !reflect.DeepEqual(got, []int{0, 1, 2, 10, 11}) {
		t.Fatalf("dlq list's batches %v, want 0 1 2 10 11", got)
	}
}
