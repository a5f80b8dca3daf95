package campaign_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/campaignctl/campaignctl/campaign"
)

// benchData returns n recipients' template data (first_name, code, phone, plus the e-mail columns),
// each different, so that a benchmark cycling through them renders new values every op. Some names
// carry characters that html/template must escape.
func benchData(n int) []map[string]any {
	names := []string{"Ayşe", "Mehmet", "Zeynep & Can", "Ömer <Ö>", "Elif", "Çağrı"}
	out := make([]map[string]any, n)
	for i := range out {
		out[i] = map[string]any{
			"first_name": names[i%len(names)],
			"code":       fmt.Sprintf("KMP%06d", 104729*(i+1)%1000000),
			"phone":      fmt.Sprintf("+90532%07d", 1000000+i),
			"email":      fmt.Sprintf("user%d@example.com", i),
			"user_id":    fmt.Sprintf("u%d", i),
			"campaign":   "yaz-indirimi",
		}
	}
	return out
}

// BenchmarkRenderSMS measures rendering one SMS body (text/template with missingkey=error) for one
// recipient, as the worker does per message; the data maps are built beforehand and cycled.
//
//	go test ./campaign -run '^$' -bench RenderSMS -benchtime 2s
func BenchmarkRenderSMS(b *testing.B) {
	tmpl, err := campaign.ParseContent(campaign.Content{
		Text: "Merhaba {{.first_name}}, kodunuz {{.code}} - Kampanya A.Ş. RET yazıp 3338e gönderin",
	})
	if err != nil {
		b.Fatal(err)
	}
	data := benchData(64)

	p, err := tmpl.RenderParts(data[2])
	if err != nil {
		b.Fatal(err)
	}
	if want := "Merhaba Zeynep & Can, kodunuz " + data[2]["code"].(string) + " - Kampanya A.Ş."; !strings.HasPrefix(p.Text, want) {
		b.Fatalf("rendered %q, want it to start with %q", p.Text, want)
	}

	renderLoop(b, tmpl, data)
}

// BenchmarkRenderEmail measures rendering one e-mail for one recipient: the subject and the plain-text
// body (text/template) and the HTML body (html/template, which escapes every value).
//
//	go test ./campaign -run '^$' -bench RenderEmail -benchtime 2s
func BenchmarkRenderEmail(b *testing.B) {
	tmpl, err := campaign.ParseContent(campaign.Content{
		Subject: "{{.first_name}}, yaz indirimi kodunuz hazır",
		Text: "Merhaba {{.first_name}},\n\nYaz indirimi kodunuz: {{.code}}\n" +
			"Kodu sepette girin; 31 Ağustos'a kadar geçerli.\n\n" +
			"Kampanya A.Ş. (MERSİS 0123456789000017)\n" +
			"Bu e-postaları almak istemiyorsanız: https://example.com/unsubscribe?u={{.user_id}}\n",
		HTML: `<!doctype html><html><body>` +
			`<p>Merhaba <b>{{.first_name}}</b>,</p>` +
			`<p>Yaz indirimi kodunuz: <code>{{.code}}</code></p>` +
			`<p><a href="https://example.com/shop?c={{.code}}&amp;u={{.user_id}}">Alışverişe başla</a></p>` +
			`<p style="font-size:11px">Kampanya A.Ş. (MERSİS 0123456789000017) · ` +
			`<a href="https://example.com/unsubscribe?u={{.user_id}}">Abonelikten çık</a></p>` +
			`</body></html>`,
	})
	if err != nil {
		b.Fatal(err)
	}
	data := benchData(64)

	d := data[3] // "Ömer <Ö>": the HTML part must escape it
	p, err := tmpl.RenderParts(d)
	if err != nil {
		b.Fatal(err)
	}
	code := d["code"].(string)
	switch {
	case p.Subject != "Ömer <Ö>, yaz indirimi kodunuz hazır":
		b.Fatalf("subject %q", p.Subject)
	case !strings.Contains(p.Text, "Yaz indirimi kodunuz: "+code):
		b.Fatalf("text part lacks the code %s: %q", code, p.Text)
	case !strings.Contains(p.HTML, "<code>"+code+"</code>"):
		b.Fatalf("HTML part lacks the code %s: %q", code, p.HTML)
	case !strings.Contains(p.HTML, "<b>Ömer &lt;Ö&gt;</b>"):
		b.Fatalf("HTML part does not escape the name: %q", p.HTML)
	}

	renderLoop(b, tmpl, data)
}

// BenchmarkRenderEmailPlain is BenchmarkRenderEmail for an e-mail whose values all sit in text (no link
// carries one): every part renders in its plain form, without the template packages.
//
//	go test ./campaign -run '^$' -bench RenderEmailPlain -benchtime 2s
func BenchmarkRenderEmailPlain(b *testing.B) {
	tmpl, err := campaign.ParseContent(campaign.Content{
		Subject: "{{.first_name}}, yaz indirimi kodunuz hazır",
		Text:    "Merhaba {{.first_name}},\n\nYaz indirimi kodunuz: {{.code}}\nKampanya A.Ş.\n",
		HTML:    `<p>Merhaba <b>{{.first_name}}</b>,</p><p>Yaz indirimi kodunuz: <code>{{.code}}</code></p><p>Kampanya A.Ş.</p>`,
	})
	if err != nil {
		b.Fatal(err)
	}
	data := benchData(64)
	if p, err := tmpl.RenderParts(data[3]); err != nil || !strings.Contains(p.HTML, "<b>Ömer &lt;Ö&gt;</b>") {
		b.Fatalf("HTML part %q (%v) does not escape the name", p.HTML, err)
	}
	renderLoop(b, tmpl, data)
}

// renderLoop is the timed part of the rendering benchmarks: one message per iteration, cycling through data.
func renderLoop(b *testing.B, tmpl *campaign.Template, data []map[string]any) {
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := tmpl.RenderParts(data[i%len(data)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
