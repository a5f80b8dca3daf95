package worker

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/providers"
)

// batchProvider takes up to max messages a request; a request with an address containing "bad" is
// refused as a whole (as SendGrid answers 400 for one bad address).
type batchProvider struct {
	mu       sync.Mutex
	max      int
	requests [][]providers.Message
	accepted map[string][]providers.Message
}

func (p *batchProvider) Name() string  { return "batch" }
func (p *batchProvider) MaxBatch() int { return p.max }
func (p *batchProvider) Send(ctx context.Context, m providers.Message) (providers.Result, error) {
	res, err := p.SendBatch(ctx, []providers.Message{m})
	if err != nil {
		return providers.Result{}, err
	}
	return res[0], nil
}

func (p *batchProvider) SendBatch(_ context.Context, ms []providers.Message) ([]providers.Result, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.requests = append(p.requests, ms)
	for _, m := range ms {
		if strings.Contains(m.To, "bad") {
			return nil, &providers.Error{Provider: "batch", Status: 400, Message: "invalid email", Class: providers.Permanent}
		}
	}
	id := fmt.Sprintf("X%d", len(p.requests))
	out := make([]providers.Result, len(ms))
	for i, m := range ms {
		p.accepted[m.To] = append(p.accepted[m.To], m)
		out[i] = providers.Result{MessageID: id}
	}
	return out, nil
}

// An e-mail campaign goes out one request per chunk, each recipient with their own subject and body; a
// bad address fails only itself (the request is split until it is alone).
func TestEmailGoesOutInRequestsOfManyAndABadAddressFailsOnlyItself(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	rdb, _ := testredis.New(t)
	ctx := context.Background()
	for _, sql := range []string{
		`CREATE TABLE customers (user_id text, email text, first_name text)`,
		`INSERT INTO customers SELECT 'u' || i, CASE WHEN i = 7 THEN 'bad' ELSE 'User' END || i || '@Example.com', 'Ad' || i FROM generate_series(1, 10) i`,
		`INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date)
			SELECT lower(email), 'EPOSTA', 'BIREYSEL', 'ONAY', 'HS_WEB', now() FROM customers`,
		`INSERT INTO code_pools (name) VALUES ('p')`,
		`INSERT INTO promo_codes (pool, code) SELECT 'p', 'C' || i FROM generate_series(1, 20) i`,
	} {
		if _, err := db.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	rep, err := (&campaign.Planner{Engine: db, Audience: db}).Plan(ctx, campaign.Spec{
		Name: "mail", Channel: campaign.ChannelEmail, CodePool: "p",
		AudienceSQL: `SELECT user_id, email, first_name FROM customers`,
		Subject:     `{{.first_name}}, size özel`, Message: `Kodunuz {{.code}}`, HTML: `<p>Kodunuz <b>{{.code}}</b></p>`,
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Eligible != 10 || rep.Batches != 1 {
		t.Fatalf("planned %d eligible in %d batches, want 10 in 1 (e-mail batches hold 1000)", rep.Eligible, rep.Batches)
	}
	p := &batchProvider{max: 4, accepted: map[string][]providers.Message{}}
	store := campaign.NewStore(db)
	h := NewHandler(Config{Store: store, Redis: rdb, Owner: "test",
		Providers: map[campaign.Channel]providers.Provider{campaign.ChannelEmail: p}, ProviderRates: map[string]float64{}})
	if err := h.RunBatch(ctx, rep.ID, 0); err != nil {
		t.Fatal(err)
	}
	// Chunks of 4: [u1 u10 u2 u3] ok; [u4 u5 u6 u7] refused -> [u4 u5] ok, [u6 u7] refused -> [u6] ok, [u7]
	// refused; [u8 u9] ok: 7 requests.
	if got := len(p.requests); got != 7 {
		t.Fatalf("%d requests, want 7 (3 chunks of at most 4, and the refused one split down to the bad address)", got)
	}
	if len(p.accepted) != 9 {
		t.Fatalf("%d addresses accepted, want 9", len(p.accepted))
	}
	for to, ms := range p.accepted {
		if len(ms) != 1 {
			t.Errorf("%s got %d messages", to, len(ms))
		}
		m := ms[0]
		if !strings.HasPrefix(m.Subject, "Ad") || !strings.Contains(m.HTML, "<b>C") || !strings.HasPrefix(m.Body, "Kodunuz C") || to != strings.ToLower(to) {
			t.Errorf("%s: subject %q body %q html %q", to, m.Subject, m.Body, m.HTML)
		}
	}
	c, err := store.Counts(ctx, rep.ID)
	if err != nil || c.Sent != 9 || c.Failed != 1 {
		t.Fatalf("counts %+v, %v; want 9 sent, 1 failed", c, err)
	}
	var reason string
	db.QueryRow(ctx, `SELECT reason FROM campaign_recipients WHERE user_id = 'u7'`).Scan(&reason) //nolint:errcheck
	if !strings.Contains(reason, "invalid email") {
		t.Fatalf("u7 reason %q", reason)
	}
	// A second run sends nothing again.
	if err := h.RunBatch(ctx, rep.ID, 0); err != nil {
		t.Fatal(err)
	}
	if got := len(p.requests); got != 7 {
		t.Fatalf("a second run made %d more requests", got-7)
	}
}
