package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/faults"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/iys"
	"github.com/campaignctl/campaignctl/providers"
)

// batchProvider takes up to max messages a request; a request with an address containing "bad" is
// refused as a whole (as SendGrid answers 400 for one bad address).
type batchProvider struct {
	mu       sync.Mutex
	max      int
	requests [][]providers.Message
	accepted map[string][]providers.Message
	// fail, when set, answers request n (from 1) with an error instead; before runs ahead of each request,
	// outside the lock.
	fail   func(n int) error
	before func(n int)
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
	if p.before != nil {
		p.mu.Lock()
		n := len(p.requests) + 1
		p.mu.Unlock()
		p.before(n)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.requests = append(p.requests, ms)
	if p.fail != nil {
		if err := p.fail(len(p.requests)); err != nil {
			return nil, err
		}
	}
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
	seedEmailAudience(t, db, "Example.com")
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
	h := NewHandler(Config{Store: store, Redis: rdb, Owner: "test", Unsubscribe: testSigner,
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

// planEmail plans an e-mail campaign of n consenting recipients and returns a handler whose provider takes
// max messages a request.
func planEmail(t *testing.T, n, max int, rdb redis.UniversalClient, edit ...func(*campaign.Spec)) (*campaign.Store, int64, *batchProvider, *Handler) {
	t.Helper()
	_, store, id, p, h := planEmailDB(t, n, max, rdb, edit...)
	return store, id, p, h
}

// planEmailDB is planEmail that also returns the campaign's database.
func planEmailDB(t *testing.T, n, max int, rdb redis.UniversalClient, edit ...func(*campaign.Spec)) (*pgxpool.Pool, *campaign.Store, int64, *batchProvider, *Handler) {
	t.Helper()
	db, _ := testdb.New(t)
	ctx := context.Background()
	for _, sql := range []string{
		`CREATE TABLE customers AS SELECT 'u' || i AS user_id, 'user' || i || '@example.com' AS email FROM generate_series(1, ` + fmt.Sprint(n) + `) i`,
		`GRANT SELECT ON customers TO campaignctl_audience`,
		`INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date)
			SELECT email, 'EPOSTA', 'BIREYSEL', 'ONAY', 'HS_WEB', now() FROM customers`,
	} {
		if _, err := db.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	spec := campaign.Spec{Name: "mail", Channel: campaign.ChannelEmail,
		AudienceSQL: `SELECT user_id, email FROM customers`, Subject: "Merhaba", Message: "Size özel"}
	for _, e := range edit {
		e(&spec)
	}
	rep, err := (&campaign.Planner{Engine: db, Audience: db}).Plan(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	store := campaign.NewStore(db)
	p := &batchProvider{max: max, accepted: map[string][]providers.Message{}}
	h := NewHandler(Config{Store: store, Redis: rdb, Owner: "test", Unsubscribe: testSigner,
		Providers: map[campaign.Channel]providers.Provider{campaign.ChannelEmail: p}, ProviderRates: map[string]float64{}})
	return db, store, rep.ID, p, h
}

// The multi-recipient path fails closed too: with Redis unreachable no request goes out and everyone
// stays pending.
func TestEmailRedisUnreachableSendsNothing(t *testing.T) {
	t.Parallel()
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer dead.Close()
	store, id, p, h := planEmail(t, 6, 3, dead)
	if err := h.RunBatch(context.Background(), id, 0); err == nil {
		t.Fatal("the batch ran with Redis unreachable and returned no error")
	}
	if c, _ := store.Counts(context.Background(), id); len(p.requests) != 0 || c.Pending != 6 {
		t.Fatalf("%d requests, counts %+v; want none and everyone pending", len(p.requests), c)
	}
}

// A pause reaches the multi-recipient path before its next request, even the retry of a request refused
// with a 503 in the same chunk; resumed, the refused request goes out again and nobody gets two messages.
func TestEmailPauseAndTransientRetry(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	store, id, p, h := planEmail(t, 6, 2, rdb)
	ctx := context.Background()
	p.fail = func(n int) error {
		if n == 1 {
			return &providers.Error{Provider: "batch", Status: 503, Class: providers.Transient}
		}
		return nil
	}
	p.before = func(n int) {
		if n == 1 { // paused while the first request is out; it is refused with a 503, and its retry must wait
			if _, err := store.Transition(ctx, id, []campaign.State{campaign.StateRunning}, campaign.StatePaused); err != nil {
				t.Error(err)
			}
			if err := Halt(ctx, rdb, id, "paused", 0); err != nil {
				t.Error(err)
			}
		}
	}
	err := h.RunBatch(ctx, id, 0)
	var re *RetryError
	if !errors.As(err, &re) || re.Failure || !strings.Contains(err.Error(), "paused") {
		t.Fatalf("err = %v, want a RetryError saying the campaign is paused", err)
	}
	if len(p.requests) != 1 || len(p.accepted) != 0 {
		t.Fatalf("%d requests, %d accepted; want only the refused one: its retry comes after the pause", len(p.requests), len(p.accepted))
	}
	// Resumed, everyone goes out once.
	if _, err := store.Transition(ctx, id, []campaign.State{campaign.StatePaused}, campaign.StateRunning); err != nil {
		t.Fatal(err)
	}
	if err := Unhalt(ctx, rdb, id); err != nil {
		t.Fatal(err)
	}
	if err := h.RunBatch(ctx, id, 0); err != nil {
		t.Fatal(err)
	}
	for to, ms := range p.accepted {
		if len(ms) != 1 {
			t.Errorf("%s got %d messages", to, len(ms))
		}
	}
	if c, _ := store.Counts(ctx, id); len(p.accepted) != 6 || c.Sent != 6 {
		t.Fatalf("%d accepted, counts %+v; want all 6 sent once", len(p.accepted), c)
	}
}

// The claims of one request are taken together: a recipient whose claim already holds an answer is
// recorded from it, one that another campaign messaged within the cap is skipped (frequency_cap), and
// neither is in the request. When Redis lost its data since the lease (another epoch), no claim of the
// request is taken at all.
func TestEmailRequestClaimsTogether(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	ctx := context.Background()
	store, id, p, h := planEmail(t, 6, 10, rdb, func(s *campaign.Spec) { s.FrequencyCap = time.Hour })
	c, err := store.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	// Another epoch than the run's lease: the whole request is refused, nothing is written.
	run := &batchRun{c: c, nonce: Nonce(c)}
	scs := []state.SendClaim{{Key: ClaimKey(id, "u1"), Value: state.InFlightValue(time.Now(), "t"), Addr: "user1@example.com"}}
	if _, _, err := h.state.ClaimWindow(ctx, c, run.nonce, scs, state.Guard{Epoch: "not-the-epoch", Halt: HaltKey(id)}, nil, "", time.Now()); !errors.Is(err, state.ErrEpoch) {
		t.Fatalf("claims under another epoch: %v, want state.ErrEpoch", err)
	}
	if n := rdb.Exists(ctx, ClaimKey(id, "u1")).Val(); n != 0 {
		t.Fatal("a claim was written under another epoch")
	}
	// u2 was answered by an earlier run; u3 got another campaign's message a minute ago.
	rdb.Set(ctx, ClaimKey(id, "u2"), Nonce(c)+"/"+state.SentValue("earlier", 1), 0)
	now := time.Now()
	rdb.HSet(ctx, FrequencyKey(campaign.ChannelEmail, "user3@example.com", now), "user3@example.com",
		fmt.Sprintf("%d:other|%d", id+1, now.Add(-time.Minute).UnixMilli()))
	if err := h.RunBatch(ctx, id, 0); err != nil {
		t.Fatal(err)
	}
	if len(p.requests) != 1 || len(p.requests[0]) != 4 {
		t.Fatalf("requests %d (first of %d); want one request of the 4 others", len(p.requests), len(p.requests[0]))
	}
	for _, m := range p.requests[0] {
		if m.To == "user2@example.com" || m.To == "user3@example.com" {
			t.Fatalf("%s was in the request", m.To)
		}
	}
	counts, err := store.Counts(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	capped, err := store.CountReason(ctx, id, campaign.StatusSkipped, campaign.ReasonFrequencyCap)
	if err != nil || counts.Sent != 5 || counts.Skipped != 1 || capped != 1 {
		t.Fatalf("counts %+v, %d skipped for the frequency cap (%v); want u2 sent from its claim, u3 skipped, 4 sent", counts, capped, err)
	}
	if v := rdb.Get(ctx, ClaimKey(id, "u3")).Val(); !strings.HasSuffix(v, state.ReasonValue(state.Skipped, campaign.ReasonFrequencyCap)) {
		t.Fatalf("u3's claim %q does not record the skip", v)
	}
}

// seedEmailAudience creates customers u1..u10 at User<i>@domain (u7's address, bad7@domain, is one the test
// providers refuse), each with EPOSTA consent for their lower-cased address, and a code pool p of 20 codes.
func seedEmailAudience(t *testing.T, db *pgxpool.Pool, domain string) {
	t.Helper()
	for _, sql := range []string{
		`CREATE TABLE customers (user_id text, email text, first_name text)`,
		`GRANT SELECT ON customers TO campaignctl_audience`,
		`INSERT INTO customers SELECT 'u' || i, CASE WHEN i = 7 THEN 'bad' ELSE 'User' END || i || '@' || $1, 'Ad' || i FROM generate_series(1, 10) i`,
		`INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date)
			SELECT lower(email), 'EPOSTA', 'BIREYSEL', 'ONAY', 'HS_WEB', now() FROM customers`,
		`INSERT INTO code_pools (name) VALUES ('p')`,
		`INSERT INTO promo_codes (pool, code) SELECT 'p', 'C' || i FROM generate_series(1, 20) i`,
	} {
		var args []any
		if strings.Contains(sql, "$1") {
			args = append(args, domain)
		}
		if _, err := db.Exec(context.Background(), sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
}

// An e-mail whose parts are plain text and values reaches the provider with the campaign's shared content
// (one pointer for the request) and its own values, which put into it give the message's rendered text
// and HTML; the customer columns the template names are the values, escaped in the HTML. The message
// keeps no text and HTML of its own.
func TestEmailMessagesCarryTheSharedContent(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	store, id, p, h := planEmail(t, 4, 10, rdb, func(s *campaign.Spec) {
		s.AudienceSQL = `SELECT user_id, email, user_id || ' & <' || user_id || '>' AS name FROM customers`
		s.Message, s.HTML = "Merhaba {{.name}}", "<p>Merhaba <b>{{.name}}</b></p>"
	})
	if err := h.RunBatch(context.Background(), id, 0); err != nil {
		t.Fatal(err)
	}
	if c, _ := store.Counts(context.Background(), id); c.Sent != 4 || len(p.requests) != 1 {
		t.Fatalf("counts %+v in %d requests; want 4 sent in one", c, len(p.requests))
	}
	shared := p.requests[0][0].Shared
	if shared == nil || shared.Text != "Merhaba "+shared.Tags[0] || shared.HTML != "<p>Merhaba <b>"+shared.Tags[1]+"</b></p>" {
		t.Fatalf("shared content %+v", shared)
	}
	for _, m := range p.requests[0] {
		if m.Shared != shared {
			t.Fatalf("message to %s does not share the request's content", m.To)
		}
		name := m.UserID + " & <" + m.UserID + ">"
		text, html := m.Parts()
		if want := "Merhaba " + name; text != want || campaign.SubstituteOnce(shared.Text, shared.Tags, m.Values) != want {
			t.Errorf("%s: text with its values %q, want %q", m.To, text, want)
		}
		if want := "<p>Merhaba <b>" + strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(name) + "</b></p>"; html != want {
			t.Errorf("%s: HTML with its values %q, want %q", m.To, html, want)
		}
		if m.Body != "" || m.HTML != "" {
			t.Errorf("%s: a message with shared content keeps its own text %q and HTML %q", m.To, m.Body, m.HTML)
		}
	}
}

// Under a cap, a request carries a tenth of a second's worth of it at most, so that no second holds much
// more than the cap however the requests of the workers fall: with requests of a second's worth, two of
// them a little less than a second apart put twice the cap into one second.
func TestAnEmailRequestUnderACapIsATenthOfASecondsWorth(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	_, id, p, h := planEmail(t, 12, 1000, rdb)
	h.cfg.ProviderRates["batch"] = 40 // requests of 4
	if err := h.RunBatch(context.Background(), id, 0); err != nil {
		t.Fatal(err)
	}
	if len(p.accepted) != 12 {
		t.Fatalf("%d addresses e-mailed, want 12", len(p.accepted))
	}
	for i, r := range p.requests {
		if len(r) > 4 {
			t.Fatalf("request %d carried %d recipients under a cap of 40/s, want at most 4", i+1, len(r))
		}
	}
}

// The e-mail path: a request's claim call stalls (Redis slow) past its tokens' freshness, and the request
// waits for its tokens a second time at a low cap (a request a recipient at 0.5/s). user1 unsubscribes
// during that wait. The consents read before the claim are by then more than a second old: they are read
// again, user1 is dropped from its request (its claim settled as revoked), and the others go out.
func TestARefusalDuringAnEmailRequestsSecondTokenWaitDropsItsRecipient(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	db, store, id, p, _ := planEmailDB(t, 4, 4, rdb)
	fr := faults.NewState(state.New(rdb, DefaultClaimTTL))
	h := NewHandler(Config{Store: store, Redis: rdb, State: fr, Owner: "test", Unsubscribe: testSigner,
		Providers:     map[campaign.Channel]providers.Provider{campaign.ChannelEmail: p},
		ProviderRates: map[string]float64{"batch": 0.5}})
	stall := fr.Add(&faults.Rule{Match: faults.Method("ClaimWindow"), Times: 1, Kind: faults.Stall, Delay: 300 * time.Millisecond})
	ctx := context.Background()
	c, err := store.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
			if n, _ := rdb.Exists(ctx, ClaimKey(id, "u1")).Result(); n == 1 {
				rep, err := iys.RecordRefusals(ctx, db, "", []iys.Refusal{{Via: iys.ViaOneClick, EventID: "u1-unsubscribe",
					Kind: "one_click", Recipient: "user1@example.com", Type: "EPOSTA", At: time.Now(), Evidence: "one-click"}})
				if err != nil || rep.Revoked != 1 {
					t.Errorf("refusal: %+v %v", rep, err)
				}
				return
			}
		}
		t.Error("u1 was never claimed")
	}()
	if err := h.RunBatch(ctx, id, 0); err != nil {
		t.Fatal(err)
	}
	if stall.Hits() != 1 {
		t.Fatal("the claim never stalled: this tests nothing")
	}
	p.mu.Lock()
	requests, toU1 := len(p.requests), len(p.accepted["user1@example.com"])
	p.mu.Unlock()
	if toU1 != 0 || requests != 3 || len(p.accepted) != 3 {
		t.Fatalf("%d requests, user1 got %d, %d addresses reached; want the other 3 reached", requests, toU1, len(p.accepted))
	}
	v, _ := rdb.Get(ctx, ClaimKey(id, "u1")).Result()
	if st := state.ParseValue(strings.TrimPrefix(v, Nonce(c)+"/")); st.Kind != state.Skipped {
		t.Errorf("u1's claim says %q, want skipped (revoked)", v)
	}
	if cs, _ := store.Counts(ctx, id); cs.Sent != 3 || cs.Skipped != 1 || cs.Pending != 0 {
		t.Errorf("counts %+v, want 3 sent and u1 skipped", cs)
	}
}

// A provider that resets the connection of every request (an outage in front of SendGrid) is held back
// once the shared pace calls it down: the requests after that wait, and the one probe a second carries one
// recipient. Before, the pace was read only after a failure that is retried; a reset is ambiguous (the
// request was written), so every request went out at the full pace and each made all its recipients
// unknown: an outside run ended 20,000 of 20,000 unknown.
func TestAnEmailProviderThatResetsEveryRequestIsHeldBackOnceItIsDown(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	store, id, p, h := planEmail(t, 3000, 50, rdb)
	p.fail = func(int) error {
		return &providers.Error{Provider: "batch", Class: providers.Ambiguous, Message: "connection reset after the request was written"}
	}
	p.before = func(int) { time.Sleep(3 * time.Millisecond) }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	time.AfterFunc(2500*time.Millisecond, cancel)
	err := h.RunBatch(ctx, id, 0) // ends when ctx does: the provider stays down
	p.mu.Lock()
	requests := p.requests
	p.mu.Unlock()
	ones := 0
	for _, r := range requests {
		if len(r) == 1 {
			ones++
		}
	}
	c, cerr := store.Counts(context.Background(), id)
	if cerr != nil {
		t.Fatal(cerr)
	}
	t.Logf("%d requests (%d of one recipient) in 2.5 s; counts %+v; run: %v", len(requests), ones, c, err)
	// About 10 requests of 50 to call it down, then a probe of one a second.
	if len(requests) > 16 || len(requests)-ones > 12 || c.Unknown > 12*50+4 || ones == 0 {
		t.Fatalf("%d requests (%d of one recipient), %d unknown in 2.5 s: want about 10 of 50 to call it down, then one probe of one recipient a second", len(requests), ones, c.Unknown)
	}
}

// Every message carries its campaign's nonce (providers.Message.CampaignNonce), which the adapters attach
// for the receipts to name back: a receipt of another campaign with the same ID matches nobody.
func TestEveryMessageCarriesItsCampaignsNonce(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	store, id, p, h := planEmail(t, 5, 2, rdb)
	if err := h.RunBatch(context.Background(), id, 0); err != nil {
		t.Fatal(err)
	}
	c, err := store.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	want := Nonce(c)
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.accepted) != 5 {
		t.Fatalf("%d addresses accepted, want 5", len(p.accepted))
	}
	for to, ms := range p.accepted {
		if ms[0].CampaignNonce != want || want == "" {
			t.Errorf("%s: nonce %q, want the campaign's %q", to, ms[0].CampaignNonce, want)
		}
	}
}
