package worker

import (
	"context"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/providers"
)

// A recipient's sent_at is when its request went out, not when the chunk's outcomes were written, so a
// receipt (dated when the provider accepted the message, or later) never comes before it, and a status-16
// report dated with it refuses only what was sent. The provider here answers 30 ms after accepting each
// message; one send at a time and a window of 8 are both checked. (Mutation: sent_at set to the time of
// the record, as before, is 30 ms or more after the acceptance.)
func TestSentAtIsWhenTheRequestWentOut(t *testing.T) {
	t.Parallel()
	for _, window := range []int{1, 8} {
		f := plan(t, 20)
		accepted := map[string]time.Time{}
		f.provider.fail = func(_ int, m providers.Message) error {
			accepted[m.To] = time.Now() // under the provider's lock
			return nil
		}
		slow := &answerLater{scriptedProvider: f.provider, after: 30 * time.Millisecond}
		h, _, _ := f.faulty(t, func(c *Config) {
			c.SendWindow = window
			c.Providers = map[campaign.Channel]providers.Provider{campaign.ChannelSMS: slow}
		})
		from := time.Now()
		for b := 0; b < f.batches; b++ {
			notFailure(t, h.RunBatch(context.Background(), f.id, b))
		}
		rows, err := f.db.Query(context.Background(), `SELECT address, sent_at FROM campaign_recipients
			WHERE campaign_id = $1 AND status = 'sent'`, f.id)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for rows.Next() {
			var addr string
			var sentAt time.Time
			if err := rows.Scan(&addr, &sentAt); err != nil {
				t.Fatal(err)
			}
			n++
			at, ok := accepted[addr]
			switch {
			case !ok:
				t.Fatalf("window %d: %s is sent but the provider never accepted it", window, addr)
			case sentAt.After(at) || sentAt.Before(from.Truncate(time.Microsecond)):
				t.Errorf("window %d: %s: sent_at %s, accepted at %s (the run began at %s): sent_at must be when its request went out",
					window, addr, sentAt.Format(time.RFC3339Nano), at.Format(time.RFC3339Nano), from.Format(time.RFC3339Nano))
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if n == 0 || n != len(accepted) {
			t.Fatalf("window %d: %d sent rows, %d accepted", window, n, len(accepted))
		}
	}
}

// answerLater is a provider whose answer comes a while (after) after it accepted the message.
type answerLater struct {
	*scriptedProvider
	after time.Duration
}

func (p *answerLater) Send(ctx context.Context, m providers.Message) (providers.Result, error) {
	res, err := p.scriptedProvider.Send(ctx, m)
	time.Sleep(p.after)
	return res, err
}
