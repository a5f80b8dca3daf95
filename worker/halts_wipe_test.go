package worker_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/worker"
)

// A paused campaign (one pause ever) is resumed. Just after resume read the halts, Redis loses its data
// (restarted without persistence, or emptied), and another operator pauses the campaign again: the pause
// finds it still paused, writes its halt anew and is acknowledged (Halted). Were the halts counted, the
// count, lost with everything else, would start over at 1: the very value resume read, and resume's
// UnhaltIf would take it for "no halt since", delete the acknowledged pause's halt, and the campaign would
// run. Each halt has a token of its own instead. Without the wipe the same order keeps the campaign paused
// (TestAPauseOfAStillPausedCampaignDuringAResumeStands).
func TestAPauseDuringAResumeStandsWhenRedisLostItsDataBetween(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t, 3, nil)
	ctx := context.Background()
	c := e.launch(t, "wipe-again", 1)
	if _, err := worker.Pause(ctx, worker.PauseOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID}); err != nil {
		t.Fatal(err)
	}
	if n, _ := state.Halts(ctx, e.rdb, c.ID); n == "" {
		t.Fatal("no halts after a pause")
	}
	resumer := redis.NewClient(e.rdb.(*redis.Client).Options())
	defer resumer.Close()
	var paused worker.PauseReport
	resumer.AddHook(&afterRead{key: state.HaltsKey(c.ID), do: func() {
		// Redis loses its data (the test's own DB).
		if err := e.rdb.FlushDB(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		rep, err := worker.Pause(ctx, worker.PauseOptions{Store: e.store, Redis: e.rdb, CampaignID: c.ID})
		if err != nil || rep.Was != campaign.StatePaused || !rep.Halted {
			t.Errorf("second pause: %+v, %v; want it to find the campaign paused and write its halt", rep, err)
		}
		paused = rep
	}})
	_, err := worker.Resume(ctx, worker.ResumeOptions{Store: e.store, Redis: resumer, CampaignID: c.ID})
	t.Logf("resume: %v", err)
	if !paused.Halted {
		t.Fatal("the second pause did not run")
	}
	halt, _ := e.rdb.Get(ctx, worker.HaltKey(c.ID)).Result()
	st := e.campaign(t, c.ID).State
	// A worker takes the campaign's first batch up after the pause was acknowledged.
	prov := newGatedProvider()
	close(prov.release)
	if err := <-e.liveWorker(c.ID, 0, prov); err != nil {
		t.Logf("batch run: %v", err)
	}
	if n := prov.calls(); n > 0 {
		t.Errorf("%d messages sent after the second pause was acknowledged (Halted)", n)
	}
	if st != campaign.StatePaused || halt != string(campaign.StatePaused) {
		t.Fatalf("after a pause acknowledged (Halted) during the resume: state %s, halt mark %q; want paused and paused: "+
			"resume took the halt written after Redis lost its data for the one it read, and cleared it", st, halt)
	}
}
