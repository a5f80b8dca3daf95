package worker

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/campaign"
)

// Liveness keeps, while a worker process runs, a Postgres session advisory lock under a key of its own
// (campaign.Lease.Holder): the leases its batch runs take name it. A process killed outright closes its
// connection, Postgres lets the lock go at once, and the sweep of the workers left takes the chunks in
// hand of the dead process within seconds (goneAfter) instead of when their leases expire (three times the
// provider's timeout, 30 s by default). A run whose process has lost the lock (its connection to Postgres
// broke) sends nothing more until it holds it again: the sweep may be taking its chunk.
type Liveness struct {
	key  int64
	pool *pgxpool.Pool
	log  *slog.Logger
	// lastOK is when a check last found the lock held (unix ns; 0 once it is lost): the lock counts as held
	// only while that is recent (staleAfter), so that a check hung on a dead connection does not keep the
	// runs sending.
	lastOK atomic.Int64
	// gen counts the holds: it changes each time the lock is held again after it was lost or went stale,
	// and since is when the current hold began (unix ns).
	gen, since atomic.Int64
	// every is how often the lock is checked and, when lost, taken again.
	every time.Duration
}

// staleAfter is how long after its last good check the lock still counts as held: a check a second, and
// half a second for a slow one. It is well under goneAfter, so a run stops claiming before any sweep may
// take its chunk.
const staleAfter = 1500 * time.Millisecond

// NewLiveness returns a Liveness on pool under a random key. Run keeps the lock.
func NewLiveness(pool *pgxpool.Pool, log *slog.Logger) *Liveness {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Liveness{key: rand.Int64N(1<<62) + 1, pool: pool, log: log, every: time.Second}
}

// Key is the lock's key, which the process's leases carry.
func (l *Liveness) Key() int64 { return l.key }

// Held says whether the lock was held at its last check, and that check is recent.
func (l *Liveness) Held() bool {
	return l != nil && time.Since(time.Unix(0, l.lastOK.Load())) <= staleAfter
}

// Gen identifies the current hold of the lock: it changes whenever the lock is held again after it was
// lost or went stale. A run that saw another generation when it last confirmed its lease confirms it
// again before it claims: a sweep may have taken its chunk meanwhile.
func (l *Liveness) Gen() int64 {
	if l == nil {
		return 0
	}
	return l.gen.Load()
}

// HeldFor is how long the lock has been held without a break (0 when it is not held).
func (l *Liveness) HeldFor() time.Duration {
	if !l.Held() {
		return 0
	}
	return time.Since(time.Unix(0, l.since.Load()))
}

// leaseUnconfirmed says whether run's lease must be confirmed before it claims or sends: its process's
// lock is not held, or was lost and held again since the lease was last confirmed (a sweep may have taken
// the chunk meanwhile).
func (h *Handler) leaseUnconfirmed(run *batchRun) bool {
	return run.lease.Holder != 0 && (!h.cfg.Liveness.Held() || h.cfg.Liveness.Gen() != run.liveGen)
}

// regainLiveness is how long a run waits for a lost liveness lock before it hands its batch back: a
// session that ended (a Postgres backend terminated, a connection reset) is replaced within a fraction of
// it, and the other workers' sweeps wait goneAfter before they take the chunk.
const regainLiveness = time.Second

// await waits up to d for the lock to be held, and says whether it is.
func (l *Liveness) await(ctx context.Context, d time.Duration) bool {
	for end := time.Now().Add(d); !l.Held(); {
		if time.Now().After(end) || ctx.Err() != nil {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// Start takes the lock, then keeps it until ctx ends (and lets it go then). It returns once the lock is
// first held, or with an error when it could not be taken within wait (it goes on trying) or ctx ended.
func (l *Liveness) Start(ctx context.Context, wait time.Duration) error {
	first := make(chan struct{})
	var once sync.Once
	go l.run(ctx, func() { once.Do(func() { close(first) }) })
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-first:
		return nil
	case <-timer.C:
		return fmt.Errorf("not held after %v", wait)
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (l *Liveness) run(ctx context.Context, held func()) {
	var conn *pgx.Conn
	drop := func() {
		l.lastOK.Store(0)
		if conn != nil {
			conn.Close(context.Background()) //nolint:errcheck // the session ends and its lock goes with it
			conn = nil
		}
	}
	defer drop()
	for {
		wait := l.every
		if err := l.check(ctx, &conn); err != nil {
			if l.lastOK.Load() != 0 && ctx.Err() == nil {
				l.log.Warn("this worker's liveness lock in Postgres is lost: no sends until it is held again", "err", fmt.Sprint(err))
			}
			drop()
			// Taken again at once, well within goneAfter: the other workers' sweeps must not find it
			// missing twice.
			wait = min(wait, retryLiveness)
		} else {
			if !l.Held() {
				// A new hold: lost or stale before (or the first).
				l.gen.Add(1)
				l.since.Store(time.Now().UnixNano())
				l.log.Debug("liveness lock held", "key", l.key)
			}
			l.lastOK.Store(time.Now().UnixNano())
			held()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// retryLiveness is how soon a lost liveness lock is tried again.
const retryLiveness = 100 * time.Millisecond

// checkTimeout bounds a check of the lock. A check that runs out closes its connection, and the lock goes
// with it: a slow Postgres (every session waits alike) must not make a live process look dead.
const checkTimeout = 10 * time.Second

// check makes sure the lock is held, on a connection of its own taken from the pool when there is none.
func (l *Liveness) check(ctx context.Context, conn **pgx.Conn) error {
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	if *conn == nil {
		c, err := l.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		*conn = c.Hijack()
	}
	return campaign.HoldLiveness(ctx, *conn, l.key)
}

// goneAfter is how long a lease holder's lock must have been missing, seen by two sweeps, before its
// chunks are taken: a live process whose connection broke takes its lock again within a second.
const goneAfter = 3 * time.Second

// goneHolders returns the holders whose locks two sweeps at least goneAfter apart found missing. It
// judges only while this process's own lock has been held without a break for LivenessGrace: a Postgres
// restart, crash recovery or failover drops every session's lock, its own too, and the live workers take
// theirs back within a second of Postgres's return. Without a Liveness it judges nobody gone.
func (h *Handler) goneHolders(ctx context.Context) ([]int64, error) {
	if h.cfg.Liveness.HeldFor() < h.cfg.LivenessGrace {
		h.mu.Lock()
		h.missingSince = nil
		h.mu.Unlock()
		return nil, nil
	}
	missing, err := h.cfg.Store.GoneHolders(ctx)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := make(map[int64]time.Time, len(missing))
	var gone []int64
	for _, k := range missing {
		since, ok := h.missingSince[k]
		if !ok {
			since = now
		}
		seen[k] = since
		if now.Sub(since) >= goneAfter {
			gone = append(gone, k)
		}
	}
	h.missingSince = seen
	return gone, nil
}

// holder is the key the leases of this process carry: its liveness lock's, while held; 0 otherwise.
func (h *Handler) holder() int64 {
	if h.cfg.Liveness.Held() {
		return h.cfg.Liveness.Key()
	}
	return 0
}
