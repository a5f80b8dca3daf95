package main

import (
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/worker"
)

// ATTEMPTS in dlq list counts the runs: a batch whose retries were used up ran one more time than it was
// retried; one moved to the DLQ by hand ran as often as it failed, and one that never ran, never.
func TestDLQAttemptsCountTheRuns(t *testing.T) {
	t.Parallel()
	at := time.Now()
	for _, tc := range []struct {
		name string
		e    worker.DLQEntry
		want int
	}{
		{"retries used up", worker.DLQEntry{Retried: 25, MaxRetry: 25, LastFailedAt: &at}, 26},
		{"archived by hand after two failures", worker.DLQEntry{Retried: 2, MaxRetry: 25, LastFailedAt: &at}, 2},
		{"archived by hand before it ran", worker.DLQEntry{Retried: 0, MaxRetry: 25}, 0},
		{"sent there at once by its first run", worker.DLQEntry{Retried: 0, MaxRetry: 25, LastFailedAt: &at, LastError: worker.DLQAtOnce + "consents too old"}, 1},
	} {
		if got := dlqAttempts(tc.e); got != tc.want {
			t.Errorf("%s: %d attempts, want %d", tc.name, got, tc.want)
		}
	}
}
