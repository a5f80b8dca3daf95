package worker

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/netgsm"
)

// The first SMS provider is down for a moment: every call a 503, a definite transient refusal that
// accepted nothing. Its recipients fail over to Netgsm, which takes Turkish numbers only. A recipient with
// a foreign number waits for the first provider and is sent once it is back: before, it failed for good
// with Netgsm's "not a Turkish mobile number" (which no provider answered) and its code went back.
func TestAnOutageOfTheFirstProviderDoesNotFailAnAddressTheFallbackCannotTake(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	got := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		got++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"code":"00","description":"queued","jobid":"J1"}`)
	}))
	defer srv.Close()
	ng, err := netgsm.New(netgsm.Config{UserCode: "u", Password: "p", Header: "KAMPANYA", BaseURL: srv.URL, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	const foreign = "+14155552671" // u1: eligible (1%5 != 0, 1%3 != 0)
	f := planAround(t, 20, nil, func(db *pgxpool.Pool, launch func()) {
		ctx := context.Background()
		if _, err := db.Exec(ctx, `UPDATE customers SET phone = $1 WHERE user_id = 'u1'`, foreign); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(ctx, `UPDATE iys_consents SET recipient = $1 WHERE recipient = $2`, foreign, phone(1)); err != nil {
			t.Fatal(err)
		}
		launch()
	})
	var primaryCalls int
	f.provider.fail = func(_ int, m providers.Message) error {
		if m.To == foreign {
			primaryCalls++ // under the provider's lock
		}
		return &providers.Error{Provider: "twilio", Status: 503, Class: providers.Transient, Message: "unavailable"}
	}
	f.h.cfg.Fallback = map[campaign.Channel]providers.Provider{campaign.ChannelSMS: ng}
	f.h.cfg.FailoverWindow = time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	done := make(chan error, f.batches)
	for b := 0; b < f.batches; b++ {
		go func() { done <- f.h.RunBatch(ctx, f.id, b) }()
	}
	// The outage lasts until u1 was tried through the first provider twice and another recipient went
	// through Netgsm (the other batch: under a loaded machine it may start after u1's second try); u1
	// must not go through Netgsm.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		f.provider.mu.Lock()
		n := primaryCalls
		f.provider.mu.Unlock()
		mu.Lock()
		viaNetgsm := got
		mu.Unlock()
		if status, reason, _ := f.status(t, "u1"); status == string(campaign.StatusFailed) {
			t.Fatalf("u1 failed for good in an outage of the first provider: %q (no provider refused the number; the first sends it once back)", reason)
		}
		if n >= 2 && viaNetgsm > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("in a minute of outage u1 was tried %d times through the first provider, and %d requests went through Netgsm", n, viaNetgsm)
		}
	}
	f.provider.mu.Lock()
	f.provider.fail = nil // the first provider is back
	f.provider.mu.Unlock()
	for b := 0; b < f.batches; b++ {
		if err := <-done; err != nil {
			t.Errorf("a batch: %v", err)
		}
	}
	mu.Lock()
	viaNetgsm := got
	mu.Unlock()
	if viaNetgsm == 0 {
		t.Error("nothing went through the fallback during the outage")
	}
	status, reason, _ := f.status(t, "u1")
	if sent := f.provider.sentTo(foreign); status != string(campaign.StatusSent) || len(sent) != 1 {
		t.Fatalf("u1 after the outage: %s (%q), sent %d times through the first provider; want sent once", status, reason, len(sent))
	}
}
