package sandbox

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// OutageMode is how an API fails during an outage window.
type OutageMode string

const (
	// Outage503 answers every request with the provider's own JSON 503 (Netgsm: HTTP 503, code 101), and
	// no Retry-After: the provider does not know when it will be back.
	Outage503 OutageMode = "503"
	// OutageRaw503 answers with an HTML 503, as a load balancer whose backend is down.
	OutageRaw503 OutageMode = "raw_503"
	// OutageReset closes the connection with a TCP reset once the request is read, without an answer.
	OutageReset OutageMode = "reset"
	// OutageHang holds the request unanswered until the client gives up. Nothing is recorded.
	OutageHang OutageMode = "hang"
)

// maxOutages bounds the outage windows a sandbox keeps.
const maxOutages = 1000

// OutagePlan asks for an outage window: from Start (or, when Start is zero, After from now) for
// Duration, every request to the APIs named in Only fails as Mode says, then they recover by
// themselves. A request refused at the door is not recorded and does not count against any limit.
type OutagePlan struct {
	// Only names the APIs that go down, comma-separated (twilio, netgsm, sendgrid, fcm, webhook); empty
	// means all. Each API gets its own window.
	Only string
	// Mode is how requests fail; empty means Outage503.
	Mode OutageMode
	// Start is when the outage begins; zero means After from now.
	Start time.Time
	After time.Duration
	// Duration is how long it lasts; 0 means until stopped (StopOutages, POST /_sandbox/outages/stop).
	Duration time.Duration
}

// Validate checks the APIs, the mode and that no duration is negative.
func (p OutagePlan) Validate() error {
	if _, err := parseOnly(p.Only); err != nil {
		return fmt.Errorf("only: %w", err)
	}
	switch p.Mode {
	case "", Outage503, OutageRaw503, OutageReset, OutageHang:
	default:
		return fmt.Errorf("mode %q: give 503, raw_503, reset or hang", p.Mode)
	}
	if p.After < 0 || p.Duration < 0 {
		return errors.New("after and duration must not be negative")
	}
	return nil
}

// OutageWindow is an outage as the sandbox reports it.
type OutageWindow struct {
	ID   int        `json:"id"`
	API  string     `json:"api"`
	Mode OutageMode `json:"mode"`
	// Start and End bound the window on the sandbox's clock: [Start, End). End is absent while the
	// outage lasts until stopped; a stopped outage ends when it was stopped.
	Start time.Time `json:"start"`
	End   time.Time `json:"end,omitzero"`
	// State is "scheduled", "active" or "over", as of the report.
	State string `json:"state"`
	// Refused is the number of requests the window refused.
	Refused int `json:"refused"`
}

type outageWindow struct {
	id         int
	api        api
	mode       OutageMode
	start, end time.Time // end zero: until stopped. Guarded by outageBook.mu.
	refused    atomic.Int64
}

// outageBook holds the outage windows, scheduled, active and over.
type outageBook struct {
	mu      sync.Mutex
	windows []*outageWindow
	nextID  int
	// until is when the last window ends, in Unix nanoseconds (MaxInt64 while one lasts until stopped, 0
	// with none): past it, a request needs no look at the windows.
	until atomic.Int64
}

// active returns the window of a that covers now, nil when none does.
func (b *outageBook) active(a api, now time.Time) *outageWindow {
	if now.UnixNano() >= b.until.Load() {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, w := range b.windows {
		if w.api == a && !now.Before(w.start) && (w.end.IsZero() || now.Before(w.end)) {
			return w
		}
	}
	return nil
}

// updateLocked recomputes until. b.mu must be held.
func (b *outageBook) updateLocked() {
	var until int64
	for _, w := range b.windows {
		if w.end.IsZero() {
			until = math.MaxInt64
			break
		}
		until = max(until, w.end.UnixNano())
	}
	b.until.Store(until)
}

// add opens the windows p asks for, as of now.
func (b *outageBook) add(p OutagePlan, now time.Time) ([]OutageWindow, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	apis, _ := parseOnly(p.Only)
	mode := p.Mode
	if mode == "" {
		mode = Outage503
	}
	start := p.Start
	if start.IsZero() {
		start = now.Add(p.After)
	}
	var end time.Time
	if p.Duration > 0 {
		end = start.Add(p.Duration)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.windows)+len(apis) > maxOutages {
		return nil, fmt.Errorf("at most %d outage windows", maxOutages)
	}
	out := make([]OutageWindow, 0, len(apis))
	for _, a := range apis {
		b.nextID++
		w := &outageWindow{id: b.nextID, api: a, mode: mode, start: start, end: end}
		b.windows = append(b.windows, w)
		out = append(out, w.report(now))
	}
	b.updateLocked()
	return out, nil
}

// stop ends at now the windows of apis that are active, and drops those not begun yet.
func (b *outageBook) stop(apis []api, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.windows = slices.DeleteFunc(b.windows, func(w *outageWindow) bool {
		return slices.Contains(apis, w.api) && now.Before(w.start)
	})
	for _, w := range b.windows {
		if slices.Contains(apis, w.api) && (w.end.IsZero() || now.Before(w.end)) {
			w.end = now
		}
	}
	b.updateLocked()
}

// list reports the windows of apis (all when nil), in the order they were made.
func (b *outageBook) list(apis []api, now time.Time) []OutageWindow {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]OutageWindow, 0, len(b.windows))
	for _, w := range b.windows {
		if apis == nil || slices.Contains(apis, w.api) {
			out = append(out, w.report(now))
		}
	}
	return out
}

// report describes w as of now. The book's lock must be held.
func (w *outageWindow) report(now time.Time) OutageWindow {
	state := "active"
	switch {
	case now.Before(w.start):
		state = "scheduled"
	case !w.end.IsZero() && !now.Before(w.end):
		state = "over"
	}
	return OutageWindow{
		ID: w.id, API: w.api.String(), Mode: w.mode, Start: w.start.UTC(), End: w.end.UTC(),
		State: state, Refused: int(w.refused.Load()),
	}
}

// StartOutage opens the outage windows p asks for and returns them.
func (s *Server) StartOutage(p OutagePlan) ([]OutageWindow, error) {
	return s.push.outages.add(p, s.now())
}

// StopOutages ends now the outages of the APIs named in only (comma-separated; empty means all) and
// cancels those not begun yet.
func (s *Server) StopOutages(only string) error {
	apis, err := parseOnly(only)
	if err != nil {
		return err
	}
	s.push.outages.stop(apis, s.now())
	return nil
}

// Outages reports every outage window, scheduled, active or over.
func (s *Server) Outages() []OutageWindow {
	return s.push.outages.list(nil, s.now())
}
