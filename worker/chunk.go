package worker

import (
	"sync/atomic"
	"time"
)

// Chunk sizes of a run without a cap, when Config.ChunkSize is left at 0.
const (
	// MinChunk is where a run starts (when no run of its provider measured a pace before it) and the
	// smallest chunk it goes down to.
	MinChunk = 100
	// MaxChunk is the largest chunk. A chunk in hand is also what a worker killed while Redis loses its
	// data can leave `unknown` (its claims gone, nothing tells which of its messages went): at most
	// MaxChunk for each of the worker's runs (--concurrency).
	MaxChunk = 250
	// chunkSpan is how long a chunk's sends should take: half of consentMaxAge, so that the consents read
	// with its lease are still young enough when its last message goes (an older one is read again:
	// recheck), with room for the provider to slow down in between.
	chunkSpan = consentMaxAge / 2
)

// chunkPace sizes the chunks of a run without a cap (no wait for tokens between its sends) by the pace it
// measures: each chunk is what the chunk before went out at for chunkSpan, between MinChunk and MaxChunk.
// A chunk is a lease and its consents' read, a write of its outcomes and its audit rows, a lock of the
// batch: their cost a message falls as the chunk grows (from 100 to 250 recipients, about a fifth of
// Postgres's CPU an SMS). What a kill leaves unknown does not change (the window of sends in flight); a
// kill together with a loss of Redis's data leaves the chunks in hand, so at most MaxChunk a run. The
// size is kept per provider for the runs that follow.
type chunkPace struct {
	hint *atomic.Int64
	size int
}

// chunkPaceFor starts the pace of a run through provider name where the last run measured it.
func (h *Handler) chunkPaceFor(name string) *chunkPace {
	v, _ := h.chunkHints.LoadOrStore(name, new(atomic.Int64))
	p := &chunkPace{hint: v.(*atomic.Int64), size: MinChunk}
	if n := int(p.hint.Load()); n > 0 {
		p.size = n
	}
	return p
}

// observe takes the pace of a chunk of n sends that took d from its lease to its last answer, and sets the
// size of the next. A chunk too small to tell (the end of a batch) changes nothing.
func (p *chunkPace) observe(n int, d time.Duration) {
	if n < MinChunk/2 {
		return
	}
	p.size = nextChunk(n, d)
	p.hint.Store(int64(p.size))
}

// nextChunk is what n sends in d make in chunkSpan, between MinChunk and MaxChunk.
func nextChunk(n int, d time.Duration) int {
	if d <= 0 {
		return MaxChunk
	}
	return min(MaxChunk, max(MinChunk, int(float64(n)*float64(chunkSpan)/float64(d))))
}
