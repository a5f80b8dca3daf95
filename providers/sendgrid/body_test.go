package sendgrid

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	sgmail "github.com/sendgrid/sendgrid-go/helpers/mail"

	"github.com/campaignctl/campaignctl/providers"
)

// pieces are what the generated strings are made of: plain text, every character encoding/json escapes or
// treats specially (HTML characters, control characters, DEL, U+2028 and U+2029, bytes that are not
// UTF-8, a surrogate's encoding, a rune cut short), the tags, and non-ASCII text.
var pieces = []string{
	"a", "Merhaba ", "kod", " ", "0", "é", "ş", "İ", "ğü", "☃", "😀", "\u00a0", "\ufffd", "\u2028", "\u2029", "\u2027", "\u202a",
	`"`, `\`, "/", "<", ">", "&", "'", "+", "=", "\x00", "\x01", "\b", "\f", "\n", "\r", "\t", "\x1f", "\x7f", "\x80",
	"\xff", "\xc3", "\xe2\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "-campaignctl_v", "-campaignctl_text-", "-campaignctl_html-",
	"<p>", "&amp;", `\u003c`,
}

type gen struct{ r *rand.Rand }

func (g gen) str(max int) string {
	var b strings.Builder
	for n := g.r.IntN(max + 1); n > 0; n-- {
		b.WriteString(pieces[g.r.IntN(len(pieces))])
	}
	return b.String()
}

// maybe is s one time in four, else "".
func (g gen) maybe(s string) string {
	if g.r.IntN(4) == 0 {
		return s
	}
	return ""
}

// request generates the messages of one request: most are sendable (distinct addresses, one template ID,
// a shared content whose values fit), some are refused as the adapter must refuse them, with every field
// of a message set or empty, tags out of order and repeated. A message with shared content has the text
// and HTML its values give it (Message.Parts) as its Body and HTML, as the adapter took them before it
// read them from the content; see asSent for the messages as a worker sends them.
func (g gen) request() (*sgmail.Email, []providers.Message) {
	from := sgmail.NewEmail(g.maybe(g.str(4))+g.maybe("Kampanya A.Ş."), "kampanya@example.com")
	if g.r.IntN(20) == 0 {
		from.Address = ""
	}
	n := 1 + g.r.IntN(12)
	if g.r.IntN(50) == 0 {
		n = maxBatch + g.r.IntN(2)
	}
	template := ""
	if g.r.IntN(5) == 0 {
		template = "d-" + g.str(3)
	}
	var shared *providers.Shared
	if g.r.IntN(2) == 0 {
		shared = &providers.Shared{Text: g.str(6), HTML: g.maybe(g.str(6)) + g.maybe("<p>x</p>")}
		tags := []string{"-campaignctl_v0-", "-campaignctl_v1-", "-campaignctl_v10-", "-campaignctl_v2-", "-campaignctl_v11-", "-campaignctl_v9-", g.str(2)}
		for k := g.r.IntN(7); k > 0; k-- {
			shared.Tags = append(shared.Tags, tags[g.r.IntN(len(tags))])
		}
	}
	ms := make([]providers.Message, n)
	for i := range ms {
		m := &ms[i]
		m.To = fmt.Sprintf("alici%d@example.com", i)
		switch g.r.IntN(40) {
		case 0:
			m.To = strings.ToUpper(ms[g.r.IntN(i+1)].To)
		case 1:
			m.To = ""
		case 2:
			m.To = g.str(3) + "@example.com"
		}
		m.TemplateID = template
		if g.r.IntN(60) == 0 {
			m.TemplateID = "d-other"
		}
		m.Subject, m.Body, m.HTML = g.str(5), g.str(8), g.maybe(g.str(8))+g.maybe("<b>x</b>")
		if g.r.IntN(8) == 0 {
			m.Body = ""
		}
		if g.r.IntN(300) == 0 {
			m.HTML = strings.Repeat("<p>uzun</p>", 1000)
		}
		m.CampaignID = int64(g.r.IntN(100000)) - 10
		m.UserID = g.maybe(g.str(3)) + fmt.Sprint("u", i)
		if g.r.IntN(10) == 0 {
			m.UserID = ""
		}
		if g.r.IntN(3) > 0 {
			m.ListUnsubscribe = "<https://hooks.example.com/u/" + g.str(3) + ">" + g.maybe(", <mailto:cik@example.com?subject=unsubscribe%20x>")
		}
		if template != "" || g.r.IntN(10) == 0 {
			m.Data = map[string]string{}
			for k := g.r.IntN(6); k > 0; k-- {
				m.Data[g.str(2)] = g.str(4)
			}
		}
		if shared != nil && g.r.IntN(30) > 0 {
			m.Shared = shared
			m.Values = make([]string, len(shared.Tags))
			for k := range m.Values {
				m.Values[k] = g.str(4)
			}
			if g.r.IntN(40) == 0 {
				m.Values = m.Values[:len(m.Values)/2]
			}
			m.Body, m.HTML = m.Parts()
		}
	}
	return from, ms
}

// asSent is ms as a worker sends them: a message with shared content has no Body and HTML of its own.
func asSent(ms []providers.Message) []providers.Message {
	out := slices.Clone(ms)
	for i := range out {
		if out[i].Shared != nil {
			out[i].Body, out[i].HTML = "", ""
		}
	}
	return out
}

// The body the adapter writes is byte for byte the one sendgrid-go writes (mail.GetRequestBody) for the
// mail the adapter built with its helpers, and the adapter refuses what it refused, over generated
// requests of every layout: one message, several with their rendered text as substitutions, a shared
// content with values, a provider template with data.
func TestBodyIsWhatSendGridGoWrites(t *testing.T) {
	t.Parallel()
	g := gen{rand.New(rand.NewPCG(7, 11))}
	layouts := map[string]int{}
	for i := 0; i < 4000; i++ {
		from, ms := g.request()
		want, wantErr := referenceBody(from, ms)
		ms = asSent(ms)
		l, err := plan(ms)
		if diff := cmp.Diff(wantErr, err); diff != "" {
			t.Fatalf("request %d: refusal (-sendgrid-go +adapter):\n%s", i, diff)
		}
		if err != nil {
			layouts["refused"]++
			continue
		}
		switch {
		case l.template != "":
			layouts["template"]++
		case l.shared != nil:
			layouts["shared"]++
		case l.multi:
			layouts["multi"]++
		default:
			layouts["one"]++
		}
		got := appendBody(nil, from, ms, l)
		if !bytes.Equal(got, want) {
			t.Fatalf("request %d: body differs from sendgrid-go's\n got %s\nwant %s", i, got, want)
		}
	}
	for _, k := range []string{"refused", "template", "shared", "multi", "one"} {
		if layouts[k] < 100 {
			t.Errorf("only %d requests laid out %s: %v", layouts[k], k, layouts)
		}
	}
}

// What SendBatch puts on the wire is that body, for each layout.
func TestSendBatchSendsSendGridGosBody(t *testing.T) {
	t.Parallel()
	var got []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ = io.ReadAll(r.Body)
		w.WriteHeader(http.StatusAccepted)
	}))
	t.Cleanup(srv.Close)
	g := gen{rand.New(rand.NewPCG(13, 17))}
	sent := 0
	for sent < 200 {
		from, ms := g.request()
		want, err := referenceBody(from, ms)
		if err != nil {
			continue
		}
		p, err := New(Config{APIKey: "SG.key", From: "kampanya@example.com", BaseURL: srv.URL})
		if err != nil {
			t.Fatal(err)
		}
		p.from = from
		ms = asSent(ms)
		got = nil
		if _, err := p.SendBatch(context.Background(), ms); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("request %d: sent\n%s\nwant\n%s", sent, got, want)
		}
		sent++
	}
}

// The tags of a shared content are written in the order of a map's keys: sorted bytewise, each once,
// the value of the last of equal tags.
func TestKeyOrder(t *testing.T) {
	t.Parallel()
	tags := []string{"-v2-", "-v10-", "-v1-", "-v2-", "-v0-", "-v1-"}
	if diff := cmp.Diff([]int{4, 5, 1, 3}, keyOrder(tags)); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
}

// BenchmarkBody writes the body of 1000 personalizations of the shared content of scripts/bench.sh's
// e-mail, each with its subject, values, unsubscribe headers and custom_args: "sendgrid-go" as the SDK's
// helpers built and wrote it, "adapter" as the adapter writes it.
func BenchmarkBody(b *testing.B) {
	shared := &providers.Shared{Text: "Merhaba -campaignctl_v0-, kodunuz -campaignctl_v1-",
		HTML: "<p>Merhaba -campaignctl_v2-,</p><p>Kodunuz: <b>-campaignctl_v3-</b></p>",
		Tags: []string{"-campaignctl_v0-", "-campaignctl_v1-", "-campaignctl_v2-", "-campaignctl_v3-"}}
	names := []string{"Ayşe", "Mehmet", "Zeynep", "Mustafa", "Elif", "Ahmet", "Şükrü", "Gülşen", "İbrahim", "Çağrı"}
	ms := make([]providers.Message, maxBatch)
	for i := range ms {
		name, code := names[i%len(names)], fmt.Sprintf("KMP%07d", 7919*i%10000000)
		link := fmt.Sprintf("https://hooks.example.com/u/NDIxNzpjMDAxMDAwMDA.%022d", i)
		ms[i] = providers.Message{To: fmt.Sprintf("musteri%d@example.com", 100000+i), Subject: name + ", size özel bir kod",
			Body: "Merhaba " + name + ", kodunuz " + code, HTML: "<p>Merhaba " + name + ",</p><p>Kodunuz: <b>" + code + "</b></p>",
			Shared: shared, Values: []string{name, code, name, code}, CampaignID: 4217, UserID: fmt.Sprintf("c%08d", 100000+i),
			Commercial: true, ListUnsubscribe: "<" + link + ">"}
	}
	from := sgmail.NewEmail("", "kampanya@example.com")
	sent := asSent(ms)
	b.Run("sendgrid-go", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := referenceBody(from, ms); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("adapter", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			l, err := plan(sent)
			if err != nil {
				b.Fatal(err)
			}
			appendBody(make([]byte, 0, bodySize(sent, l)), from, sent, l)
		}
	})
}
