package main

import (
	"context"
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

// A completed campaign has nothing to resume: the refusal says so, and with --resend-unknown says whether
// any recipient is unknown to send again.
func TestResumeOfACompletedCampaignSaysWhatThereIsToSendAgain(t *testing.T) {
	t.Parallel()
	env, id, db, _ := plannedEnv(t)
	ctx := context.Background()
	if _, err := db.Exec(ctx, `UPDATE campaign_recipients SET status = CASE WHEN user_id = 'a' THEN 'unknown' ELSE 'sent' END WHERE campaign_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `UPDATE campaigns SET state = 'completed', finished_at = now() WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := cli(t, env, "resume", id); code != 2 || !strings.Contains(stderr, "nothing to resume") || !strings.Contains(stderr, "1 recipients are unknown") || !strings.Contains(stderr, "--resend-unknown") {
		t.Fatalf("resume of a completed campaign with an unknown recipient: exit %d, %s", code, stderr)
	}
	if _, err := db.Exec(ctx, `UPDATE campaign_recipients SET status = 'sent' WHERE campaign_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := cli(t, env, "resume", id, "--resend-unknown"); code != 2 || !strings.Contains(stderr, "none of its recipients is unknown") {
		t.Fatalf("resume --resend-unknown of a completed campaign with none unknown: exit %d, %s", code, stderr)
	}
}
