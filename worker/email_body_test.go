package worker

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/unsubscribe"
	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/sandbox"
	"github.com/campaignctl/campaignctl/providers/sendgrid"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata with what the code produces now")

// emailCase is one e-mail campaign of the golden requests: its content, whether it is commercial (an
// unsubscribe link and header per recipient), and its recipients' audience columns as Postgres writes a
// jsonb value.
type emailCase struct {
	name          string
	content       campaign.Content
	transactional bool
	vars          []string
}

// goldenVars are audience rows whose values need care: Turkish letters, characters JSON and HTML escape,
// control characters, line and paragraph separators, numbers, values only the template packages print, a
// NULL, a value holding the substitution tags' prefix, escapes in the stored JSON, and columns named as
// the values the engine adds.
var goldenVars = []string{
	`{"city": "İstanbul", "points": 120, "first_name": "Ayşe"}`,
	`{"city": "Ankara & <Çankaya> \"merkez\" 'x' \\ y", "points": 0, "first_name": "Zeynep & Can <VIP>"}`,
	`{"city": "satır\nsonu\tsekme\u0001\u001f\u007f", "points": -5, "first_name": "Mehmet"}`,
	`{"city": "İzmir\u2028Karşıyaka\u2029 ☃ 😀", "points": 1234567, "first_name": "Ömer"}`,
	`{"city": "Bursa", "points": 1.5e3, "first_name": "\u00c7a\u011fla \/ eğik"}`,
	`{"code": "VARS-CODE", "city": "Adana", "email": "vars@example.com", "points": 12345678901234567890, "user_id": "vars-user", "first_name": "Elif"}`,
	`{"city": "Konya", "notes": "` + string(bytes.Repeat([]byte("uzun not "), 40)) + `", "points": 7, "segment": "vip", "first_name": "Şükrü"}`,
	`{"city": "", "points": 3, "first_name": ""}`,
}

// fallbackVars make a shared request go with each recipient's rendered text (a value the plain forms do
// not print, a value holding the tags' prefix) or fail the recipient (a NULL).
var fallbackVars = []string{
	`{"city": true, "points": 1, "first_name": "Can"}`,
	`{"city": {"ilce": "Kadıköy"}, "points": [1, 2], "first_name": "Deniz"}`,
	`{"city": "-campaignctl_v0- bir şehir", "points": 2, "first_name": "Gülşen"}`,
	`{"city": null, "points": 4, "first_name": "İbrahim"}`,
}

var emailCases = []emailCase{
	{name: "shared", vars: goldenVars, content: campaign.Content{
		Subject: "{{.first_name}}, size özel bir kod",
		Text:    "Merhaba {{.first_name}}, kodunuz {{.code}} ({{.city}}, {{.points}} puan)\nKampanya A.Ş.",
		HTML:    "<p>Merhaba {{.first_name}},</p><p>Kodunuz: <b>{{.code}}</b> {{.city}} &amp; {{.points}}</p>",
	}},
	{name: "shared-fallback", vars: append(append([]string(nil), goldenVars...), fallbackVars...), content: campaign.Content{
		Subject: "{{.first_name}}, size özel bir kod",
		Text:    "Merhaba {{.first_name}}, kodunuz {{.code}} ({{.city}}, {{.points}} puan)",
		HTML:    "<p>Merhaba {{.first_name}},</p><p>Kodunuz: <b>{{.code}}</b> {{.city}}</p>",
	}},
	{name: "rendered", vars: append(append([]string(nil), goldenVars...), fallbackVars...), content: campaign.Content{
		Subject: "{{.first_name}} için {{.city}}",
		Text:    "{{if .first_name}}Merhaba {{.first_name}}{{else}}Merhaba{{end}}, kodunuz {{.code}}: {{.unsubscribe_url}}",
		HTML:    `<p><a href="https://shop.example/k?c={{.code}}&amp;u={{.user_id}}">{{.first_name}}</a> {{.city}} <a href="{{.unsubscribe_url}}">çık</a></p>`,
	}},
	{name: "text-only", transactional: true, vars: goldenVars, content: campaign.Content{
		Subject: "Siparişiniz {{.code}}",
		Text:    "Merhaba {{.first_name}}, {{.city}} şubemize bekleriz. {{.points}}",
	}},
	{name: "provider-template", vars: append(append([]string(nil), goldenVars...), fallbackVars...), content: campaign.Content{
		Subject:    "{{.first_name}}, size özel",
		TemplateID: "d-0123456789abcdef0123456789abcdef",
	}},
	{name: "one-recipient", vars: goldenVars[1:2], content: campaign.Content{
		Subject: "{{.first_name}}, size özel",
		Text:    "Merhaba {{.first_name}} ({{.city}})",
		HTML:    "<p>Merhaba {{.first_name}} ({{.city}})</p>",
	}},
	{name: "subject-with-prefix", vars: goldenVars, content: campaign.Content{
		Subject: "{{.first_name}} -campaignctl_v",
		Text:    "Merhaba {{.first_name}}, kodunuz {{.code}}",
		HTML:    "<p>Merhaba {{.first_name}}</p>",
	}},
}

// emailRequest renders tc's recipients as a batch run does (the ones that fail are listed with their
// error) and sends them in one request through the SendGrid adapter to url.
func emailRequest(t *testing.T, tc emailCase, signer *unsubscribe.Signer, mailto, url string) (failed []string, err error) {
	t.Helper()
	tmpl, err := campaign.ParseContent(tc.content)
	if err != nil {
		t.Fatal(err)
	}
	c := &campaign.Campaign{ID: 4217, Name: "golden-" + tc.name, Channel: campaign.ChannelEmail, Transactional: tc.transactional,
		TemplateID: tc.content.TemplateID}
	run := &batchRun{c: c, render: Renderer{Campaign: c, Tmpl: tmpl}}
	if c.OneClickUnsubscribe() {
		run.render.Unsubscribe, run.render.Mailto = signer, mailto
	}
	if c.TemplateID == "" {
		if f := tmpl.Shared(providers.SharedTagPrefix); f != nil {
			run.render.Form = f
			run.render.Shared = &providers.Shared{Text: f.Text, HTML: f.HTML, Tags: f.Tags}
		}
	}
	var ms []providers.Message
	for i, v := range tc.vars {
		r := campaign.Recipient{UserID: fmt.Sprintf("c%08d", 100+i), Address: fmt.Sprintf("musteri%d@example.com", 100+i),
			Vars: []byte(v), Code: fmt.Sprintf("KMP%06d", 7919*(i+1)), Consent: true}
		m, err := run.message(&r)
		if err != nil {
			failed = append(failed, r.UserID+": "+err.Error())
			continue
		}
		ms = append(ms, m)
	}
	p, err := sendgrid.New(sendgrid.Config{APIKey: "SG.golden-key", From: "kampanya@example.com", FromName: "Kampanya A.Ş. <bilgi>", BaseURL: url})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.SendBatch(context.Background(), ms)
	return failed, err
}

// The Mail Send requests of the golden campaigns (shared content, its fallback to each recipient's
// rendered text, templates the plain forms do not cover, text only, a provider template, one recipient)
// are byte for byte those under testdata/email: the recipients' values, headers, links, custom_args and
// escapes reach SendGrid as they always have. go test ./worker -run EmailRequestBodies -update rewrites
// them.
func TestEmailRequestBodiesAreUnchanged(t *testing.T) {
	t.Parallel()
	signer, err := unsubscribe.New("golden-unsubscribe-secret-0123456789", "https://hooks.example.com")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var bodies [][]byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, b)
		mu.Unlock()
		w.Header().Set("X-Message-Id", "goldenMessageId0000000")
		w.WriteHeader(http.StatusAccepted)
	}))
	t.Cleanup(srv.Close)
	for _, tc := range emailCases {
		for _, mailto := range []string{"", "cik@example.com"} {
			name := tc.name
			if mailto != "" {
				if tc.transactional {
					continue
				}
				name += "-mailto"
			}
			mu.Lock()
			bodies = nil
			mu.Unlock()
			failed, err := emailRequest(t, tc, signer, mailto, srv.URL)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			mu.Lock()
			if len(bodies) != 1 {
				t.Fatalf("%s: %d requests, want 1", name, len(bodies))
			}
			var got bytes.Buffer
			for _, f := range failed {
				fmt.Fprintf(&got, "failed %s\n", f)
			}
			got.Write(bodies[0])
			got.WriteByte('\n')
			mu.Unlock()
			path := filepath.Join("testdata", "email", name+".golden")
			if *update {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, got.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
				continue
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%s: %v (go test ./worker -run EmailRequestBodies -update writes it)", name, err)
			}
			if !bytes.Equal(got.Bytes(), want) {
				t.Errorf("%s: the request differs from %s:\n%s", name, path, cmp.Diff(string(want), got.String()))
			}
		}
	}
}

// Every golden campaign sent to the sandbox is recorded as each recipient's message rendered: subject,
// text, HTML and the one-click unsubscribe headers.
func TestEmailRequestsReachTheSandboxAsRendered(t *testing.T) {
	t.Parallel()
	signer, err := unsubscribe.New("golden-unsubscribe-secret-0123456789", "https://hooks.example.com")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range emailCases {
		if tc.content.TemplateID != "" {
			continue // the sandbox does not render SendGrid's dynamic templates
		}
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sb := sandbox.New(sandbox.Options{SendGridAPIKey: "SG.golden-key"})
			srv := httptest.NewServer(sb)
			t.Cleanup(srv.Close)
			if _, err := emailRequest(t, tc, signer, "cik@example.com", srv.URL); err != nil {
				t.Fatal(err)
			}
			want := map[string]sandbox.Message{}
			tmpl, _ := campaign.ParseContent(tc.content)
			c := &campaign.Campaign{ID: 4217, Name: "golden-" + tc.name, Channel: campaign.ChannelEmail, Transactional: tc.transactional}
			rd := Renderer{Campaign: c, Tmpl: tmpl}
			if c.OneClickUnsubscribe() {
				rd.Unsubscribe, rd.Mailto = signer, "cik@example.com"
			}
			for i, v := range tc.vars {
				r := campaign.Recipient{UserID: fmt.Sprintf("c%08d", 100+i), Address: fmt.Sprintf("musteri%d@example.com", 100+i),
					Vars: []byte(v), Code: fmt.Sprintf("KMP%06d", 7919*(i+1))}
				m, err := rd.Render(&r)
				if err != nil {
					continue
				}
				w := sandbox.Message{To: m.To, Subject: m.Subject, Body: m.Body, HTML: m.HTML}
				if m.ListUnsubscribe != "" {
					w.Headers = map[string]string{"List-Unsubscribe": m.ListUnsubscribe, "List-Unsubscribe-Post": providers.OneClickPost}
				}
				if m.HTML == "" && tc.content.HTML != "" {
					t.Fatalf("%s: no HTML rendered", m.To)
				}
				want[m.To] = w
			}
			got := map[string]sandbox.Message{}
			for _, m := range sb.Messages() {
				got[m.To] = sandbox.Message{To: m.To, Subject: m.Subject, Body: m.Body, HTML: m.HTML, Headers: m.Headers}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("recorded messages (-rendered +recorded):\n%s", diff)
			}
		})
	}
}

// A commercial e-mail's List-Unsubscribe header is its recipient's signed link, and with a mailto address
// the mailto link with the link's token, for user IDs of any length; the link the template gets is the one
// in the header.
func TestListUnsubscribeIsTheSignedLinkAndItsToken(t *testing.T) {
	t.Parallel()
	c := &campaign.Campaign{ID: 4217, Name: "golden", Channel: campaign.ChannelEmail}
	tmpl, err := campaign.ParseContent(campaign.Content{Subject: "s", Text: "{{.unsubscribe_url}}"})
	if err != nil {
		t.Fatal(err)
	}
	for _, mailto := range []string{"", "cik@example.com", "çok-uzun-bir-adres-" + strings.Repeat("x", 300) + "@example.com"} {
		rd := Renderer{Campaign: c, Tmpl: tmpl, Unsubscribe: testSigner, Mailto: mailto, Nonce: Nonce(c)}
		for _, user := range []string{"u", "c00000100", strings.Repeat("ş", 150), strings.Repeat("u/", 400)} {
			r := campaign.Recipient{UserID: user, Address: "a@example.com"}
			m, err := rd.Render(&r)
			if err != nil {
				t.Fatal(err)
			}
			l := unsubscribe.Link{CampaignID: c.ID, Nonce: Nonce(c), UserID: user}
			url := testSigner.URL(l)
			want := "<" + url + ">"
			if mailto != "" {
				want += ", <mailto:" + mailto + "?subject=unsubscribe%20" + testSigner.Token(l) + ">"
			}
			if m.ListUnsubscribe != want || r.UnsubscribeURL != url || m.Body != url {
				t.Errorf("user %.20q, mailto %.20q: header %q, link %q, text %q; want %q and %q", user, mailto, m.ListUnsubscribe, r.UnsubscribeURL, m.Body, want, url)
			}
		}
	}
}

// A message rendered for the shared form is the message rendered whole, but for the text and HTML it
// leaves to the form (its parts with its values put in are the rendered ones), and a recipient whose
// message does not render fails with the same reason either way: a missing value, a subject that would
// hold a line break, a part too long.
func TestSharedMessageIsTheRenderedOne(t *testing.T) {
	t.Parallel()
	for _, subject := range []string{
		"{{.first_name}}, size özel bir kod",
		// Not plain: the message is rendered whole, and goes with the shared content all the same.
		"{{if .first_name}}{{.first_name}}{{end}}, size özel bir kod",
	} {
		t.Run(subject, func(t *testing.T) {
			t.Parallel()
			sharedMessageIsTheRenderedOne(t, subject)
		})
	}
}

func sharedMessageIsTheRenderedOne(t *testing.T, subject string) {
	tmpl, err := campaign.ParseContent(campaign.Content{
		Subject: subject,
		Text:    "Merhaba {{.first_name}}, kodunuz {{.code}} ({{.city}}) {{.unsubscribe_url}}",
		HTML:    "<p>Merhaba {{.first_name}},</p><p>Kodunuz: <b>{{.code}}</b> {{.city}}</p>",
	})
	if err != nil {
		t.Fatal(err)
	}
	f := tmpl.Shared(providers.SharedTagPrefix)
	if f == nil {
		t.Fatal("no shared form")
	}
	c := &campaign.Campaign{ID: 4217, Name: "golden", Channel: campaign.ChannelEmail}
	whole := Renderer{Campaign: c, Tmpl: tmpl, Unsubscribe: testSigner, Mailto: "cik@example.com"}
	shared := whole
	shared.Form, shared.Shared = f, &providers.Shared{Text: f.Text, HTML: f.HTML, Tags: f.Tags}
	vars := append(append([]string(nil), goldenVars...), fallbackVars...)
	vars = append(vars,
		`{"city": "x", "first_name": "satır\nsonu"}`,
		`{"city": "x", "first_name": "satır\rsonu"}`,
		`{"first_name": "eksik şehir"}`,
		`{"city": "`+strings.Repeat("<", campaign.MaxPartBytes/4)+`", "first_name": "uzun HTML"}`,
		`{"city": "`+strings.Repeat("ş", campaign.MaxPartBytes/2)+`", "first_name": "uzun metin"}`,
		`[1]`, `{"city": "x", "first_name": "bozuk"`)
	sharedMsgs := 0
	for i, v := range vars {
		r := campaign.Recipient{UserID: fmt.Sprintf("c%08d", 100+i), Address: fmt.Sprintf("musteri%d@example.com", 100+i),
			Vars: []byte(v), Code: fmt.Sprintf("KMP%06d", 7919*(i+1))}
		r2 := r
		want, wantErr := whole.Render(&r)
		got, gotErr := shared.Render(&r2)
		if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
			t.Errorf("row %.60s: error %v, rendered whole %v", v, gotErr, wantErr)
			continue
		}
		if gotErr != nil {
			continue
		}
		if got.Shared != nil {
			sharedMsgs++
			if got.Body != "" || got.HTML != "" {
				t.Errorf("row %.60s: a message with shared content keeps a text %q and HTML %q of its own", v, got.Body, got.HTML)
			}
		}
		got.Body, got.HTML = got.Parts()
		got.Shared, got.Values = nil, nil
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("row %.60s: (-rendered whole +for the shared form):\n%s", v, diff)
		}
	}
	if sharedMsgs < len(goldenVars) {
		t.Errorf("%d messages went with the shared content, want at least %d", sharedMsgs, len(goldenVars))
	}
}
