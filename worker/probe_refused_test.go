package worker

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/providers"
)

// The e-mail provider fails every request for a few seconds, so the pace calls it down and only the probe
// goes, one a second over every worker; meanwhile nearly every recipient still to be sent refuses (an İYS
// import of RETs). When the outage ends, the probe must reach a recipient who is still to be sent at once.
// Before, each refused recipient took a probe of its own without a request, one a second: the provider,
// never probed, stayed down for every campaign on it for as many seconds as there were refusals.
func TestRefusalsDuringAnOutageDoNotUseUpTheProbes(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	db, store, id, p, h := planEmailDB(t, 300, 10, rdb)
	ctx := context.Background()
	var up atomic.Bool
	var refused atomic.Bool
	outageEnds := time.Now().Add(3 * time.Second)
	p.before = func(int) {
		if refused.CompareAndSwap(false, true) {
			if _, err := db.Exec(ctx, `UPDATE iys_consents SET status = 'RET', updated_at = now()
				WHERE recipient NOT IN ('user8@example.com', 'user9@example.com')`); err != nil {
				t.Error(err)
			}
		}
	}
	p.fail = func(int) error {
		if time.Now().Before(outageEnds) {
			return &providers.Error{Provider: "batch", Status: 503, Message: "Service Unavailable", Class: providers.Transient}
		}
		up.Store(true)
		return nil
	}
	stop := time.AfterFunc(60*time.Second, h.Stop)
	defer stop.Stop()
	var err error
	for try := 0; try < 20; try++ {
		if err = h.RunBatch(ctx, id, 0); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	if !up.Load() {
		t.Fatal("no request after the outage: this tests nothing")
	}
	if took := time.Since(outageEnds); took > 5*time.Second {
		t.Fatalf("the batch ended %v after the outage: the refused recipients used up the probes one a second", took.Round(time.Second))
	}
	c, err := store.Counts(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if c.Sent != 2 || c.Skipped != 298 || c.Pending != 0 {
		t.Fatalf("counts %+v; want user8 and user9 sent, the 298 who refused skipped", c)
	}
	for _, to := range []string{"user8@example.com", "user9@example.com"} {
		if n := len(p.accepted[to]); n != 1 {
			t.Errorf("%s got %d e-mails, want 1", to, n)
		}
	}
	var revoked int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM campaign_recipients WHERE campaign_id = $1 AND reason = $2`, id, campaign.ReasonRevoked).Scan(&revoked); err != nil || revoked != 298 {
		t.Fatalf("%d revoked (%v), want 298", revoked, err)
	}
}
