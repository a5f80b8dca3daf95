package sendgrid_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sendgrid/sendgrid-go/helpers/eventwebhook"

	"github.com/campaignctl/campaignctl/internal/providertest"
	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/sandbox"
	"github.com/campaignctl/campaignctl/providers/sendgrid"
)

const (
	testKey  = "SG.campaignctlTestKey.0123456789abcdefghijklmnopqrstuvwxyzABCDEFG"
	testFrom = "kampanya@shop.example"
)

// harness is a sandbox behind an httptest server that also keeps the raw body of every Mail Send
// request, to check what went over the wire.
type harness struct {
	sb  *sandbox.Server
	srv *httptest.Server

	mu     sync.Mutex
	bodies [][]byte
}

func newHarness(t *testing.T, opts sandbox.Options) *harness {
	t.Helper()
	opts.SendGridAPIKey = testKey
	h := &harness{sb: sandbox.New(opts)}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v3/mail/send" {
			b, _ := io.ReadAll(r.Body)
			h.mu.Lock()
			h.bodies = append(h.bodies, b)
			h.mu.Unlock()
			r.Body = io.NopCloser(bytes.NewReader(b))
		}
		h.sb.ServeHTTP(w, r)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

// wire is the part of a Mail Send body the tests look at.
type wire struct {
	From             struct{ Email, Name string }
	Subject          string
	TemplateID       string `json:"template_id"`
	Content          []struct{ Type, Value string }
	Personalizations []struct {
		To                  []struct{ Email string }
		Subject             string
		Substitutions       map[string]string `json:"substitutions"`
		CustomArgs          map[string]string `json:"custom_args"`
		DynamicTemplateData map[string]any    `json:"dynamic_template_data"`
	}
}

// request returns the i-th Mail Send body the sandbox received, decoded.
func (h *harness) request(t *testing.T, i int) wire {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	if i >= len(h.bodies) {
		t.Fatalf("request %d: only %d were made", i, len(h.bodies))
	}
	var w wire
	if err := json.Unmarshal(h.bodies[i], &w); err != nil {
		t.Fatalf("decode request %d: %v", i, err)
	}
	return w
}

func newProvider(t *testing.T, baseURL string, edit ...func(*sendgrid.Config)) *sendgrid.Provider {
	t.Helper()
	cfg := sendgrid.Config{APIKey: testKey, From: testFrom, FromName: "Shop", BaseURL: baseURL, Timeout: 5 * time.Second}
	for _, e := range edit {
		e(&cfg)
	}
	p, err := sendgrid.New(cfg)
	if err != nil {
		t.Fatalf("new provider: %v", err)
	}
	return p
}

// providerError asserts that err is a *providers.Error from sendgrid whose texts hold neither the API
// key nor any recipient of ms, and returns it.
func providerError(t *testing.T, err error, ms ...providers.Message) *providers.Error {
	t.Helper()
	secrets := []string{testKey, "campaignctlTestKey"}
	for _, m := range ms {
		secrets = append(secrets, m.To, strings.ToLower(m.To))
	}
	return providertest.Error(t, err, "sendgrid", secrets...)
}

func msg(i int) providers.Message {
	return providers.Message{
		To:         fmt.Sprintf("alici%d@example.com", i),
		Subject:    fmt.Sprintf("Size özel kod %d", i),
		Body:       fmt.Sprintf("Merhaba %d, kodunuz K%04d.\nİyi alışverişler!", i, i),
		HTML:       fmt.Sprintf("<p>Merhaba %d, kodunuz <b>K%04d</b> &amp; -campaignctl_text-</p>", i, i),
		CampaignID: 42,
		UserID:     fmt.Sprintf("u%d", i),
	}
}

// recorded returns the sandbox's messages by recipient.
func recorded(t *testing.T, sb *sandbox.Server) map[string]sandbox.Message {
	t.Helper()
	out := make(map[string]sandbox.Message)
	for _, m := range sb.Messages() {
		if _, dup := out[m.To]; dup {
			t.Errorf("%s recorded twice", m.To)
		}
		out[m.To] = m
	}
	return out
}

func TestSendOne(t *testing.T) {
	h := newHarness(t, sandbox.Options{})
	p := newProvider(t, h.srv.URL)
	if p.Name() != "sendgrid" || p.MaxBatch() != 1000 || !providers.ReceiptsNameRecipient(p) {
		t.Errorf("Name %q MaxBatch %d, receipts name the recipient %v (custom_args)", p.Name(), p.MaxBatch(), providers.ReceiptsNameRecipient(p))
	}
	m := msg(1)
	m.CampaignNonce = "mab3c1"
	res, err := p.Send(context.Background(), m)
	if err != nil {
		t.Fatalf("Send: %v", err)
	}
	got := h.sb.Messages()
	if len(got) != 1 {
		t.Fatalf("recorded %d messages, want 1", len(got))
	}
	r := got[0]
	if !strings.HasPrefix(r.SID, res.MessageID+".") || len(res.MessageID) != 22 || res.Segments != 0 {
		t.Errorf("result %+v, recorded sg_message_id %q", res, r.SID)
	}
	if r.To != m.To || r.From != testFrom || r.Subject != m.Subject || r.Body != m.Body || r.HTML != m.HTML {
		t.Errorf("recorded %+v, want the message as rendered", r)
	}
	// Alone, the message is the content itself: no substitution, so no size limit and no tag.
	w := h.request(t, 0)
	if len(w.Content) != 2 || w.Content[0].Value != m.Body || w.Content[1].Value != m.HTML ||
		w.From.Email != testFrom || w.From.Name != "Shop" || len(w.Personalizations[0].Substitutions) != 0 {
		t.Errorf("request %+v", w)
	}
	if diff := cmp.Diff(map[string]string{"campaign_id": "42", "user_id": "u1", "campaign_nonce": "mab3c1"}, w.Personalizations[0].CustomArgs); diff != "" {
		t.Errorf("custom_args (-want +got):\n%s", diff)
	}
}

func TestSendBatchOf1000(t *testing.T) {
	h := newHarness(t, sandbox.Options{})
	p := newProvider(t, h.srv.URL)
	ms := make([]providers.Message, 1000)
	for i := range ms {
		ms[i] = msg(i)
	}
	ms[7].HTML = "" // no HTML of its own: gets its text as HTML, never an empty part
	ms[8].Body = ""
	res, err := p.SendBatch(context.Background(), ms)
	if err != nil {
		t.Fatalf("SendBatch: %v", err)
	}
	if st := h.sb.Stats(); st.Requests != 1 || st.Accepted != 1000 {
		t.Fatalf("stats %+v, want one request and 1000 accepted", st)
	}
	if len(res) != 1000 {
		t.Fatalf("%d results", len(res))
	}
	byTo := recorded(t, h.sb)
	for i, m := range ms {
		r, ok := byTo[m.To]
		if !ok {
			t.Errorf("%s not recorded", m.To)
			continue
		}
		wantHTML := m.HTML
		if i == 7 {
			wantHTML = `<div style="white-space: pre-wrap">Merhaba 7, kodunuz K0007.` + "\nİyi alışverişler!</div>"
		}
		if r.Subject != m.Subject || r.Body != m.Body || r.HTML != wantHTML {
			t.Errorf("message %d: got subject %q body %q html %q", i, r.Subject, r.Body, r.HTML)
		}
		if res[i].MessageID != res[0].MessageID || !strings.HasPrefix(r.SID, res[i].MessageID+".") {
			t.Errorf("message %d: result %q, sg_message_id %q", i, res[i].MessageID, r.SID)
		}
	}
	w := h.request(t, 0)
	if len(w.Content) != 2 || w.Content[0].Value != "-campaignctl_text-" || w.Content[1].Value != "-campaignctl_html-" {
		t.Errorf("content %+v, want the two tags", w.Content)
	}
	for i, pz := range w.Personalizations {
		want := map[string]string{"campaign_id": "42", "user_id": fmt.Sprintf("u%d", i)}
		if diff := cmp.Diff(want, pz.CustomArgs); diff != "" {
			t.Errorf("personalization %d custom_args (-want +got):\n%s", i, diff)
		}
		if len(pz.To) != 1 || pz.To[0].Email != ms[i].To || pz.Subject != ms[i].Subject {
			t.Errorf("personalization %d: %+v", i, pz)
		}
	}
}

func TestSendBatchTextOnly(t *testing.T) {
	h := newHarness(t, sandbox.Options{})
	p := newProvider(t, h.srv.URL)
	ms := []providers.Message{msg(1), msg(2)}
	ms[0].HTML, ms[1].HTML = "", ""
	if _, err := p.SendBatch(context.Background(), ms); err != nil {
		t.Fatalf("SendBatch: %v", err)
	}
	if w := h.request(t, 0); len(w.Content) != 1 || w.Content[0].Type != "text/plain" {
		t.Errorf("content %+v, want text/plain only", w.Content)
	}
	for _, m := range ms {
		if r := recorded(t, h.sb)[m.To]; r.Body != m.Body || r.HTML != "" {
			t.Errorf("%s: %+v", m.To, r)
		}
	}
}

func TestSendBatchTemplate(t *testing.T) {
	h := newHarness(t, sandbox.Options{})
	p := newProvider(t, h.srv.URL)
	ms := []providers.Message{msg(1), msg(2)}
	for i := range ms {
		ms[i].Body, ms[i].HTML, ms[i].Subject = "", "", ""
		ms[i].TemplateID = "d-0123456789abcdef"
		ms[i].Data = map[string]string{"code": fmt.Sprintf("PROMO-%d", i), "name": "Ayşe"}
	}
	if _, err := p.SendBatch(context.Background(), ms); err != nil {
		t.Fatalf("SendBatch: %v", err)
	}
	w := h.request(t, 0)
	if w.TemplateID != "d-0123456789abcdef" || len(w.Content) != 0 {
		t.Errorf("template_id %q content %+v", w.TemplateID, w.Content)
	}
	for i, pz := range w.Personalizations {
		want := map[string]any{"code": fmt.Sprintf("PROMO-%d", i), "name": "Ayşe"}
		if diff := cmp.Diff(want, pz.DynamicTemplateData); diff != "" {
			t.Errorf("personalization %d dynamic_template_data (-want +got):\n%s", i, diff)
		}
		if pz.CustomArgs["campaign_id"] != "42" || len(pz.Substitutions) != 0 {
			t.Errorf("personalization %d: %+v", i, pz)
		}
	}
	if r := recorded(t, h.sb)[ms[1].To]; r.Body != `{"dynamic_template_data":{"code":"PROMO-1","name":"Ayşe"},"template_id":"d-0123456789abcdef"}` {
		t.Errorf("recorded %+v", r)
	}

	// Mixed template IDs cannot share a request.
	ms[1].TemplateID = "d-other"
	pe := providerError(t, second(p.SendBatch(context.Background(), ms)), ms...)
	if pe.Class != providers.Permanent || pe.Status != 0 {
		t.Errorf("mixed templates: %+v", pe)
	}
}

func second[T any](_ T, err error) error { return err }

// A multi-message request carries each text as a substitution, which SendGrid caps at 10,000 bytes per
// personalization; a message over it is refused unsent, and goes through alone.
func TestSubstitutionLimit(t *testing.T) {
	h := newHarness(t, sandbox.Options{})
	p := newProvider(t, h.srv.URL)
	fits := msg(1)
	fits.HTML = ""
	fits.Body = strings.Repeat("a", sendgrid.MaxSubstitutionBytes-len("-campaignctl_text-"))
	big := msg(2)
	big.HTML = ""
	big.Body = strings.Repeat("b", sendgrid.MaxSubstitutionBytes-len("-campaignctl_text-")+1)
	withHTML := msg(3) // with HTML, both parts count
	withHTML.Body = strings.Repeat("c", 6000)
	withHTML.HTML = strings.Repeat("d", 4000)

	for _, batch := range [][]providers.Message{{fits, big}, {fits, withHTML}} {
		pe := providerError(t, second(p.SendBatch(context.Background(), batch)), batch...)
		if pe.Class != providers.Permanent || pe.Status != 0 || !strings.Contains(pe.Message, "10,000 bytes") || !strings.Contains(pe.Message, "alone") {
			t.Errorf("over the limit: %+v", pe)
		}
	}
	if st := h.sb.Stats(); st.Requests != 0 {
		t.Fatalf("%d requests made for refused batches", st.Requests)
	}
	// Exactly at the limit is fine, in a batch.
	other := msg(4)
	other.HTML = ""
	if _, err := p.SendBatch(context.Background(), []providers.Message{fits, other}); err != nil {
		t.Fatalf("batch at the limit: %v", err)
	}
	// Alone, a message of any size goes as the content.
	big.Body = strings.Repeat("b", 50000)
	for _, m := range []providers.Message{big, withHTML} {
		if _, err := p.Send(context.Background(), m); err != nil {
			t.Fatalf("alone: %v", err)
		}
	}
	byTo := recorded(t, h.sb)
	for _, m := range []providers.Message{fits, other, big, withHTML} {
		if r := byTo[m.To]; r.Body != m.Body || r.HTML != m.HTML {
			t.Errorf("%s: body of %d bytes recorded as %d bytes", m.To, len(m.Body), len(r.Body))
		}
	}
}

func TestDuplicateRecipientRefused(t *testing.T) {
	h := newHarness(t, sandbox.Options{})
	p := newProvider(t, h.srv.URL)
	a, b := msg(1), msg(2)
	b.To = strings.ToUpper(a.To)
	pe := providerError(t, second(p.SendBatch(context.Background(), []providers.Message{a, b})), a, b)
	if pe.Class != providers.Permanent || pe.Status != 0 {
		t.Errorf("duplicate: %+v", pe)
	}
	if st := h.sb.Stats(); st.Requests != 0 {
		t.Errorf("%d requests made", st.Requests)
	}
	if pe := providerError(t, second(p.SendBatch(context.Background(), make([]providers.Message, 1001)))); pe.Class != providers.Permanent {
		t.Errorf("1001 messages: %+v", pe)
	}
	if res, err := p.SendBatch(context.Background(), nil); err != nil || len(res) != 0 {
		t.Errorf("empty batch: %v %v", res, err)
	}
}

// The request must be SendGrid's: POST /v3/mail/send, Bearer key, sendgrid-go's User-Agent, JSON.
func TestRequestShape(t *testing.T) {
	var got *http.Request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Clone(context.Background())
		w.Header().Set("X-Message-Id", "abcdefghijklmnopqrstuv")
		w.WriteHeader(http.StatusAccepted)
	}))
	defer srv.Close()
	p := newProvider(t, srv.URL+"/")
	res, err := p.Send(context.Background(), msg(1))
	if err != nil || res.MessageID != "abcdefghijklmnopqrstuv" {
		t.Fatalf("Send: %+v %v", res, err)
	}
	if got.Method != http.MethodPost || got.URL.Path != "/v3/mail/send" || got.Header.Get("Authorization") != "Bearer "+testKey ||
		got.Header.Get("User-Agent") != "sendgrid/3.16.1;go" || got.Header.Get("Content-Type") != "application/json" {
		t.Errorf("request %s %s headers %v", got.Method, got.URL.Path, got.Header)
	}
}

// Many goroutines share one Provider; each call must send its own body and read its own answer.
func TestConcurrentBatches(t *testing.T) {
	h := newHarness(t, sandbox.Options{Latency: 2 * time.Millisecond})
	p := newProvider(t, h.srv.URL)
	const workers, per = 40, 10
	ids := make([]string, workers)
	var wg sync.WaitGroup
	for g := range workers {
		wg.Go(func() {
			ms := make([]providers.Message, per)
			for i := range ms {
				ms[i] = msg(g*per + i)
			}
			res, err := p.SendBatch(context.Background(), ms)
			if err != nil {
				t.Errorf("batch %d: %v", g, err)
				return
			}
			ids[g] = res[0].MessageID
		})
	}
	wg.Wait()
	byTo := recorded(t, h.sb)
	if len(byTo) != workers*per {
		t.Fatalf("recorded %d recipients, want %d", len(byTo), workers*per)
	}
	for g := range workers {
		for i := range per {
			m := msg(g*per + i)
			r := byTo[m.To]
			if r.Body != m.Body || r.HTML != m.HTML || r.Subject != m.Subject || !strings.HasPrefix(r.SID, ids[g]+".") {
				t.Errorf("%s: recorded %+v, batch id %q", m.To, r, ids[g])
			}
		}
	}
	if st := h.sb.Stats(); st.Requests != workers || st.Duplicates != 0 {
		t.Errorf("stats %+v", st)
	}
}

// End to end: the provider sends, the sandbox posts signed events, and sendgrid-go's own helper
// verifies them with the published key; the magic addresses get their outcome.
func TestEventWebhookSignedAndMagicAddresses(t *testing.T) {
	type post struct {
		body    []byte
		sig, ts string
	}
	posts := make(chan post, 10)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		posts <- post{body: body, sig: r.Header.Get(eventwebhook.VerificationHTTPHeader), ts: r.Header.Get(eventwebhook.TimestampHTTPHeader)}
	}))
	defer recv.Close()
	h := newHarness(t, sandbox.Options{SendGridEventURL: recv.URL, ReceiptDelay: 10 * time.Millisecond})
	p := newProvider(t, h.srv.URL)

	ms := []providers.Message{msg(0), msg(1), msg(2), msg(3)}
	ms[1].To, ms[2].To, ms[3].To = "bounce+1@example.com", "drop+1@example.com", "defer+1@example.com"
	res, err := p.SendBatch(context.Background(), ms)
	if err != nil {
		t.Fatalf("SendBatch: %v", err)
	}
	var got post
	select {
	case got = <-posts:
	case <-time.After(5 * time.Second):
		t.Fatal("no event post within 5s")
	}
	pub, err := eventwebhook.ConvertPublicKeyBase64ToECDSA(h.sb.SendGridEventPublicKey())
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := eventwebhook.VerifySignature(pub, got.body, got.sig, got.ts); !ok || err != nil {
		t.Fatalf("signature does not verify: %v", err)
	}
	tampered := bytes.Replace(got.body, []byte(`"user_id":"u0"`), []byte(`"user_id":"u9"`), 1)
	if bytes.Equal(tampered, got.body) {
		t.Fatalf("no user_id u0 in %s", got.body)
	}
	if ok, _ := eventwebhook.VerifySignature(pub, tampered, got.sig, got.ts); ok {
		t.Errorf("a tampered body verifies")
	}
	if ok, _ := eventwebhook.VerifySignature(pub, got.body, got.sig, got.ts+"1"); ok {
		t.Errorf("a changed timestamp verifies")
	}

	var events []struct {
		Email        string `json:"email"`
		Event        string `json:"event"`
		SGMessageID  string `json:"sg_message_id"`
		CampaignID   string `json:"campaign_id"`
		UserID       string `json:"user_id"`
		SGEventID    string `json:"sg_event_id"`
		Timestamp    int64  `json:"timestamp"`
		SMTPID       string `json:"smtp-id"`
		BounceReason string `json:"reason"`
	}
	if err := json.Unmarshal(got.body, &events); err != nil {
		t.Fatal(err)
	}
	outcome := make(map[string][]string)
	for _, ev := range events {
		outcome[ev.Email] = append(outcome[ev.Email], ev.Event)
		i := slices.IndexFunc(ms, func(m providers.Message) bool { return m.To == ev.Email })
		if i < 0 || ev.CampaignID != "42" || ev.UserID != ms[i].UserID || !strings.HasPrefix(ev.SGMessageID, res[i].MessageID+".") ||
			ev.SGEventID == "" || ev.Timestamp == 0 || ev.SMTPID == "" {
			t.Errorf("event %+v", ev)
		}
	}
	want := map[string][]string{
		ms[0].To: {"processed", "delivered"}, ms[1].To: {"processed", "bounce"},
		ms[2].To: {"processed", "dropped"}, ms[3].To: {"processed", "deferred"},
	}
	if diff := cmp.Diff(want, outcome); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

func TestNewValidates(t *testing.T) {
	valid := sendgrid.Config{APIKey: testKey, From: testFrom}
	tests := []struct {
		name string
		edit func(*sendgrid.Config)
		want string // substring of the error; "" means valid
	}{
		{"valid", func(*sendgrid.Config) {}, ""},
		{"eu host", func(c *sendgrid.Config) { c.BaseURL = "https://api.eu.sendgrid.com" }, ""},
		{"sandbox url", func(c *sendgrid.Config) { c.BaseURL = "http://127.0.0.1:8025/" }, ""},
		{"no key", func(c *sendgrid.Config) { c.APIKey = "" }, "SENDGRID_API_KEY"},
		{"key with a newline", func(c *sendgrid.Config) { c.APIKey = testKey + "\n" }, "SENDGRID_API_KEY"},
		{"no sender", func(c *sendgrid.Config) { c.From = "" }, "SENDGRID_FROM"},
		{"sender with a name", func(c *sendgrid.Config) { c.From = "Shop <shop@example.com>" }, "SENDGRID_FROM"},
		{"sender not an address", func(c *sendgrid.Config) { c.From = "shop" }, "SENDGRID_FROM"},
		{"unicode sender", func(c *sendgrid.Config) { c.From = "şop@example.com" }, "SENDGRID_FROM"},
		{"sender name with a line break", func(c *sendgrid.Config) { c.FromName = "Shop\r\nBcc: all@example.com" }, "SENDGRID_FROM_NAME"},
		{"url scheme", func(c *sendgrid.Config) { c.BaseURL = "ftp://localhost" }, "SENDGRID_BASE_URL"},
		{"url path", func(c *sendgrid.Config) { c.BaseURL = "http://localhost:8025/sendgrid" }, "SENDGRID_BASE_URL"},
		{"url credentials", func(c *sendgrid.Config) { c.BaseURL = "http://user:" + testKey + "@localhost" }, "SENDGRID_BASE_URL"},
		{"url unparsable", func(c *sendgrid.Config) { c.BaseURL = "http://[::1" + testKey }, "SENDGRID_BASE_URL"},
		{"negative timeout", func(c *sendgrid.Config) { c.Timeout = -time.Second }, "timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := valid
			tt.edit(&cfg)
			p, err := sendgrid.New(cfg)
			if tt.want == "" {
				if err != nil || p == nil {
					t.Fatalf("New: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("New succeeded, want an error mentioning %s", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not mention %s", err, tt.want)
			}
			if strings.Contains(err.Error(), testKey) || strings.Contains(err.Error(), "campaignctlTestKey") {
				t.Errorf("error %q shows the key", err)
			}
		})
	}
}

// Messages that share one content (providers.Message.Shared) go out as that content once, with each
// recipient's values as substitutions, and every recipient gets, byte for byte, the message rendered for
// them. A request with a message that does not share it, or a value that holds the tags' prefix, carries
// every rendered message instead.
func TestSendBatchSharedContent(t *testing.T) {
	shared := &providers.Shared{
		Text: "Merhaba -campaignctl_v0-, kodunuz -campaignctl_v1-.",
		HTML: "<p>Merhaba -campaignctl_v2-, kodunuz <b>-campaignctl_v3-</b></p>",
		Tags: []string{"-campaignctl_v0-", "-campaignctl_v1-", "-campaignctl_v2-", "-campaignctl_v3-"},
	}
	make1 := func(i int, name string) providers.Message {
		code := fmt.Sprintf("K%04d", i)
		m := msg(i)
		m.Body = "Merhaba " + name + ", kodunuz " + code + "."
		m.HTML = "<p>Merhaba " + html.EscapeString(name) + ", kodunuz <b>" + code + "</b></p>"
		m.Shared, m.Values = shared, []string{name, code, html.EscapeString(name), code}
		return m
	}
	for _, tc := range []struct {
		name   string
		edit   func(ms []providers.Message)
		shared bool
	}{
		{"all share", func([]providers.Message) {}, true},
		{"one rendered only", func(ms []providers.Message) { ms[2].Shared, ms[2].Values = nil, nil }, false},
		{"a value holding the prefix", func(ms []providers.Message) { ms[1] = make1(1, "x-campaignctl_v1-") }, false},
		{"a subject holding the prefix", func(ms []providers.Message) { ms[3].Subject = "Ece -campaignctl_v0-" }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, sandbox.Options{})
			p := newProvider(t, h.srv.URL)
			ms := []providers.Message{make1(0, "Ayşe"), make1(1, `Ali & "Veli" <ş>`), make1(2, "Can -campaignctl_text-"), make1(3, "Ece")}
			tc.edit(ms)
			if _, err := p.SendBatch(context.Background(), ms); err != nil {
				t.Fatalf("SendBatch: %v", err)
			}
			byTo := recorded(t, h.sb)
			for i, m := range ms {
				if r := byTo[m.To]; r.Subject != m.Subject || r.Body != m.Body || r.HTML != m.HTML {
					t.Errorf("message %d: got subject %q body %q html %q; want %q %q %q", i, r.Subject, r.Body, r.HTML, m.Subject, m.Body, m.HTML)
				}
			}
			w := h.request(t, 0)
			if got := len(w.Content) == 2 && w.Content[0].Value == shared.Text && w.Content[1].Value == shared.HTML; got != tc.shared {
				t.Errorf("content %+v: shared %v, want %v", w.Content, got, tc.shared)
			}
			if tc.shared {
				for i, pz := range w.Personalizations {
					if len(pz.Substitutions) != 4 || pz.Substitutions["-campaignctl_v0-"] != ms[i].Values[0] {
						t.Errorf("personalization %d substitutions %v, want the recipient's values", i, pz.Substitutions)
					}
				}
			}
		})
	}
}

// A real newsletter's HTML is far over SendGrid's 10,000 bytes of substitutions per recipient: rendered into
// each recipient's substitutions it could only go one request per recipient, shared it goes 1000 to a
// request.
func TestSendBatchLargeSharedHTML(t *testing.T) {
	h := newHarness(t, sandbox.Options{})
	p := newProvider(t, h.srv.URL)
	page := strings.Repeat("<p>Kampanya ayrıntıları &amp; koşullar.</p>\n", 800) // about 35 KB
	shared := &providers.Shared{Text: "Kodunuz -campaignctl_v0-", HTML: page + "<b>-campaignctl_v0-</b>", Tags: []string{"-campaignctl_v0-"}}
	ms := make([]providers.Message, 1000)
	for i := range ms {
		code := fmt.Sprintf("K%04d", i)
		ms[i] = msg(i)
		ms[i].Body, ms[i].HTML = "Kodunuz "+code, page+"<b>"+code+"</b>"
		ms[i].Shared, ms[i].Values = shared, []string{code}
	}
	if _, err := p.SendBatch(context.Background(), ms); err != nil {
		t.Fatalf("SendBatch: %v", err)
	}
	if st := h.sb.Stats(); st.Requests != 1 || st.Accepted != 1000 {
		t.Fatalf("stats %+v, want one request and 1000 accepted", st)
	}
	byTo := recorded(t, h.sb)
	for i, m := range ms {
		if r := byTo[m.To]; r.Body != m.Body || r.HTML != m.HTML {
			t.Fatalf("message %d: body %q, HTML of %d bytes; want %q and %d bytes", i, r.Body, len(r.HTML), m.Body, len(m.HTML))
		}
	}
	// The same messages rendered only: refused as a whole, to be sent one by one.
	for i := range ms {
		ms[i].Shared, ms[i].Values = nil, nil
	}
	_, err := p.SendBatch(context.Background(), ms)
	if pe := providerError(t, err, ms...); pe.Class != providers.Permanent || !strings.Contains(pe.Error(), "10,000 bytes") {
		t.Fatalf("rendered 35 KB messages in one request: %v, want refused for the substitution limit", pe)
	}
}

// SendGrid substitutes in subjects too: a request whose rendered texts travel as substitutions is refused
// (before it is sent) when a subject holds their tag, so the worker sends that recipient alone, and the
// subject arrives as written.
func TestSubjectHoldingTheTextTag(t *testing.T) {
	h := newHarness(t, sandbox.Options{})
	p := newProvider(t, h.srv.URL)
	ms := []providers.Message{msg(1), msg(2)}
	ms[1].Subject = "Merhaba -campaignctl_text-"
	_, err := p.SendBatch(context.Background(), ms)
	if pe := providerError(t, err, ms...); pe.Class != providers.Permanent || pe.AccountLevel() {
		t.Fatalf("request with a tag in a subject: %v, want refused for the recipients, to be split", pe)
	}
	if st := h.sb.Stats(); st.Requests != 0 {
		t.Fatalf("%d requests reached SendGrid", st.Requests)
	}
	if _, err := p.SendBatch(context.Background(), ms[1:]); err != nil {
		t.Fatalf("the recipient alone: %v", err)
	}
	if r := recorded(t, h.sb)[ms[1].To]; r.Subject != ms[1].Subject || r.Body != ms[1].Body {
		t.Fatalf("alone: subject %q body %q", r.Subject, r.Body)
	}
}

// Warm opens the connections the next requests use (providers.Warmer).
func TestWarmOpensTheConnectionsOfTheNextRequests(t *testing.T) {
	const n = 2
	srv := providertest.NewCountingServer(t, sandbox.New(sandbox.Options{SendGridAPIKey: testKey}), nil)
	p := newProvider(t, srv.URL)
	var _ providers.Warmer = p
	if err := p.Warm(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	if got := srv.Opened(n); got != n {
		t.Fatalf("Warm(%d) opened %d connections", n, got)
	}
	var sends sync.WaitGroup
	for i := range n {
		sends.Go(func() {
			if _, err := p.SendBatch(context.Background(), []providers.Message{msg(i), msg(i + n)}); err != nil {
				t.Error(err)
			}
		})
	}
	sends.Wait()
	if got := srv.Opened(n); got != n {
		t.Errorf("%d requests after Warm(%d) opened %d connections of their own", n, n, got-n)
	}
}
