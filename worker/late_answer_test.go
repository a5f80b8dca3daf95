package worker

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/providers"
)

// A run is stopped (SIGSTOP) after the provider accepted u1's message (answered) and u2's (not answered
// yet); Redis loses its data meanwhile; another run takes the chunk over once the lease runs out, records
// the whole chunk unknown (no claim tells it what went). The stopped run then wakes with u2's answer and
// records its outcomes: u1 and u2 are sent, and the resend of the unknown (resume --resend-unknown) sends
// the others once and nobody a second message. (Mutation: Record dropping the late sent outcomes, as before, leaves u1 and u2 unknown, and
// the resend sends them twice.)
func TestAStoppedRunsAnswersOutliveARedisLossAndATakeover(t *testing.T) {
	t.Parallel()
	f, wake := stoppedRunTakenOver(t)
	wake()
	for _, u := range []string{"u1", "u2"} {
		if st, reason, _ := f.status(t, u); st != campaign.StatusSent || reason != campaign.LateAnswer {
			t.Errorf("%s is %s (%q) once its run woke with the provider's acceptance, want sent", u, st, reason)
		}
	}
	f.resendUnknown(t)
	for _, i := range []int{1, 2, 4, 7, 8} {
		if n := len(f.provider.sentTo(phone(i))); n != 1 {
			st, reason, _ := f.status(t, fmt.Sprintf("u%d", i))
			t.Errorf("u%d got %d messages, want 1 (%s %q)", i, n, st, reason)
		}
	}
}

// The same order, but the operator resends the unknown before the stopped run wakes (past the grace, by
// hand): u1 and u2 get a second message, which nothing here could have known to hold back. When the
// stopped run wakes, the audit gets the first messages too, so that send_log holds every message the
// provider took. (Mutation: not auditing a sent outcome that moved nothing leaves one message each.)
func TestAStoppedRunsAnswersAfterAResendAreAudited(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f, wake := stoppedRunTakenOver(t)
	f.resendUnknown(t)
	wake()
	for _, u := range []string{"u1", "u2"} {
		var sent, second int
		err := f.db.QueryRow(ctx, `SELECT count(DISTINCT provider_message_id), count(*) FILTER (WHERE reason = $3)
			FROM send_log WHERE campaign_id = $1 AND user_id = $2 AND status = 'sent'`, f.id, u, campaign.SecondSend).Scan(&sent, &second)
		if err != nil {
			t.Fatal(err)
		}
		if sent != 2 || second != 1 {
			t.Errorf("%s: %d messages audited (%d as a second one), want both the provider took", u, sent, second)
		}
	}
	// The same answer again (a chunk recorded twice) is not audited twice.
	var first string
	if err := f.db.QueryRow(ctx, `SELECT provider_message_id FROM send_log WHERE campaign_id = $1 AND user_id = 'u1' AND reason = $2`,
		f.id, campaign.SecondSend).Scan(&first); err != nil {
		t.Fatal(err)
	}
	again := []campaign.Outcome{{UserID: "u1", Status: campaign.StatusSent, MessageID: first}}
	if n, err := f.store.AuditSecondSends(ctx, f.id, again); err != nil || n != 0 {
		t.Fatalf("u1's first message audited again: %d (%v)", n, err)
	}
}

// stoppedRunTakenOver plans 10 customers and replays the order: a run is stopped (SIGSTOP) after the
// provider accepted u1's message (answered) and u2's (not answered yet); Redis loses its data meanwhile;
// another run takes the chunk over once the lease runs out and records the whole chunk unknown (no claim
// tells it what went). wake lets the stopped run go on, and returns once it has ended.
func stoppedRunTakenOver(t *testing.T) (f *fixture, wake func()) {
	t.Helper()
	ctx := context.Background()
	f = plan(t, 10) // eligible in batch 0: u1 u2 u4 u7 u8
	frozen, woken := make(chan struct{}), make(chan struct{})
	stopped := &stopAfter{scriptedProvider: f.provider, at: phone(2), frozen: frozen, wake: woken, once: &sync.Once{}}
	ttl := 300 * time.Millisecond
	a, _, _ := f.faulty(t, func(c *Config) {
		c.LeaseTTL, c.Owner = ttl, "a"
		c.Providers = map[campaign.Channel]providers.Provider{campaign.ChannelSMS: stopped}
	})
	b, _, _ := f.faulty(t, func(c *Config) { c.LeaseTTL, c.Owner = ttl, "b" })
	done := make(chan error, 1)
	go func() { done <- a.RunBatch(ctx, f.id, 0) }()
	<-frozen
	if err := f.rdb.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * ttl) // the stopped run's lease runs out
	notFailure(t, b.RunBatch(ctx, f.id, 0))
	for _, u := range []string{"u1", "u2"} {
		if st, _, _ := f.status(t, u); st != campaign.StatusUnknown {
			t.Fatalf("%s is %s after the takeover, want unknown (its claim went with Redis's data)", u, st)
		}
	}
	return f, func() {
		t.Helper()
		close(woken)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("the woken run did not end")
		}
	}
}

// resendUnknown does what `resume --resend-unknown` does once the grace is over: the unknown recipients'
// claims are forgotten, they are pending again, and their batches run.
func (f *fixture) resendUnknown(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	users, err := f.store.Unknown(ctx, f.id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ForgetUnanswered(ctx, f.rdb, f.campaign(t), users, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Resend(ctx, f.id, users); err != nil {
		t.Fatal(err)
	}
	f.runAll(t)
}

// stopAfter is a provider that, once, accepts the message to at and then stops before answering (frozen
// closed) until wake is closed.
type stopAfter struct {
	*scriptedProvider
	at           string
	frozen, wake chan struct{}
	once         *sync.Once
}

func (p *stopAfter) Send(ctx context.Context, m providers.Message) (providers.Result, error) {
	res, err := p.scriptedProvider.Send(ctx, m)
	if m.To == p.at {
		p.once.Do(func() {
			close(p.frozen)
			<-p.wake
		})
	}
	return res, err
}
