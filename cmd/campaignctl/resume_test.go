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

// An unknown recipient with no message ID, in a campaign sent through Netgsm: Netgsm's reports are asked
// for by message ID, so nothing can show whether it took the message, and resume says that a resend sends
// a second message to each whose first was accepted, before the resend and with it. Sent through Twilio
// (whose status callbacks name the recipient), the campaign gets no such warning.
func TestResumeWarnsOfUnknownRecipientsNoReceiptCanClear(t *testing.T) {
	t.Parallel()
	env, id, db, _ := plannedEnv(t)
	ctx := context.Background()
	exec := func(sql string) {
		t.Helper()
		if _, err := db.Exec(ctx, sql, id); err != nil {
			t.Fatal(err)
		}
	}
	// a: unknown, its answer lost; b: sent through Netgsm; c: pending, so that the campaign runs on.
	exec(`UPDATE campaign_recipients SET status = CASE WHEN user_id = 'a' THEN 'unknown' ELSE 'sent' END,
		provider = CASE WHEN user_id = 'a' THEN NULL ELSE 'netgsm' END,
		provider_message_id = CASE WHEN user_id = 'a' THEN NULL ELSE '17' || user_id END,
		updated_at = now() - interval '1 hour' WHERE campaign_id = $1 AND user_id <> 'c'`)
	_, stderr, code := cli(t, env, "resume", id)
	if code != 0 || !strings.Contains(stderr, "warning: 1 of the unknown recipients have no provider message ID, and this campaign's messages went through netgsm (1 recipients sent or left unknown through it): Netgsm's reports are asked for by job ID") ||
		strings.Contains(stderr, "FCM") || !strings.Contains(stderr, "`--resend-unknown` would send a second message to each whose first was accepted") {
		t.Fatalf("resume of a Netgsm campaign with an unknown recipient without message ID: exit %d, %s", code, stderr)
	}

	// Twilio's status callbacks come for the campaign (b's did): one can still clear a, whether its claim
	// named Twilio or was lost.
	exec(`UPDATE campaign_recipients SET provider = 'twilio', delivery = 'delivered' WHERE campaign_id = $1 AND status = 'sent'`)
	if _, stderr, code := cli(t, env, "resume", id); code != 0 || strings.Contains(stderr, "message ID") {
		t.Fatalf("resume of a Twilio campaign whose callbacks come: exit %d, %s", code, stderr)
	}
	exec(`UPDATE campaign_recipients SET provider = 'twilio' WHERE campaign_id = $1 AND user_id = 'a'`)
	if _, stderr, code := cli(t, env, "resume", id); code != 0 || strings.Contains(stderr, "message ID") {
		t.Fatalf("resume of a Twilio campaign whose callbacks come, a left unknown through Twilio: exit %d, %s", code, stderr)
	}
	// No callback has come for any of its messages (TWILIO_STATUS_CALLBACK unset, or the callbacks do not
	// reach the receipts endpoint): none will clear a either, and a resend would double its message.
	exec(`UPDATE campaign_recipients SET delivery = NULL WHERE campaign_id = $1`)
	if _, stderr, code := cli(t, env, "resume", id); code != 0 ||
		!strings.Contains(stderr, "warning: 1 of the unknown recipients have no provider message ID, and this campaign's messages went through twilio (2 recipients sent or left unknown through it): no status callback has come for any of this campaign's messages through Twilio (TWILIO_STATUS_CALLBACK not set on the workers") {
		t.Fatalf("resume of a Twilio campaign no callback came for: exit %d, %s", code, stderr)
	}
	// Left unknown by Twilio (its answer timed out) in a campaign that also sent through Netgsm, with no
	// Twilio callback come: both are named, each with why.
	exec(`UPDATE campaign_recipients SET provider = CASE WHEN status = 'sent' THEN 'netgsm' ELSE 'twilio' END WHERE campaign_id = $1 AND user_id <> 'c'`)
	if _, stderr, code := cli(t, env, "resume", id); code != 0 ||
		!strings.Contains(stderr, "went through netgsm (1 recipients sent or left unknown through it) and twilio (1): Netgsm's reports are asked for by job ID, which came only in the lost answer; no status callback has come") {
		t.Fatalf("resume of a campaign whose unknown recipient went through Twilio, no callback come, beside Netgsm: exit %d, %s", code, stderr)
	}

	// Recorded unknown through Twilio 2 minutes ago: its callback may still come, so it is not resent yet.
	exec(`UPDATE campaign_recipients SET updated_at = now() - interval '2 minutes' WHERE campaign_id = $1 AND user_id = 'a'`)
	if out, stderr, code := cli(t, env, "resume", id, "--resend-unknown"); code != 0 || strings.Contains(out, "will be sent again") ||
		!strings.Contains(out, "1 unknown recipients were recorded unknown less than 10m0s ago through a provider whose receipts name the recipient") ||
		!strings.Contains(out, "--resend-unknown` again in 7m5") && !strings.Contains(out, "--resend-unknown` again in 8m0s") {
		t.Fatalf("resume --resend-unknown 2 minutes after a was recorded unknown through Twilio: exit %d\n%s%s", code, out, stderr)
	}
	exec(`UPDATE campaign_recipients SET provider = CASE WHEN status = 'sent' THEN 'netgsm' END,
		updated_at = now() - interval '1 hour' WHERE campaign_id = $1 AND user_id <> 'c'`)
	out, stderr, code := cli(t, env, "resume", id, "--resend-unknown")
	if code != 0 || !strings.Contains(out, "1 unknown recipients will be sent again") ||
		!strings.Contains(stderr, "those made pending again get a second message wherever the first was accepted") {
		t.Fatalf("resume --resend-unknown of the Netgsm campaign: exit %d\n%s%s", code, out, stderr)
	}
}
