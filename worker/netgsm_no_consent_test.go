package worker

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/netgsm"
	"github.com/campaignctl/campaignctl/providers/sandbox"
)

// Order: Twilio (the first SMS provider) is down, so a commercial campaign fails over to Netgsm, which
// checks İYS itself (iysfilter 11) and refuses u1 with code 50: İYS holds no consent for the number
// (a RET given at İYS and not yet pulled by `iys sync`). u1 fails "netgsm 50". Twilio comes back; the next
// commercial campaign is planned and sent through Twilio, which does not check İYS. It used to reach u1,
// although the engine was told by İYS (through Netgsm) that u1 may not be sent a commercial message: the
// refusal now turns u1's consent RET here.
func TestNetgsmsIYSRefusalIsNotForgottenByTheNextCampaign(t *testing.T) {
	t.Parallel()
	const refused = "+905550021610" // the sandbox's Netgsm answers code 50 (İYS) for it
	ctx := context.Background()
	f := planAround(t, 10, nil, func(db *pgxpool.Pool, launch func()) {
		for _, q := range []string{
			`UPDATE customers SET phone = $1 WHERE user_id = 'u1'`,
			`UPDATE iys_consents SET recipient = $1 WHERE recipient = '+905320000001'`,
		} {
			if _, err := db.Exec(ctx, q, refused); err != nil {
				t.Fatal(err)
			}
		}
		launch()
	})
	sb := sandbox.New(sandbox.Options{NetgsmUserCode: "8503000000", NetgsmPassword: "s3cretpass"})
	srv := httptest.NewServer(sb)
	t.Cleanup(srv.Close)
	ng, err := netgsm.New(netgsm.Config{UserCode: "8503000000", Password: "s3cretpass", Header: "KAMPANYA", BaseURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	f.provider.fail = func(int, providers.Message) error {
		return &providers.Error{Provider: "test", Status: 503, Class: providers.Transient, Message: "unavailable"}
	}
	f.h.cfg.Fallback = map[campaign.Channel]providers.Provider{campaign.ChannelSMS: ng}
	f.h.cfg.FailoverWindow = time.Hour
	f.runAll(t)
	if st, reason, _ := f.status(t, "u1"); st != campaign.StatusFailed || !strings.Contains(reason, "netgsm 50") {
		t.Fatalf("u1 %s %q; want failed with Netgsm's İYS refusal (code 50)", st, reason)
	}

	// The consent is RET here, from the provider's word, and nothing is queued for İYS (the person refused
	// nothing through the brand's channels).
	// (Written in the background: it never holds up the batch.)
	var status, source string
	var outboxed, history int
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if err := f.db.QueryRow(ctx, `SELECT status, source, (SELECT count(*) FROM iys_outbox WHERE recipient = $1),
			(SELECT count(*) FROM iys_consent_history WHERE recipient = $1 AND origin = 'provider' AND status = 'RET')
			FROM iys_consents WHERE recipient = $1`, refused).Scan(&status, &source, &outboxed, &history); err != nil {
			t.Fatal(err)
		}
		if status == "RET" || time.Now().After(end) {
			break
		}
	}
	if status != "RET" || !strings.Contains(source, "netgsm 50") || outboxed != 0 || history != 1 {
		t.Fatalf("after Netgsm's code 50: consent %s (source %q), %d İYS outbox rows, %d history rows of origin provider; want RET from netgsm 50, none queued, 1",
			status, source, outboxed, history)
	}

	// Twilio is back; the next commercial campaign to the same audience.
	f.provider.fail = nil
	rep, err := (&campaign.Planner{Engine: f.db, Audience: f.db}).Plan(ctx, fixtureSpec("t2"))
	if err != nil {
		t.Fatal(err)
	}
	h2 := f.handler(f.rdb)
	for b := 0; b < rep.Batches; b++ {
		if err := h2.RunBatch(ctx, rep.ID, b); err != nil {
			t.Fatalf("campaign 2 batch %d: %v", b, err)
		}
	}
	if got := f.provider.sentTo(refused); len(got) != 0 {
		var status string
		f.db.QueryRow(ctx, `SELECT status FROM iys_consents WHERE recipient = $1`, refused).Scan(&status) //nolint:errcheck
		t.Fatalf("İYS refused u1 through Netgsm (code 50) in campaign 1, yet campaign 2 sent u1 %d commercial SMS through the first provider %q (local consent still %s)",
			len(got), got, status)
	}
}
