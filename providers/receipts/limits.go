package receipts

import (
	"context"
	"errors"
	"net/http"
	"os"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"
)

// Body limits. A request is refused before its body is read when its Content-Length is over the limit
// (413), and a body without a Content-Length is read through http.MaxBytesReader, so no more than the
// limit (and one byte) of it is ever buffered.
const (
	// MaxTwilioBody bounds a Twilio status callback. A real one is a form of about fifteen short fields,
	// under 1 KiB; 16 KiB leaves room for the fields Twilio adds per channel while keeping the form,
	// which has to be parsed before its signature can be checked, small.
	MaxTwilioBody = 16 << 10
	// MaxSendGridBody bounds an Event Webhook request. SendGrid posts a batch once it has gathered about
	// 30 seconds or 768 KB of events, whichever comes first, so a batch is a little over 768 KB at most
	// (the event that crosses the threshold is in it); 2 MiB holds that with room to spare.
	MaxSendGridBody = 2 << 20
)

// In-flight bodies: each handler holds at most this many maximum-size bodies in memory at once (more
// smaller ones). A request beyond that waits up to busyWait for room and is then answered 503 with
// Retry-After, so that the provider delivers it again; its body is not read. Room is taken for the
// Content-Length (the maximum when there is none), rounded up to the buffer the body is read into, and
// given back as soon as the body is verified and parsed, before the sink records it.
const (
	twilioInFlight   = 64 // 1 MiB
	sendgridInFlight = 4  // 8 MiB
	defaultBusyWait  = 2 * time.Second
)

// Body pace: once a request has room, its body must arrive within bodyGrace plus the time it takes at
// minBodyRate (2 s for a Twilio callback, 5 s for a 768 KB SendGrid batch, 10 s for the largest), so
// that a client that trickles a body is cut off in seconds; the connection's read deadline says so.
// Providers post from data centres, far faster than that.
const (
	defaultBodyGrace = 2 * time.Second
	minBodyRate      = 256 << 10 // bytes per second
)

// Large bodies are read into buffers that are used again (sizes 64 KiB to 2 MiB, doubling), so that a
// stream of them costs the buffers in use, not a garbage collector's worth of fresh ones besides. The
// room a body takes is the size of its buffer.
const (
	minPooledBody = 64 << 10
	bodyClasses   = 6 // 64 KiB << 5 = 2 MiB
)

var bodyPools [bodyClasses]sync.Pool

// bodyClass is the pool of a body of n bytes and its buffers' size; -1 and n when it has none.
func bodyClass(n int64) (int, int64) {
	if n <= minPooledBody/2 {
		return -1, n
	}
	size := int64(minPooledBody)
	for c := range bodyClasses {
		if n <= size {
			return c, size
		}
		size <<= 1
	}
	return -1, n
}

// bodyBuffer is a buffer of at least n bytes, and the function that gives it back once nothing refers
// to it any more.
func bodyBuffer(n int64) ([]byte, func()) {
	c, size := bodyClass(n)
	if c < 0 {
		return make([]byte, n), func() {}
	}
	b, ok := bodyPools[c].Get().(*[]byte)
	if !ok {
		buf := make([]byte, size)
		b = &buf
	}
	return (*b)[:n], func() { bodyPools[c].Put(b) }
}

// ReasonBusy is the Stats.Rejected key of a request answered 503 because the bodies already being read
// used up the handler's room.
const ReasonBusy = "busy"

// limits is what a Handler allows a request body.
type limits struct {
	max       int64               // bytes
	room      *semaphore.Weighted // bytes of bodies being read
	busyWait  time.Duration
	bodyGrace time.Duration
	// storeWait is how long a request's receipts and refusals are tried again while their sink fails
	// (Postgres restarting, unreachable) before the request is answered 500.
	storeWait time.Duration
}

// DefaultStoreWait is how long a request waits for its sink by default: a Postgres restart or a failover
// takes seconds, and Twilio (which gives up on a webhook after 15 s) does not post a request again after
// a 500 unless its URL asks it to (connection overrides, #rc=…&rp=…).
const DefaultStoreWait = 10 * time.Second

func newLimits(max int64, inFlight int64) limits {
	return limits{max: max, room: semaphore.NewWeighted(max * inFlight), busyWait: defaultBusyWait, bodyGrace: defaultBodyGrace,
		storeWait: DefaultStoreWait}
}

// reserve takes room for n bytes of body, waiting up to busyWait.
func (l *limits) reserve(ctx context.Context, n int64) bool {
	ctx, cancel := context.WithTimeout(ctx, l.busyWait)
	defer cancel()
	return l.room.Acquire(ctx, n) == nil
}

// bodyTime is how long a body of n bytes may take to arrive.
func (l *limits) bodyTime(n int64) time.Duration {
	return l.bodyGrace + time.Duration(n)*time.Second/minBodyRate
}

// bodyRejection classifies an error reading (or, for a form, parsing) a bounded body.
func bodyRejection(err error, max int64) *rejection {
	if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
		return reject(http.StatusRequestEntityTooLarge, ReasonMalformed, "body over %d bytes", max)
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return reject(http.StatusRequestTimeout, ReasonMalformed, "body not received in time")
	}
	return reject(http.StatusBadRequest, ReasonMalformed, "body: %v", err)
}
