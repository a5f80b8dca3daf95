package worker_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/worker"
)

// aroundUnhalt runs before just before, and after just after, the first command that clears key: a DEL
// of it, or a script given it.
type aroundUnhalt struct {
	key           string
	once          sync.Once
	before, after func()
}

func (h *aroundUnhalt) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *aroundUnhalt) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		name := strings.ToLower(fmt.Sprint(args[0]))
		if (name == "del" || name == "evalsha" || name == "eval") && slices.Contains(args[1:], any(h.key)) {
			hit := false
			h.once.Do(func() { hit = true })
			if hit {
				h.before()
				err := next(ctx, cmd)
				h.after()
				return err
			}
		}
		return next(ctx, cmd)
	}
}
func (h *aroundUnhalt) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Two operators: one runs `resume` on a running campaign (say, after a worker incident) while another
// cancels it. Resume read the campaign as running; the cancel is then recorded and acknowledged ("no new
// send starts on any worker"), and its halt mark is set, just before resume clears the halt. Resume's
// next Postgres read is slow, and a live worker holding a chunk goes on meanwhile. Before, resume cleared
// the halt whatever wrote it, and put it back only after that read: two messages went out after the
// cancel was acknowledged. Now a halt written after resume began is kept.
func TestAResumeRacingACancelKeepsTheCancelsHalt(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t, 6, nil)
	ctx := context.Background()
	c := e.launch(t, "race", 3)
	p := newGatedProvider()
	done := e.liveWorker(c.ID, 0, p)
	wait(t, p.started, "the first send")

	var cancelled bool
	var ranDone bool
	// The unhalt script is loaded first, so that the call the hook wraps is the one that runs it (not an
	// EVALSHA that fails with NOSCRIPT, then an EVAL outside the hook).
	if _, err := state.UnhaltIf(ctx, e.rdb, -c.ID, ""); err != nil {
		t.Fatal(err)
	}
	resumer := redis.NewClient(e.rdb.(*redis.Client).Options())
	defer resumer.Close()
	resumer.AddHook(&aroundUnhalt{key: worker.HaltKey(c.ID),
		before: func() {
			// The other operator's cancel lands after resume read the state, and returns.
			rep, err := worker.Cancel(ctx, worker.CancelOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID, Wait: 0})
			if err != nil || !rep.Halted {
				t.Errorf("cancel: %+v, %v", rep, err)
			}
			cancelled = true
		},
		after: func() {
			// Resume's next Postgres read is slow for a moment (a busy database): the worker goes on.
			close(p.release)
			select {
			case err := <-done:
				ranDone = true
				if err != nil {
					t.Logf("live batch run: %v", err)
				}
			case <-time.After(5 * time.Second):
			}
		}})
	_, err := worker.Resume(ctx, worker.ResumeOptions{Store: e.store, Redis: resumer, CampaignID: c.ID})
	t.Logf("resume: %v", err)
	if !cancelled {
		t.Fatal("the cancel did not run")
	}
	if !ranDone {
		wait(t, done, "the live batch run")
	}
	if st := e.campaign(t, c.ID).State; st != campaign.StateCancelled {
		t.Fatalf("state %s, want cancelled", st)
	}
	if got := p.calls(); got != 1 {
		t.Fatalf("%d messages sent, want only the one in flight when the cancel was acknowledged: %d were sent after `cancel` said no new send starts", got, got-1)
	}
}

// afterRead runs do once, just after the first cmd (GET when empty) of key returned.
type afterRead struct {
	cmd  string
	key  string
	once sync.Once
	do   func()
}

func (h *afterRead) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *afterRead) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		name := h.cmd
		if name == "" {
			name = "get"
		}
		if args := cmd.Args(); len(args) >= 2 && strings.EqualFold(fmt.Sprint(args[0]), name) && args[1] == h.key {
			h.once.Do(h.do)
		}
		return err
	}
}
func (h *afterRead) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A paused campaign is resumed while another operator pauses it again: the pause finds it still paused
// (resume has not moved it yet), writes its halt again and is acknowledged. Resume then moves it to
// running; the halt it would clear is newer than it, so it is kept, and the campaign goes back to paused:
// the pause acknowledged last stands, and no worker sends.
func TestAPauseOfAStillPausedCampaignDuringAResumeStands(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t, 3, nil)
	ctx := context.Background()
	c := e.launch(t, "again", 1)
	if _, err := worker.Pause(ctx, worker.PauseOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID}); err != nil {
		t.Fatal(err)
	}
	resumer := redis.NewClient(e.rdb.(*redis.Client).Options())
	defer resumer.Close()
	resumer.AddHook(&afterRead{key: state.HaltsKey(c.ID), do: func() {
		rep, err := worker.Pause(ctx, worker.PauseOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID})
		if err != nil || rep.Was != campaign.StatePaused || !rep.Halted {
			t.Errorf("second pause: %+v, %v; want it to find the campaign paused and write its halt", rep, err)
		}
	}})
	_, err := worker.Resume(ctx, worker.ResumeOptions{Store: e.store, Redis: resumer, CampaignID: c.ID})
	if err == nil || !strings.Contains(err.Error(), "while it was being resumed") {
		t.Errorf("resume: %v, want it to say the campaign was paused meanwhile", err)
	}
	if st := e.campaign(t, c.ID).State; st != campaign.StatePaused {
		t.Fatalf("state %s, want paused", st)
	}
	if v, _ := e.rdb.Get(ctx, worker.HaltKey(c.ID)).Result(); v != string(campaign.StatePaused) {
		t.Fatalf("halt mark %q, want paused", v)
	}
}

// An operator resumes a running campaign (say, after a worker incident) while another cancels it, and the
// cancel commits after resume's checks of the state, while it rebuilds the counters and queues the
// batches. The cancel's halt stops every send; resume must not then report the campaign running and exit
// 0: it reads the state once more at its end and says it was cancelled meanwhile.
func TestACancelCommittedLateInAResumeIsReported(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t, 3, nil)
	ctx := context.Background()
	c := e.launch(t, "late", 1)
	resumer := redis.NewClient(e.rdb.(*redis.Client).Options())
	defer resumer.Close()
	var cancelled bool
	resumer.AddHook(&afterRead{cmd: "hset", key: worker.ProgressKey(c.ID), do: func() {
		rep, err := worker.Cancel(ctx, worker.CancelOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID, Wait: 0})
		if err != nil || !rep.Halted {
			t.Errorf("cancel: %+v, %v", rep, err)
		}
		cancelled = true
	}})
	rep, err := worker.Resume(ctx, worker.ResumeOptions{Store: e.store, Redis: resumer, CampaignID: c.ID})
	if !cancelled {
		t.Fatal("the cancel did not run: resume rebuilt no counters")
	}
	if !errors.Is(err, campaign.ErrWrongState) || !strings.Contains(err.Error(), "cancelled while it was being resumed") {
		t.Errorf("resume: %v, want it to say the campaign was cancelled meanwhile", err)
	}
	if rep.To != "" {
		t.Errorf("resume reported the campaign going to %q; it was cancelled", rep.To)
	}
	if st := e.campaign(t, c.ID).State; st != campaign.StateCancelled {
		t.Fatalf("state %s, want cancelled", st)
	}
	if v, _ := e.rdb.Get(ctx, worker.HaltKey(c.ID)).Result(); v != string(campaign.StateCancelled) {
		t.Fatalf("halt mark %q, want cancelled", v)
	}
}

// A paused campaign whose start (launch --at) is still ahead goes back to scheduled on resume, one whose
// start has passed to running; the start is judged by Postgres's clock, as the workers judge it.
func TestAResumedCampaignWaitsForItsStart(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t, 3, nil)
	ctx := context.Background()
	c := e.launch(t, "later", 1)
	for _, tc := range []struct {
		startIn string
		want    campaign.State
	}{{"1 hour", campaign.StateScheduled}, {"-1 minute", campaign.StateRunning}} {
		if _, err := worker.Pause(ctx, worker.PauseOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID}); err != nil {
			t.Fatal(err)
		}
		e.exec(t, `UPDATE campaigns SET start_at = now() + $2::interval WHERE id = $1`, c.ID, tc.startIn)
		rep, err := worker.Resume(ctx, worker.ResumeOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID})
		if err != nil || rep.To != tc.want || e.campaign(t, c.ID).State != tc.want {
			t.Fatalf("start in %s: resume %+v, %v; state %s; want %s", tc.startIn, rep, err, e.campaign(t, c.ID).State, tc.want)
		}
	}
}

// failUnhalt fails every call that would clear key (the unhalt script), as a Redis that stops answering
// between resume's two steps would.
type failUnhalt struct{ key string }

func (h failUnhalt) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h failUnhalt) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		name := strings.ToLower(fmt.Sprint(args[0]))
		if (name == "evalsha" || name == "eval") && slices.Contains(args[1:], any(h.key)) {
			err := errors.New("i/o timeout")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}
func (h failUnhalt) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Redis answers resume's first read, then fails the clearing of the halt, after the campaign was moved to
// running in Postgres. Resume puts it back as it was: paused, with its halt, for the resume to be tried
// again. Left running and halted, every worker would hand its batches back for good.
func TestAResumeWhoseUnhaltFailsLeavesTheCampaignPaused(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t, 3, nil)
	ctx := context.Background()
	c := e.launch(t, "rollback", 1)
	if _, err := worker.Pause(ctx, worker.PauseOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID}); err != nil {
		t.Fatal(err)
	}
	resumer := redis.NewClient(e.rdb.(*redis.Client).Options())
	defer resumer.Close()
	resumer.AddHook(failUnhalt{key: worker.HaltKey(c.ID)})
	if _, err := worker.Resume(ctx, worker.ResumeOptions{Store: e.store, Redis: resumer, CampaignID: c.ID}); err == nil {
		t.Fatal("resume succeeded though the halt could not be cleared")
	}
	if st := e.campaign(t, c.ID).State; st != campaign.StatePaused {
		t.Fatalf("state %s after a resume whose unhalt failed, want paused", st)
	}
	if v, _ := e.rdb.Get(ctx, worker.HaltKey(c.ID)).Result(); v != string(campaign.StatePaused) {
		t.Fatalf("halt mark %q, want paused", v)
	}
	if _, err := worker.Resume(ctx, worker.ResumeOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID}); err != nil || e.campaign(t, c.ID).State != campaign.StateRunning {
		t.Fatalf("resume tried again: %v, state %s; want running", err, e.campaign(t, c.ID).State)
	}
}
