package worker

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/faults"
	"github.com/campaignctl/campaignctl/providers"
)

// A cap low enough that a send waits longer for its tokens than its consents may be old (2 segments a
// second, messages of 3 segments: 1.5 s a send), and a Postgres whose answers take 60 ms (a loaded or
// distant server). The consents, read again after the wait, made the tokens stale; the tokens, taken again,
// made the consents stale; after four rounds the batch was handed back, and came back to the same: not one
// message went. The consents are now read again inside the wait, before the tokens are due.
func TestALowCapSendGoesWhenPostgresAnswersSlowly(t *testing.T) {
	t.Parallel()
	f := planWith(t, 30, func(s *campaign.Spec) { s.Message = strings.Repeat("Kampanya ", 40) + "{{.code}}" }) // 3 segments
	h, _, fs := f.faulty(t, func(c *Config) {
		c.Providers = map[campaign.Channel]providers.Provider{campaign.ChannelSMS: segmentProvider{namedProvider{f.provider, "first"}}}
		c.ProviderRates = map[string]float64{"first": 2}
	})
	fs.Add(&faults.Rule{Match: faults.Method("LeaseChunk"), Kind: faults.SlowReply, Delay: 60 * time.Millisecond})
	// The batch's runs, as Asynq would run them (a run's context has no deadline of its own here: a
	// deadline would bound its waits for tokens), until two messages went or 10 s passed.
	var errs []string
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end) && f.provider.total() < 2; {
		ctx, cancel := context.WithCancel(context.Background())
		stop := time.AfterFunc(time.Until(end), cancel)
		err := h.RunBatch(ctx, f.id, 0)
		stop.Stop()
		cancel()
		var re *RetryError
		if errors.As(err, &re) {
			errs = append(errs, err.Error())
			time.Sleep(re.After)
		} else if err != nil && time.Now().Before(end) {
			t.Fatal(err)
		}
	}
	if n := f.provider.total(); n < 2 {
		t.Fatalf("%d messages in 10 s at 1.5 s a message; the batch's runs ended with %q", n, errs)
	}
	t.Logf("%d messages; the runs ended with %q", f.provider.total(), errs)
	for _, e := range errs {
		if strings.Contains(e, "could not both be fresh") {
			t.Errorf("a run ended with %q", e)
		}
	}
}
