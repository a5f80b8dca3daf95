package receipts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/campaignctl/campaignctl/internal/state"
)

// Spool keeps on disk the refusals (and, with HandleReceipts, the receipts) a sink could not record within
// a request's store wait (Postgres down longer than a restart), and records them once the sink takes them
// again. Without it such a post is answered 500, and a provider that does not post it again (Twilio, by
// default) loses it: the person who said no gets the next campaign, or a recipient whose outcome is
// unknown is not proven sent and may be sent again.
//
// Each held request is one file, written whole before the request is answered (a temporary file, synced,
// renamed, the directory synced), so that a crash after the answer keeps it; a later run of the same
// directory records it. The files are read oldest first. Recording is idempotent (the sink dedupes on
// Refusal.EventID), so a file recorded twice, by two processes sharing the directory or by a crash between
// the record and the removal, changes nothing the second time. A file the sink refuses for good (an
// error marked Final) is set aside as NAME.failed, logged, and not tried again.
//
// Besides a provider's refusals, a spool holds requests of other kinds (HoldRequest), each recorded by the
// function given for its kind (Handle): a one-click unsubscribe, which must read its recipient first.
type Spool struct {
	dir   string
	sink  RefusalSink
	kinds map[string]func(context.Context, json.RawMessage) error
	log   *slog.Logger
	kick  chan struct{}
	seq   atomic.Uint64
	mu    sync.Mutex // one replay at a time within the process
	// every is the pause between two replays while files wait (doubling up to max while the sink fails).
	every, max time.Duration

	// OnHeld, when set, is told that the spool holds requests (true: before a held request is answered,
	// and again at each replay while any wait) or holds none any more (false): the workers wait while it
	// holds refusals (state.NoteRefusalsHeld). Set it before Run.
	OnHeld func(ctx context.Context, held bool) error
	// OnSpooled, when set, is told who a held request refuses (held true: before it is answered) and, once
	// it is recorded, that it no longer holds them (false): unlike OnHeld's note, which runs out when its
	// process dies, this stays until the request is recorded, by whichever process replays the spool (see
	// state.RefusalsSpooledKey). A request set aside keeps them held. Set it before Run.
	OnSpooled func(ctx context.Context, ids []string, held bool) error
	// OnAnnounce, when set, is told who a request refuses (on true) before its refusals are written to
	// Postgres, and (on false) once they are recorded or held: the write may wait its turn behind an
	// import's merge for seconds or minutes, and meanwhile the workers must not send those people
	// (state.RefusalsAnnouncedKey). Set it before Run.
	OnAnnounce func(ctx context.Context, ids []string, on bool) error
	heldMu     sync.Mutex // a note and the look at the directory before a clear, one at a time
	noted      bool
}

// Announce tells OnAnnounce who a request about to be recorded refuses (RefusalIDs, state.SpooledUser),
// and returns what takes the names back once it is recorded or held. A failure is logged, and nothing is
// taken back then (Redis down: the workers send nothing either). Nil-safe.
func (s *Spool) Announce(ids []string) (done func()) {
	if s == nil || s.OnAnnounce == nil || len(ids) == 0 {
		return func() {}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if err := s.OnAnnounce(ctx, ids, true); err != nil {
		s.log.Warn("the workers could not be told who the refusals being recorded refuse", "err", err)
		return func() {}
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		if err := s.OnAnnounce(ctx, ids, false); err != nil {
			s.log.Warn("the workers could not be told that the refusals being recorded are recorded (their names run out by themselves)", "err", err)
		}
	}
}

// RefusalIDs names who rs refuse, as the workers look them up (state.SpooledAddress).
func RefusalIDs(rs []Refusal) []string {
	ids := make([]string, 0, len(rs))
	for _, r := range rs {
		ids = append(ids, state.SpooledAddress(r.Channel, r.Address))
	}
	return ids
}

// noteHeld tells OnHeld that requests wait; a failure is logged (Redis down: the workers send nothing
// either, and the next replay notes it again).
func (s *Spool) noteHeld(ctx context.Context) {
	if s.OnHeld == nil {
		return
	}
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	nctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 500*time.Millisecond)
	defer cancel()
	if err := s.OnHeld(nctx, true); err != nil {
		s.log.Warn("the workers could not be told that refusals wait in the spool", "err", err)
		return
	}
	s.noted = true
}

// spooledIDs tells OnSpooled who a request held (or recorded) refuses; a failure is logged (Redis down:
// the workers send nothing either).
func (s *Spool) spooledIDs(ids []string, held bool) {
	if s.OnSpooled == nil || len(ids) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if err := s.OnSpooled(ctx, ids, held); err != nil {
		s.log.Warn("the workers could not be told who the refusals in the spool refuse", "held", held, "err", err)
	}
}

// clearHeld tells OnHeld that nothing waits, when the directory holds no request any more.
func (s *Spool) clearHeld(ctx context.Context) {
	if s.OnHeld == nil {
		return
	}
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	if n, err := s.Held(); err != nil || n > 0 || !s.noted {
		return
	}
	nctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 500*time.Millisecond)
	defer cancel()
	if err := s.OnHeld(nctx, false); err == nil {
		s.noted = false
	}
}

// spoolCallTimeout bounds one request's recording from the spool.
const spoolCallTimeout = 30 * time.Second

// spoolExt is the extension of a held request's file; spoolFailed that of one set aside.
const (
	spoolExt    = ".json"
	spoolFailed = ".failed"
)

// NewSpool returns the spool of dir, whose refusals go to sink. The directory is made when the first
// request is held (mode 0700: it holds addresses); nothing is written before.
func NewSpool(dir string, sink RefusalSink, log *slog.Logger) *Spool {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Spool{dir: dir, sink: sink, log: log, kick: make(chan struct{}, 1), every: 250 * time.Millisecond, max: 500 * time.Millisecond}
}

// Dir is the spool's directory.
func (s *Spool) Dir() string { return s.dir }

// Check makes the directory if it is missing and writes and removes a file in it: that a request can be
// held there.
func (s *Spool) Check() error {
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(s.dir, ".check-*")
	if err != nil {
		return err
	}
	name := f.Name()
	f.Close()
	return os.Remove(name)
}

// spooled is what a file holds: a provider's refusals (Kind ""), or a request of another kind.
type spooled struct {
	HeldAt   time.Time       `json:"held_at"`
	Events   int             `json:"events"` // refusals, receipts or clicks: for the log
	Refusals []Refusal       `json:"refusals,omitempty"`
	Kind     string          `json:"kind,omitempty"`
	Request  json.RawMessage `json:"request,omitempty"`
	// IDs name who the request refuses (state.SpooledAddress, state.SpooledUser), told to OnSpooled.
	IDs []string `json:"ids,omitempty"`
}

// Handle makes record the way held requests of kind are recorded (HoldRequest). An error marked Final
// sets the request aside; any other is tried again. Call it before Run.
func (s *Spool) Handle(kind string, record func(ctx context.Context, request json.RawMessage) error) {
	if s.kinds == nil {
		s.kinds = map[string]func(context.Context, json.RawMessage) error{}
	}
	s.kinds[kind] = record
}

// receiptsKind is the kind of held receipts (HandleReceipts).
const receiptsKind = "receipts"

// HandleReceipts makes the spool hold receipts too (a handler's, through SetSpool), recorded with sink.
func (s *Spool) HandleReceipts(sink Sink) {
	s.Handle(receiptsKind, func(ctx context.Context, raw json.RawMessage) error {
		var rs []Receipt
		if err := json.Unmarshal(raw, &rs); err != nil {
			return Final(err)
		}
		return sink.Record(ctx, rs)
	})
}

// holdsReceipts says whether s (nil: no spool) holds receipts.
func (s *Spool) holdsReceipts() bool { return s != nil && s.kinds[receiptsKind] != nil }

// Hold writes rs to the spool, durably, and wakes the replay. When it returns nil the request may be
// answered as recorded.
func (s *Spool) Hold(rs []Refusal) error {
	return s.hold(spooled{Refusals: rs, Events: len(rs), IDs: RefusalIDs(rs)})
}

// HoldRequest writes request (JSON), which holds events (receipts, a click), to the spool as one of
// kind, whose function given to Handle records it, like Hold; ids name who it refuses, if anyone
// (state.SpooledUser).
func (s *Spool) HoldRequest(kind string, events int, request any, ids ...string) error {
	if s.kinds[kind] == nil {
		return fmt.Errorf("the refusal spool records no request of kind %q", kind)
	}
	b, err := json.Marshal(request)
	if err != nil {
		return err
	}
	return s.hold(spooled{Kind: kind, Events: events, Request: b, IDs: ids})
}

func (s *Spool) hold(sp spooled) error {
	sp.HeldAt = time.Now().UTC()
	b, err := json.Marshal(sp)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return fmt.Errorf("the refusal spool %s: %w", s.dir, err)
	}
	// Names sort in the order the requests were held: the time, then this process's sequence and ID.
	name := fmt.Sprintf("%020d-%d-%06d%s", time.Now().UnixNano(), os.Getpid(), s.seq.Add(1)%1e6, spoolExt)
	tmp, err := os.CreateTemp(s.dir, ".hold-*")
	if err != nil {
		return fmt.Errorf("the refusal spool %s: %w", s.dir, err)
	}
	_, err = tmp.Write(b)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(s.dir, name))
	}
	if err != nil {
		os.Remove(tmp.Name()) //nolint:errcheck // best effort: a leftover .hold- file is never read
		return fmt.Errorf("the refusal spool %s: %w", s.dir, err)
	}
	if d, err := os.Open(s.dir); err == nil {
		d.Sync() //nolint:errcheck // the rename's durability, where the file system offers it
		d.Close()
	}
	// Before the request is answered: no worker leases on consents that miss it, nor sends anyone it names.
	s.spooledIDs(sp.IDs, true)
	s.noteHeld(context.Background())
	select {
	case s.kick <- struct{}{}:
	default:
	}
	return nil
}

// Held is how many requests wait in the spool (0 when its directory does not exist).
func (s *Spool) Held() (int, error) {
	names, err := s.names()
	return len(names), err
}

func (s *Spool) names() ([]string, error) {
	entries, err := os.ReadDir(s.dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if n := e.Name(); e.Type().IsRegular() && strings.HasSuffix(n, spoolExt) && !strings.HasPrefix(n, ".") {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names, nil
}

// Replay records what waits in the spool, oldest first, and removes each file once its refusals are
// recorded. It stops at the first the sink cannot take (the others would fail alike), and returns how many
// requests it recorded, how many still wait, and the error that stopped it.
func (s *Spool) Replay(ctx context.Context) (done, left int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	names, err := s.names()
	if err != nil {
		return 0, 0, fmt.Errorf("the refusal spool %s: %w", s.dir, err)
	}
	for i, name := range names {
		left = len(names) - i
		path := filepath.Join(s.dir, name)
		b, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			continue // another process sharing the directory recorded it
		}
		if err != nil {
			return done, left, fmt.Errorf("the refusal spool %s: %w", s.dir, err)
		}
		var sp spooled
		if err := json.Unmarshal(b, &sp); err != nil {
			s.setAside(path, 0, fmt.Errorf("not a held request: %w", err))
			continue
		}
		// A Postgres that takes connections but answers nothing (frozen, cut off mid-statement) must not
		// hold the replay for ever: the next one tries again.
		callCtx, cancel := context.WithTimeout(ctx, spoolCallTimeout)
		if sp.Kind == "" {
			err = s.sink.Refuse(callCtx, sp.Refusals)
		} else if record := s.kinds[sp.Kind]; record == nil {
			err = Final(fmt.Errorf("a request of kind %q, which this version does not record", sp.Kind))
		} else {
			err = record(callCtx, sp.Request)
		}
		cancel()
		var f finalError
		switch {
		case errors.As(err, &f):
			s.setAside(path, sp.Events, f.error)
			continue
		case err != nil:
			return done, left, err
		}
		switch err := os.Remove(path); {
		case err == nil:
			// Only the process that removed the file takes its names back: two replaying one directory
			// would take them back twice.
			s.spooledIDs(sp.IDs, false)
		case !errors.Is(err, os.ErrNotExist):
			return done, left, fmt.Errorf("the refusal spool %s: %w", s.dir, err)
		}
		done++
		s.log.Info(kindName(sp.Kind)+" held in the spool recorded", "events", sp.Events, "held_for", time.Since(sp.HeldAt).Round(time.Millisecond).String())
	}
	return done, 0, nil
}

// kindName is what a held request of kind k holds, for the log.
func kindName(k string) string {
	switch k {
	case "":
		return "refusals"
	case receiptsKind:
		return "receipts"
	}
	return "a request of kind " + k
}

// setAside renames a file the sink refused for good, so that it is not tried again and stays for someone
// to read.
func (s *Spool) setAside(path string, n int, err error) {
	s.log.Error("a request held in the refusal spool cannot be recorded; set aside, not tried again: read it, mend the cause, rename it back to .json to try again",
		"file", path+spoolFailed, "refusals", n, "err", err)
	os.Rename(path, path+spoolFailed) //nolint:errcheck // if even this fails, the next replay logs it again
}

// Run replays the spool at once (what an earlier run left), after every Hold, and while requests wait,
// every moment (0.25 s, doubling up to 0.5 s while the sink fails: a refusal is recorded within about half a
// second of Postgres's return), until ctx ends.
func (s *Spool) Run(ctx context.Context) {
	if n, _ := s.Held(); n > 0 {
		s.log.Warn("refusals held in the spool by an earlier run; recording them", "requests", n, "dir", s.dir)
		s.noteHeld(ctx)
	}
	pause, fails := s.every, 0
	for {
		_, left, err := s.Replay(ctx)
		if left > 0 {
			s.noteHeld(ctx) // renewed while requests wait
		} else {
			s.clearHeld(ctx)
		}
		var wake <-chan time.Time
		if err != nil {
			// The first failure of a streak, then about every 30 s.
			if fails++; fails == 1 || fails%60 == 0 {
				s.log.Warn("refusals wait in the spool: the sink cannot take them yet", "requests", left, "err", err, "tries", fails)
			}
			wake = time.After(pause)
			pause = min(2*pause, s.max)
		} else {
			pause, fails = s.every, 0
		}
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
		case <-wake:
		}
	}
}
