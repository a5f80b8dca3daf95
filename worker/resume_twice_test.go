package worker

import (
	"context"
	"sync"
	"testing"

	"github.com/campaignctl/campaignctl/campaign"
)

// `resume` run twice at once on a paused campaign (two operators, a retried script): both succeed, as a
// resume of a running campaign does; neither says the campaign is in the wrong state. (Mutation: failing
// when another resume started it between the read and the start, as before, fails one of them in most
// rounds.)
func TestTwoResumesAtOnceBothSucceed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := plan(t, 10)
	for round := 0; round < 10; round++ {
		if _, err := Pause(ctx, PauseOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id}); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = Resume(ctx, ResumeOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id})
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: resume %d of 4 at once: %v", round, i+1, err)
			}
		}
		if c := f.campaign(t); c.State != campaign.StateRunning {
			t.Fatalf("round %d: the campaign is %s after the resumes, want running", round, c.State)
		}
	}
}
