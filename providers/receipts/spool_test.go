package receipts_test

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/providers/receipts"
)

// spoolFiles lists what waits in dir, and what was set aside.
func spoolFiles(t *testing.T, dir string) (held, failed []string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	for _, e := range entries {
		switch n := e.Name(); {
		case strings.HasSuffix(n, ".json"):
			held = append(held, n)
		case strings.HasSuffix(n, ".failed"):
			failed = append(failed, n)
		}
	}
	return held, failed
}

// An RET whose sink still fails when the store wait ends is held in the spool and the post answered 200,
// since Twilio would not post it again; the spool records it once the sink takes it, and the file goes.
// Without a spool the same post is answered 500, as before.
func TestARefusalTheSinkCannotTakeIsHeldInTheSpoolAndRecordedWhenItCan(t *testing.T) {
	sk := &bothSink{refuseErr: errors.New("database down")}
	h := receipts.TwilioInboundHandler(twilioToken, inboundPublic, nil, sk, nil)
	h.SetStoreWait(0)
	if w := inboundServe(h, inboundForm("RET")); w.Code != http.StatusInternalServerError {
		t.Fatalf("without a spool: %d, want 500 (the sink failed)", w.Code)
	}

	dir := filepath.Join(t.TempDir(), "spool")
	sp := receipts.NewSpool(dir, sk, slog.New(slog.DiscardHandler))
	h.SetSpool(sp)
	if w := inboundServe(h, inboundForm("RET")); w.Code != http.StatusOK {
		t.Fatalf("with a spool: %d, want 200 (held on disk)", w.Code)
	}
	if held, _ := spoolFiles(t, dir); len(held) != 1 {
		t.Fatalf("spool holds %v, want the one post", held)
	}
	if st := h.Stats(); st.Spooled != 1 || st.Refusals != 0 || st.SinkErrors != 1 {
		t.Fatalf("stats %+v, want 1 spooled, 0 recorded, 1 sink error (the post without a spool)", st)
	}
	if n, left, err := sp.Replay(t.Context()); n != 0 || left != 1 || err == nil {
		t.Fatalf("replay while the sink fails: %d recorded, %d left, err %v; want 0, 1 and the sink's error", n, left, err)
	}
	if held, _ := spoolFiles(t, dir); len(held) != 1 {
		t.Fatalf("a failed replay left %v, want the file kept", held)
	}

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); sp.Run(ctx) }()
	defer func() { cancel(); <-done }()
	time.Sleep(300 * time.Millisecond)
	sk.rmu.Lock()
	sk.refuseErr = nil
	sk.rmu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		held, _ := spoolFiles(t, dir)
		got := sk.allRefusals()
		if len(held) == 0 && len(got) == 1 {
			if got[0].Address != inboundFrom || got[0].Keyword != "RET" || got[0].EventID != inboundSID {
				t.Fatalf("recorded %+v, want the RET of %s", got[0], inboundFrom)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after the sink came back: spool %v, recorded %d; want it recorded once and the file gone", held, len(got))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// What one process held is recorded by the next on the same directory (a restart, a crash after the
// answer), oldest first; a file the sink refuses for good is set aside, not tried again, and does not hold
// back the ones after it.
func TestASpoolLeftByAnEarlierRunIsRecordedInOrderAndAFileRefusedForGoodSetAside(t *testing.T) {
	dir := t.TempDir()
	down := &bothSink{refuseErr: errors.New("database down")}
	first := receipts.NewSpool(dir, down, nil)
	rs := func(addr string) []receipts.Refusal {
		return []receipts.Refusal{{Provider: "twilio", Channel: receipts.ChannelSMS, Address: addr, Kind: receipts.RefusalInbound, Keyword: "RET",
			EventID: "SM" + addr, At: time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC), Evidence: `twilio inbound "RET"`}}
	}
	for _, a := range []string{"+905550000001", "+905550000002", "+905550000003"} {
		if err := first.Hold(rs(a)); err != nil {
			t.Fatal(err)
		}
	}
	var order []string
	sk := receipts.RefusalSinkFunc(func(_ context.Context, got []receipts.Refusal) error {
		order = append(order, got[0].Address)
		if got[0].Address == "+905550000002" {
			return receipts.Final(errors.New(`ERROR: invalid input syntax (SQLSTATE 22P02)`))
		}
		return nil
	})
	n, _, err := receipts.NewSpool(dir, sk, nil).Replay(t.Context())
	if err != nil || n != 2 {
		t.Fatalf("replay: %d recorded, err %v; want 2 and no error", n, err)
	}
	if want := "+905550000001 +905550000002 +905550000003"; strings.Join(order, " ") != want {
		t.Fatalf("recorded in the order %v, want %s", order, want)
	}
	held, failed := spoolFiles(t, dir)
	if len(held) != 0 || len(failed) != 1 {
		t.Fatalf("after the replay: held %v, set aside %v; want none held and one set aside", held, failed)
	}
	order = nil
	if n, _, err := receipts.NewSpool(dir, sk, nil).Replay(t.Context()); n != 0 || err != nil || len(order) != 0 {
		t.Fatalf("a second replay: %d recorded, err %v, calls %v; want nothing tried again", n, err, order)
	}
}

// A refusal the sink refuses for good (an error marked Final: Postgres refused what it holds) is not held
// in the spool, where it would fail alike for ever: the post is answered 500 at once.
func TestARefusalRefusedForGoodIsNotSpooled(t *testing.T) {
	sk := &bothSink{refuseErr: receipts.Final(errors.New("invalid byte sequence (SQLSTATE 22021)"))}
	h := receipts.TwilioInboundHandler(twilioToken, inboundPublic, nil, sk, nil) // the default wait
	dir := t.TempDir()
	h.SetSpool(receipts.NewSpool(dir, sk, nil))
	start := time.Now()
	if w := inboundServe(h, inboundForm("RET")); w.Code != http.StatusInternalServerError || time.Since(start) > 2*time.Second {
		t.Fatalf("%d after %v, want 500 at once", w.Code, time.Since(start))
	}
	if held, _ := spoolFiles(t, dir); len(held) != 0 {
		t.Fatalf("spool holds %v, want nothing", held)
	}
}

// The spool tells the workers (OnHeld) that refusals wait before the post that brought them is answered,
// tells them again at each replay while any wait, and tells them none wait once the last is recorded.
func TestTheSpoolSaysWhileRefusalsWait(t *testing.T) {
	sk := &bothSink{refuseErr: errors.New("database down")}
	h := receipts.TwilioInboundHandler(twilioToken, inboundPublic, nil, sk, nil)
	h.SetStoreWait(0)
	sp := receipts.NewSpool(filepath.Join(t.TempDir(), "spool"), sk, slog.New(slog.DiscardHandler))
	var mu sync.Mutex
	var said []bool
	sp.OnHeld = func(_ context.Context, held bool) error {
		mu.Lock()
		defer mu.Unlock()
		said = append(said, held)
		return nil
	}
	saidSoFar := func() []bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(said)
	}
	h.SetSpool(sp)
	if w := inboundServe(h, inboundForm("RET")); w.Code != http.StatusOK {
		t.Fatalf("with a spool: %d, want 200 (held on disk)", w.Code)
	}
	if got := saidSoFar(); !slices.Equal(got, []bool{true}) {
		t.Fatalf("told %v by the time the post was answered; want [true]", got)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); sp.Run(ctx) }()
	defer func() { cancel(); <-done }()
	time.Sleep(700 * time.Millisecond)
	if got := saidSoFar(); len(got) < 2 || slices.Contains(got, false) {
		t.Fatalf("told %v while the sink failed; want the note renewed, never cleared", got)
	}
	sk.rmu.Lock()
	sk.refuseErr = nil
	sk.rmu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := saidSoFar()
		if len(got) > 0 && !got[len(got)-1] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("told %v 10 s after the sink came back; want the last word false (nothing waits)", got)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(sk.allRefusals()) != 1 {
		t.Fatalf("recorded %d refusals, want 1", len(sk.allRefusals()))
	}
}

// Who a held refusal refuses is told before the post is answered, and taken back only once the refusal is
// recorded, by whichever process replays the directory: a process that dies with its spool full leaves
// them named (its note of OnHeld runs out; these do not), and the next process on the directory takes them
// back when it records the file.
func TestTheSpoolNamesWhoItsRefusalsRefuseUntilTheyAreRecorded(t *testing.T) {
	sk := &bothSink{refuseErr: errors.New("database down")}
	h := receipts.TwilioInboundHandler(twilioToken, inboundPublic, nil, sk, nil)
	h.SetStoreWait(0)
	dir := filepath.Join(t.TempDir(), "spool")
	var mu sync.Mutex
	named := map[string]int{}
	tell := func(_ context.Context, ids []string, held bool) error {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range ids {
			if held {
				named[id]++
			} else if named[id]--; named[id] == 0 {
				delete(named, id)
			}
		}
		return nil
	}
	namedNow := func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(named)
	}
	sp := receipts.NewSpool(dir, sk, slog.New(slog.DiscardHandler))
	sp.OnSpooled = tell
	h.SetSpool(sp)
	if w := inboundServe(h, inboundForm("RET")); w.Code != http.StatusOK {
		t.Fatalf("with a spool: %d, want 200 (held on disk)", w.Code)
	}
	want := map[string]int{state.SpooledAddress("sms", inboundFrom): 1}
	if got := namedNow(); !maps.Equal(got, want) {
		t.Fatalf("named %v by the time the post was answered; want %v", got, want)
	}
	if _, _, err := sp.Replay(t.Context()); err == nil {
		t.Fatal("the replay recorded while the sink fails")
	}
	if got := namedNow(); !maps.Equal(got, want) {
		t.Fatalf("named %v after a failed replay; want %v still", got, want)
	}
	// The process dies; another takes the directory over once Postgres is back.
	sk.rmu.Lock()
	sk.refuseErr = nil
	sk.rmu.Unlock()
	next := receipts.NewSpool(dir, sk, slog.New(slog.DiscardHandler))
	next.OnSpooled = tell
	if n, left, err := next.Replay(t.Context()); n != 1 || left != 0 || err != nil {
		t.Fatalf("the next process's replay: %d recorded, %d left, %v; want the refusal recorded", n, left, err)
	}
	if got := namedNow(); len(got) != 0 {
		t.Fatalf("named %v once recorded; want nobody", got)
	}
}
