package worker

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/faults"
	"github.com/campaignctl/campaignctl/providers"
)

// A cap low enough that a send waits longer for its tokens than its consents may be old (2 segments a
// second, messages of 3 segments: 1.5 s a message), and a Postgres whose answers take 60 ms (a loaded or
// distant server). The consents, read again after the wait, made the tokens stale; the tokens, taken
// again, made the consents stale; after four rounds the batch was handed back, and came back to the same:
// not one message went. With the consents read again inside the tokens' second wait only, every message
// took two waits: half the cap. They are now read inside the first, before the tokens are due.
//
// At 150 ms, longer than the read's first lead (a tenth of a second), the first read overran the tokens'
// moment: the next reads begin twice as long ahead as the last took.
func TestALowCapSendGoesWhenPostgresAnswersSlowly(t *testing.T) {
	t.Parallel()
	for _, delay := range []time.Duration{60 * time.Millisecond, 150 * time.Millisecond} {
		t.Run(delay.String(), func(t *testing.T) {
			t.Parallel()
			lowCapSlowPostgres(t, delay)
		})
	}
}

func lowCapSlowPostgres(t *testing.T, delay time.Duration) {
	f := planWith(t, 30, func(s *campaign.Spec) { s.Message = strings.Repeat("Kampanya ", 40) + "{{.code}}" }) // 3 segments
	var mu sync.Mutex
	var sentAt []time.Time
	f.provider.before = func(providers.Message) { mu.Lock(); sentAt = append(sentAt, time.Now()); mu.Unlock() }
	sent := func() int { mu.Lock(); defer mu.Unlock(); return len(sentAt) }
	h, _, fs := f.faulty(t, func(c *Config) {
		c.Providers = map[campaign.Channel]providers.Provider{campaign.ChannelSMS: segmentProvider{namedProvider{f.provider, "first"}}}
		c.ProviderRates = map[string]float64{"first": 2}
	})
	fs.Add(&faults.Rule{Match: faults.Method("LeaseChunk"), Kind: faults.SlowReply, Delay: delay})
	// The batch's runs, as Asynq would run them (a run's context has no deadline of its own here: a
	// deadline would bound its waits for tokens), until six messages went or 20 s passed.
	const want = 6
	var errs []string
	start := time.Now()
	end := start.Add(20 * time.Second)
	for time.Now().Before(end) && sent() < want {
		ctx, cancel := context.WithCancel(context.Background())
		stop := time.AfterFunc(time.Until(end), cancel)
		go func() {
			for ctx.Err() == nil && sent() < want {
				time.Sleep(20 * time.Millisecond)
			}
			cancel()
		}()
		err := h.RunBatch(ctx, f.id, 0)
		stop.Stop()
		cancel()
		var re *RetryError
		if errors.As(err, &re) {
			errs = append(errs, err.Error())
			time.Sleep(re.After)
		} else if err != nil && ctx.Err() == nil {
			t.Fatal(err)
		}
	}
	for _, e := range errs {
		if strings.Contains(e, "could not both be fresh") {
			t.Errorf("a run ended with %q", e)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sentAt) < want {
		t.Fatalf("%d messages in 20 s at 1.5 s a message; the batch's runs ended with %q", len(sentAt), errs)
	}
	// Five intervals: 7.5 s at the cap, 15 s at half of it.
	took := sentAt[want-1].Sub(sentAt[0])
	t.Logf("messages 1 to %d in %v (%v at the cap), the first %v after the start", want, took.Round(time.Millisecond), time.Duration(want-1)*1500*time.Millisecond, sentAt[0].Sub(start).Round(time.Millisecond))
	if took > 11*time.Second {
		t.Errorf("messages 1 to %d took %v: the tokens of every other message were lost", want, took.Round(time.Millisecond))
	}
}
