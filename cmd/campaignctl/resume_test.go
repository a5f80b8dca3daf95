package main

import (
	"strings"
	"testing"

	"github.com/campaignctl/campaignctl/worker"
)

// A launch killed after its plan committed and before any batch was queued: resume queues every batch,
// once, however often it runs.
func TestResumeQueuesWhatALaunchDidNotAndIsIdempotent(t *testing.T) {
	t.Parallel()
	env, id, _, insp := plannedEnv(t)
	out, stderr, code := cli(t, env, "resume", id)
	if code != 0 || !strings.Contains(out, "3 batches re-enqueued, 0 already queued") {
		t.Fatalf("first resume: exit %d\n%s%s", code, out, stderr)
	}
	out, stderr, code = cli(t, env, "resume", id)
	if code != 0 || !strings.Contains(out, "0 batches re-enqueued, 3 already queued") {
		t.Fatalf("second resume: exit %d\n%s%s", code, out, stderr)
	}
	info, err := insp.GetQueueInfo(worker.Queue)
	if err != nil {
		t.Fatal(err)
	}
	if info.Pending != 3 {
		t.Fatalf("%d batch tasks queued after two resumes, want 3", info.Pending)
	}

	_, stderr, code = cli(t, env, "resume", "424242")
	if code != 2 || !strings.Contains(stderr, "no campaign has id 424242") {
		t.Fatalf("resume of an unknown campaign: exit %d, %s", code, stderr)
	}
}
