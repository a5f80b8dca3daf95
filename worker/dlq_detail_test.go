package worker

import (
	"strings"
	"testing"
	"time"
)

// The DLQ wait names the cause: the error of the batch that failed last (a batch that outlived its
// consents' age says to run `iys sync`), not only that batches wait there. Batches moved there by hand
// have none, and the detail says what it said before.
func TestTheDLQWaitSaysTheLastBatchsError(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *time.Time { x := t0.Add(d); return &x }
	var d dlqBatches
	d.add(DLQEntry{Batch: 0, LastError: "provider refused the account", LastFailedAt: at(0)})
	d.add(DLQEntry{Batch: 1, LastError: "the İYS consents of campaign 7 were brought up to date ... Run `campaignctl iys sync`", LastFailedAt: at(time.Minute)})
	d.add(DLQEntry{Batch: 2, LastError: "older", LastFailedAt: at(30 * time.Second)})
	d.add(DLQEntry{Batch: 3}) // archived by hand
	got := d.detail(7)
	if d.n != 4 || !strings.Contains(got, "4 batches wait") || !strings.HasSuffix(got, "failed with: the İYS consents of campaign 7 were brought up to date ... Run `campaignctl iys sync`") {
		t.Errorf("detail %q (n %d); want 4 batches and the last failure's error", got, d.n)
	}
	var byHand dlqBatches
	byHand.add(DLQEntry{Batch: 0})
	if got := byHand.detail(7); strings.Contains(got, "failed with") || !strings.Contains(got, "dlq retry --campaign 7") {
		t.Errorf("detail of batches archived by hand %q; want no error, and the retry", got)
	}
}
