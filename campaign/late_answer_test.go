package campaign_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
)

// A run stopped (SIGSTOP, a long pause) after the provider accepted u2's message loses its lease; Redis
// loses the claim that held the answer; the sweeper records u2 unknown. When the run wakes and records its
// outcomes, the acceptance proves u2 sent, as a receipt would: u2 becomes sent with the message ID, the
// transition is audited, the counters move from unknown to sent, and `resume --resend-unknown` finds
// nobody to send again. A late answer that proves nothing (unknown, failed) changes nothing. (Mutation:
// Record touching pending rows only, as before, leaves u2 unknown, and the resend sends it twice.)
func TestALateAnswerProvesARecipientRecordedUnknownSent(t *testing.T) {
	t.Parallel()
	db, c, store, batch := plannedForU2(t, "late")
	ctx := context.Background()
	l := campaign.Lease{Batch: batch, Token: "run-1", Epoch: "e", TTL: time.Minute}
	if _, err := store.LeaseChunk(ctx, c, []string{"u2"}, l); err != nil {
		t.Fatal(err)
	}
	// The sweeper, under another run's lease, with the claim gone.
	swept := "Redis lost its data while a worker that has since stopped was sending this chunk"
	sweeper := campaign.Lease{Batch: batch, Token: "run-2", Epoch: "e2", TTL: time.Minute}
	if moved, err := store.Record(ctx, c.ID, []campaign.Outcome{{UserID: "u2", Status: campaign.StatusUnknown, Reason: swept}}, sweeper, nil); err != nil || moved[campaign.StatusUnknown] != 1 {
		t.Fatalf("the sweep: moved %v (%v), want u2 unknown", moved, err)
	}
	var code string
	if err := db.QueryRow(ctx, `SELECT code FROM campaign_recipients WHERE campaign_id = $1 AND user_id = 'u2'`, c.ID).Scan(&code); err != nil || code == "" {
		t.Fatalf("u2's code after the sweep: %q (%v)", code, err)
	}

	// Late answers that prove nothing leave u2 unknown.
	for _, o := range []campaign.Outcome{{UserID: "u2", Status: campaign.StatusUnknown, Reason: "read answer: context deadline exceeded"},
		{UserID: "u2", Status: campaign.StatusFailed, Reason: "twilio 21211: invalid number"}} {
		if moved, err := store.Record(ctx, c.ID, []campaign.Outcome{o}, l, nil); err != nil || len(moved) != 0 {
			t.Fatalf("a late %s: moved %v (%v), want nothing", o.Status, moved, err)
		}
	}

	// The run wakes with the provider's acceptance.
	at := time.Now().Add(-20 * time.Second).Truncate(time.Microsecond)
	late := []campaign.Outcome{{UserID: "u2", Status: campaign.StatusSent, MessageID: "SMlate", Segments: 1, Provider: "twilio", SentAt: at}}
	moved, err := store.Record(ctx, c.ID, late, l, nil)
	if err != nil || moved[campaign.StatusSent] != 1 || moved[campaign.StatusUnknown] != -1 || len(moved) != 2 {
		t.Fatalf("the late answer: moved %v (%v), want sent +1, unknown -1", moved, err)
	}
	var status, reason, lastErr, msgID, provider, codeAfter string
	var attempts int
	var sentAt time.Time
	var everUnknown bool
	err = db.QueryRow(ctx, `SELECT status, reason, last_error, provider_message_id, provider, code, attempts, sent_at, ever_unknown
		FROM campaign_recipients WHERE campaign_id = $1 AND user_id = 'u2'`, c.ID).Scan(&status, &reason, &lastErr, &msgID, &provider, &codeAfter, &attempts, &sentAt, &everUnknown)
	if err != nil {
		t.Fatal(err)
	}
	if status != campaign.StatusSent || reason != campaign.LateAnswer || lastErr != swept || msgID != "SMlate" || provider != "twilio" ||
		codeAfter != code || attempts != 1 || !sentAt.Equal(at) || !everUnknown {
		t.Fatalf("u2 after the late answer: %s (%q, last error %q), message %q via %q, code %q (had %q), %d attempts, sent at %v (want %v), ever unknown %v",
			status, reason, lastErr, msgID, provider, codeAfter, code, attempts, sentAt, at, everUnknown)
	}
	if n := count(t, db, `SELECT count(*) FROM send_log WHERE campaign_id = $1 AND user_id = 'u2' AND status = 'sent' AND provider_message_id = 'SMlate'`, c.ID); n != 1 {
		t.Fatalf("%d audit rows of u2's late answer, want 1", n)
	}
	unknown, err := store.Unknown(ctx, c.ID)
	if err != nil || slices.Contains(unknown, "u2") {
		t.Fatalf("unknown recipients %v (%v): u2 is proved sent", unknown, err)
	}
	if n, err := store.Resend(ctx, c.ID, []string{"u2"}); err != nil || n != 0 {
		t.Fatalf("resend of u2: %d (%v), want none: it was sent", n, err)
	}
	// The same answer again (a redelivered record) moves nothing.
	if moved, err := store.Record(ctx, c.ID, late, l, nil); err != nil || len(moved) != 0 {
		t.Fatalf("the late answer again: moved %v (%v), want nothing", moved, err)
	}
}
