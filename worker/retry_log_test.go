package worker

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testlog"
)

// The batches of a paused campaign come back every 30 s each: the worker says so once, at info, not once a
// batch at warn.
func TestAPausedCampaignsBatchesAreLoggedOnce(t *testing.T) {
	t.Parallel()
	f := plan(t, 120) // several batches
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := f.store.Transition(ctx, f.id, []campaign.State{campaign.StateRunning}, campaign.StatePaused); err != nil {
		t.Fatal(err)
	}
	c, err := f.store.Get(ctx, f.id)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := Enqueue(ctx, asynq.NewClientFromRedisClient(f.rdb), f.store, c, true); err != nil {
		t.Fatal(err)
	}
	var out testlog.Buffer
	log := slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, f.rdb, f.h, ServerConfig{Concurrency: 4, Logger: log}) }()
	insp := asynq.NewInspectorFromRedisClient(f.rdb)
	deadline := time.Now().Add(20 * time.Second)
	for {
		qi, err := insp.GetQueueInfo(Queue)
		if err == nil && qi.Retry == f.batches {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the %d batches of the paused campaign were not all handed back within 20s (queue: %+v, err %v)", f.batches, qi, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if f.batches < 4 {
		t.Fatalf("the campaign has %d batches; the test needs several", f.batches)
	}
	said := out.Lines("batch will run again", "is paused")
	if len(said) != 1 {
		t.Fatalf("%d batches of a paused campaign handed back: %d lines say so, want 1:\n%s", f.batches, len(said), strings.Join(said, "\n"))
	}
	if !strings.Contains(said[0], "level=INFO") {
		t.Errorf("a paused campaign is a wait, not a fault: want it at info, got %s", said[0])
	}
	if got := f.provider.total(); got != 0 {
		t.Errorf("the provider got %d messages of a paused campaign", got)
	}
}

// A reason given less than retryNoteEvery ago is counted, not written; its next line says how many times
// it came meanwhile. Each reason has its own clock, and a fault stays at warn.
func TestARetryReasonIsWrittenOnceAMinuteWithItsCount(t *testing.T) {
	notes, now, out, log := retryNotesAt(time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC))
	paused := &RetryError{Err: errors.New("campaign 7 is paused"), After: 30 * time.Second, Wait: true}
	for range 50 {
		notes.log(context.Background(), log, paused, "task", "x")
	}
	notes.log(context.Background(), log, retryTwilioDown, "task", "y")
	*now = (*now).Add(retryNoteEvery - time.Second)
	notes.log(context.Background(), log, paused, "task", "x")
	if got := out.Lines("campaign 7 is paused"); len(got) != 1 || !strings.Contains(got[0], "level=INFO") || !strings.Contains(got[0], "retry_in=30s") || strings.Contains(got[0], "same_since_last_line") {
		t.Fatalf("51 handbacks of a paused campaign within a minute: want one info line without a count, got %q", got)
	}
	if got := out.Lines("twilio is down"); len(got) != 1 || !strings.Contains(got[0], "level=WARN") {
		t.Fatalf("a provider down is a fault: want one warn line, got %q", got)
	}
	*now = (*now).Add(time.Second)
	notes.log(context.Background(), log, paused, "task", "x")
	got := out.Lines("campaign 7 is paused")
	if len(got) != 2 || !strings.Contains(got[1], "same_since_last_line=50") {
		t.Fatalf("a minute after the first line: want a second line counting the 50 handbacks in between, got %q", got)
	}
}

// A reason that stops coming back has its count written all the same: at the first hand-back a minute
// after its last line, whatever that hand-back's reason.
func TestARetryReasonThatStopsComingBackHasItsCountWritten(t *testing.T) {
	notes, now, out, log := retryNotesAt(time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC))
	for range 6 {
		notes.log(context.Background(), log, retryTwilioDown, "task", "x")
		*now = (*now).Add(5 * time.Second)
	}
	*now = (*now).Add(time.Minute) // twilio came back: no more of it
	notes.log(context.Background(), log, &RetryError{Err: errors.New("campaign 9 is paused"), Wait: true}, "task", "y")
	got := out.Lines("twilio is down")
	if len(got) != 2 || !strings.Contains(got[1], "same_since_last_line=5") || !strings.Contains(got[1], "quiet_since=") || !strings.Contains(got[1], "level=WARN") {
		t.Fatalf("a reason that came back 5 times after its line, then stopped: want its count on a line of its own at its level, got %q", got)
	}
	if got := out.Lines("campaign 9 is paused"); len(got) != 1 {
		t.Fatalf("the hand-back that came meanwhile: %q", got)
	}
}

// retryTwilioDown is a hand-back for a fault (logged at warn).
var retryTwilioDown = &RetryError{Err: errors.New("provider twilio is down; the batch waits for it"), After: 5 * time.Second}

// retryNotesAt is a retryNotes on a clock set to start (moved by the test through now), logging to out.
func retryNotesAt(start time.Time) (notes *retryNotes, now *time.Time, out *testlog.Buffer, log *slog.Logger) {
	now, out = &start, &testlog.Buffer{}
	return newRetryNotes(func() time.Time { return *now }), now, out, slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
