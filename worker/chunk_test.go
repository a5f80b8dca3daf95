package worker

import (
	"context"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/faults"
	"github.com/campaignctl/campaignctl/providers"
)

func TestNextChunkIsHalfASecondOfThePace(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		n    int
		d    time.Duration
		want int
	}{
		{100, 100 * time.Millisecond, MaxChunk}, // 1,000/s: 500, above the most
		{300, time.Second, 150},
		{200, 500 * time.Millisecond, 200},
		{100, time.Second, MinChunk}, // 100/s: 50, below the least
		{100, 0, MaxChunk},
	} {
		if got := nextChunk(c.n, c.d); got != c.want {
			t.Errorf("nextChunk(%d, %v) = %d, want %d", c.n, c.d, got, c.want)
		}
	}
}

// leasesOfBatch0 runs batch 0 (500 recipients) of a planned campaign through a handler with the default
// chunk size, its sends each taking sendTime, and returns how many chunks it leased and the handler.
func leasesOfBatch0(t *testing.T, window int, sendTime time.Duration) (int, *fixture) {
	t.Helper()
	f, h, _, fs := windowedFixture(t, 1000, window)
	h.cfg.ChunkSize, h.growChunks = MinChunk, true // as NewHandler sets them when ChunkSize is left at 0
	leases := fs.Add(&faults.Rule{Match: faults.Method("LeaseChunk"), Kind: faults.Stall})
	f.provider.before = func(providers.Message) { time.Sleep(sendTime) }
	if n := len(f.batchUsers(t, 0)); n != 500 {
		t.Fatalf("batch 0 has %d recipients, want 500", n)
	}
	if err := h.RunBatch(context.Background(), f.id, 0); err != nil {
		t.Fatal(err)
	}
	f.assertOnce(t)
	return leases.Hits(), f
}

// A run without a cap whose sends go fast takes bigger chunks than the first: fewer leases and writes of
// outcomes a message, and everyone still sent once.
func TestAFastRunGrowsItsChunks(t *testing.T) {
	t.Parallel()
	leases, f := leasesOfBatch0(t, 8, 0)
	// 100, then up to MaxChunk: 2 or 3 chunks; on a machine starved of CPU the first chunk's pace is lower,
	// and the second smaller (4 seen under three busy loops beside the suite). Without growth: 5.
	if leases > 4 {
		t.Errorf("batch 0 of 500 took %d chunks, want at most 4 (100, then up to %d; 5 without growth)", leases, MaxChunk)
	}
	c := f.counts(t)
	if c.Pending != c.Planned-500 || c.Sent != 500 {
		t.Errorf("counts %+v after batch 0, want its 500 sent", c)
	}
}

// A run whose sends are slow (2 at a time, 10 ms each: 200 a second) keeps the smallest chunk: its
// consents must not grow old before its last message goes.
func TestASlowRunKeepsItsChunksSmall(t *testing.T) {
	t.Parallel()
	leases, _ := leasesOfBatch0(t, 2, 10*time.Millisecond)
	// At least one lease a chunk of MinChunk; more when a loaded machine makes a chunk outlast
	// consentMaxAge, whose consents are then read again (a lease of the same chunk).
	if leases < 500/MinChunk {
		t.Errorf("batch 0 of 500 took %d leases at 200 sends a second, want at least %d: chunks of %d", leases, 500/MinChunk, MinChunk)
	}
}
