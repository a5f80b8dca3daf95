package worker

import (
	"context"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/providers"
)

// A live worker that gives up waiting for the provider's answer records its recipient unknown at once,
// its claim holding the unknown answer. The provider may still take the request it holds and send the
// receipt seconds later. `resume --resend-unknown` right then held back only the claims still in flight
// (and the recipients of a takeover after a Redis loss): this one was sent again at once, and the receipt
// of the first message came after the second had gone (outside, 6,691 of 6,691 e-mails went twice). It is
// now held back for the grace from when it was recorded, so the receipt proves it sent and nothing goes
// twice; once the grace is over, a recipient with no receipt is resent, as the flag says.
func TestAResendHoldsBackWhatALiveWorkerJustRecordedUnknown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := plan(t, 10)
	// The answers to u4's and u7's sends time out after their requests were written: their claims say
	// unknown.
	f.provider.fail = func(_ int, m providers.Message) error {
		if m.To == phone(4) || m.To == phone(7) {
			return &providers.Error{Provider: "test", Class: providers.Ambiguous, Err: context.DeadlineExceeded}
		}
		return nil
	}
	f.runAll(t)
	f.provider.fail = nil
	rep := f.resumeWithResend(t, "at once")
	if rep.Resent != 0 || rep.StillInFlight != 2 {
		t.Fatalf("resume --resend-unknown at once: resent %d, held %d; want none resent, u4 and u7 held back for %v", rep.Resent, rep.StillInFlight, rep.Grace)
	}
	// The provider took u4's request after all: its receipt comes within the grace.
	if _, err := f.store.RecordDeliveries(ctx, []campaign.Delivery{{Provider: "test", CampaignID: f.id, UserID: "u4",
		MessageID: "SMu4late", Status: campaign.DeliveryDelivered}}); err != nil {
		t.Fatal(err)
	}
	// The grace is over (as if it had passed): u7, with no evidence, is resent; u4 is sent, never again.
	f.ageUnknown(t)
	if rep := f.resumeWithResend(t, "after the grace"); rep.Resent != 1 || rep.StillInFlight != 0 {
		t.Fatalf("resume --resend-unknown after the grace: resent %d, held %d; want u7 alone resent", rep.Resent, rep.StillInFlight)
	}
	f.runAll(t)
	for _, u := range []string{"u4", "u7"} {
		if st, reason, _ := f.status(t, u); st != campaign.StatusSent {
			t.Errorf("%s is %s (%s), want sent", u, st, reason)
		}
	}
	if n := len(f.provider.sentTo(phone(4))); n != 1 {
		t.Errorf("u4's number reached %d times by this engine's sends, want once: its late-taken first message is proved by the receipt", n)
	}
	if n := len(f.provider.sentTo(phone(7))); n != 2 {
		t.Errorf("u7's number reached %d times, want twice (the unknown send and the resend)", n)
	}
}

// SendGrid posts its events in batches, and a receipt can come minutes after the message: `resume
// --resend-unknown` run once the 30 s grace was over sent the recipients a worker had recorded unknown
// again, and the events of their first messages came after the second had gone (outside: 1,600 and 3,200
// second e-mails with events 90 and 100 s late). A recipient left unknown through a provider whose
// receipts name it is now held back for ReceiptGrace from when it was recorded, so its receipt proves it
// sent; one left unknown through a provider whose receipts never can (Netgsm) is not held back for it.
func TestAResendWaitsForReceiptsThatCanStillCome(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := plan(t, 10)
	f.provider.fail = func(_ int, m providers.Message) error {
		if m.To == phone(4) || m.To == phone(7) || m.To == phone(8) {
			return &providers.Error{Provider: "test", Class: providers.Ambiguous, Err: context.DeadlineExceeded}
		}
		return nil
	}
	f.runAll(t)
	f.provider.fail = nil
	exec := func(sql string) {
		t.Helper()
		if _, err := f.db.Exec(ctx, sql, f.id); err != nil {
			t.Fatal(err)
		}
	}
	// u8 went through Netgsm, whose reports cannot name it; all three were recorded unknown 2 minutes
	// ago, past the 30 s grace and within ReceiptGrace.
	exec(`UPDATE campaign_recipients SET provider = CASE WHEN user_id = 'u8' THEN 'netgsm' ELSE provider END,
		updated_at = now() - interval '2 minutes' WHERE campaign_id = $1 AND status = 'unknown'`)
	rep := f.resumeWithResend(t, "2 minutes after")
	if rep.Resent != 1 || rep.AwaitingReceipts != 2 || rep.StillInFlight != 0 ||
		rep.ReceiptWait < ReceiptGrace-3*time.Minute || rep.ReceiptWait > ReceiptGrace-time.Minute {
		t.Fatalf("resume --resend-unknown 2 minutes after: resent %d, awaiting receipts %d (for %v), held %d; want u8 resent, u4 and u7 awaiting theirs for about %v",
			rep.Resent, rep.AwaitingReceipts, rep.ReceiptWait, rep.StillInFlight, ReceiptGrace-2*time.Minute)
	}
	if st, _, _ := f.status(t, "u8"); st != campaign.StatusPending {
		t.Fatalf("u8 (Netgsm) is %s, want pending again", st)
	}
	// u4's event comes 3 minutes late: the provider took it.
	if _, err := f.store.RecordDeliveries(ctx, []campaign.Delivery{{Provider: "test", CampaignID: f.id, UserID: "u4",
		MessageID: "SMu4late", Status: campaign.DeliveryDelivered}}); err != nil {
		t.Fatal(err)
	}
	exec(`UPDATE campaign_recipients SET updated_at = now() - interval '11 minutes' WHERE campaign_id = $1 AND status = 'unknown'`)
	if rep := f.resumeWithResend(t, "11 minutes after"); rep.Resent != 1 || rep.AwaitingReceipts != 0 {
		t.Fatalf("resume --resend-unknown 11 minutes after: resent %d, awaiting %d; want u7 alone resent", rep.Resent, rep.AwaitingReceipts)
	}
	f.runAll(t)
	for u, want := range map[string]int{"u4": 1, "u7": 2, "u8": 2} {
		if st, reason, _ := f.status(t, u); st != campaign.StatusSent {
			t.Errorf("%s is %s (%s), want sent", u, st, reason)
		}
		if n := len(f.provider.sentTo(phone(map[string]int{"u4": 4, "u7": 7, "u8": 8}[u]))); n != want {
			t.Errorf("%s's number reached %d times by this engine's sends, want %d", u, n, want)
		}
	}
	// u7's first message was taken after all, its receipt 12 minutes late: u7 got two messages. The
	// audit says so, once a message however often the receipt comes; the row keeps the resend's.
	var resendID string
	if err := f.db.QueryRow(ctx, `SELECT provider_message_id FROM campaign_recipients WHERE campaign_id = $1 AND user_id = 'u7'`, f.id).Scan(&resendID); err != nil || resendID == "" {
		t.Fatalf("u7's message ID %q, %v", resendID, err)
	}
	for i, ev := range []string{"SMu7first-delivered", "SMu7first-read"} {
		applied, err := f.store.RecordDeliveries(ctx, []campaign.Delivery{{Provider: "test", CampaignID: f.id, UserID: "u7",
			MessageID: "SMu7first", Status: campaign.DeliveryDelivered, EventID: ev}})
		if err != nil {
			t.Fatal(err)
		}
		if want := int64(1 - i); applied.SecondSends != want {
			t.Errorf("receipt %s of u7's first message: %d second messages, want %d", ev, applied.SecondSends, want)
		}
	}
	var n int
	var id string
	if err := f.db.QueryRow(ctx, `SELECT (SELECT count(*) FROM send_log WHERE campaign_id = $1 AND user_id = 'u7' AND provider_message_id = 'SMu7first' AND status = 'sent' AND reason = $2),
		(SELECT provider_message_id FROM campaign_recipients WHERE campaign_id = $1 AND user_id = 'u7')`, f.id, campaign.SecondSendByReceipt).Scan(&n, &id); err != nil {
		t.Fatal(err)
	}
	if n != 1 || id != resendID {
		t.Errorf("u7's first message audited %d times as a second message, its row names %q; want once, and %q", n, id, resendID)
	}
}

// A cancel that commits after `resume --resend-unknown` read the campaign (the two overlapping) wins:
// the resend moves nobody back to pending in a cancelled campaign, where they would wait for batch runs
// to close them, and resume says the campaign was cancelled instead of reporting it running.
func TestAResendDoesNotReopenRecipientsOfACancelledCampaign(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := plan(t, 10)
	f.runWithUnknown(t, 4)
	if _, err := f.db.Exec(ctx, `UPDATE campaigns SET state = 'cancelled' WHERE id = $1`, f.id); err != nil {
		t.Fatal(err)
	}
	n, err := f.store.Resend(ctx, f.id, []string{"u4"})
	if err != nil || n != 0 {
		t.Fatalf("resend in a cancelled campaign moved %d (%v), want none", n, err)
	}
	if st, _, _ := f.status(t, "u4"); st != campaign.StatusUnknown {
		t.Errorf("u4 is %s, want unknown still", st)
	}
}

// resumeWithResend runs `resume --resend-unknown` on f's campaign (step names it in a failure).
func (f *fixture) resumeWithResend(t *testing.T, step string) ResumeReport {
	t.Helper()
	rep, err := Resume(context.Background(), ResumeOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id, ResendUnknown: true})
	if err != nil {
		t.Fatalf("%s: %v", step, err)
	}
	return rep
}

// A recipient left unknown is held back for its receipt only when one may come: the campaign's rows name
// a provider whose receipts name the recipient, or name none (every claim that named one was lost). A
// campaign that went only through Netgsm or FCM holds nobody back for receipts that never come.
func TestReceiptsMayComeOnlyThroughAProviderThatSendsThem(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		proof campaign.UnknownProof
		want  bool
	}{
		{"netgsm only", campaign.UnknownProof{"netgsm": {Via: 5}, "": {Via: 2, NoMessageID: 2}}, false},
		{"fcm only", campaign.UnknownProof{"fcm": {Via: 5}}, false},
		{"twilio", campaign.UnknownProof{"twilio": {Via: 5}}, true},
		{"netgsm and sendgrid", campaign.UnknownProof{"netgsm": {Via: 5}, "sendgrid": {Via: 1}}, true},
		{"no provider named", campaign.UnknownProof{"": {Via: 3, NoMessageID: 3}}, true},
		{"twilio named by no recipient", campaign.UnknownProof{"twilio": {}, "netgsm": {Via: 1}}, false},
	} {
		if got := receiptsMayCome(tc.proof); got != tc.want {
			t.Errorf("%s: receipts may come %v, want %v", tc.name, got, tc.want)
		}
	}
}

// The same through Resume: a campaign sent only through Netgsm resends its unknown recipient whose provider
// is no longer known once the in-flight grace is over, with no wait for a receipt (mutation: the receipt
// grace for every campaign).
func TestAResendOfACampaignWithoutReceiptsDoesNotWaitForThem(t *testing.T) {
	t.Parallel()
	f := plan(t, 10)
	f.provider.fail = func(_ int, m providers.Message) error {
		if m.To == phone(4) {
			return &providers.Error{Provider: "test", Class: providers.Ambiguous, Err: context.DeadlineExceeded}
		}
		return nil
	}
	f.runAll(t)
	// The others went through Netgsm; u4's claim, which named its provider, was lost with Redis's data.
	if _, err := f.db.Exec(context.Background(), `UPDATE campaign_recipients SET
		provider = CASE WHEN status = 'sent' THEN 'netgsm' END,
		updated_at = CASE WHEN status = 'unknown' THEN now() - interval '2 minutes' ELSE updated_at END
		WHERE campaign_id = $1 AND status IN ('sent', 'unknown')`, f.id); err != nil {
		t.Fatal(err)
	}
	if rep := f.resumeWithResend(t, "2 minutes after"); rep.Resent != 1 || rep.AwaitingReceipts != 0 {
		t.Fatalf("resume --resend-unknown of a Netgsm campaign 2 minutes after: resent %d, awaiting receipts %d; want u4 resent", rep.Resent, rep.AwaitingReceipts)
	}
}
