package campaign

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// varsGen writes audience rows as JSON: the spellings Postgres writes and others (escapes, surrogate
// pairs, whitespace, repeated names, names written with escapes, nested values holding the scan's
// delimiters), and now and then a row that is not one valid object.
type varsGen struct{ r *rand.Rand }

var (
	varsNames  = []string{"first_name", "code", "city", "n", "user_id", "email", "phone", "campaign", "unsubscribe_url", "x", `first\u005fname`, `c\u006fde`}
	varsString = []string{"Ayşe", "Zeynep & Can", "<b>", `\"`, `\\`, `\/`, `\n`, `\t`, `\u00e7`, `\u0000`, `\ud83d\ude00`, `\ud800`, `\udc00x`,
		"\xff", "\xc3", "İ", "😀", "\u2028", "}", "]", ",", ":", "{", "[", " ", "-campaignctl_v0-", "'"}
	varsSpace = []string{"", "", " ", "\t", "\n", "\r\n  "}
)

func (g varsGen) sp() string { return varsSpace[g.r.IntN(len(varsSpace))] }

func (g varsGen) str() string {
	var b strings.Builder
	b.WriteByte('"')
	for n := g.r.IntN(5); n > 0; n-- {
		b.WriteString(varsString[g.r.IntN(len(varsString))])
	}
	b.WriteByte('"')
	return b.String()
}

func (g varsGen) value(depth int) string {
	switch k := g.r.IntN(14); {
	case k < 6:
		return g.str()
	case k < 9:
		return []string{"0", "-0", "7", "1234567", "-5", "1.5e3", "1E+2", "12345678901234567890", "0.000001"}[g.r.IntN(9)]
	case k == 9:
		return []string{"true", "false"}[g.r.IntN(2)]
	case k == 10:
		return "null"
	case depth > 1:
		return g.str()
	case k == 11:
		var items []string
		for n := g.r.IntN(3); n > 0; n-- {
			items = append(items, g.sp()+g.value(depth+1)+g.sp())
		}
		return "[" + strings.Join(items, ",") + "]"
	default:
		return g.object(depth + 1)
	}
}

func (g varsGen) object(depth int) string {
	var members []string
	for n := g.r.IntN(6); n > 0; n-- {
		members = append(members, g.sp()+`"`+varsNames[g.r.IntN(len(varsNames))]+`"`+g.sp()+":"+g.sp()+g.value(depth)+g.sp())
	}
	return "{" + strings.Join(members, ",") + "}"
}

func (g varsGen) vars() []byte {
	doc := g.sp() + g.object(0) + g.sp()
	switch g.r.IntN(30) {
	case 0:
		doc = doc[:g.r.IntN(len(doc)+1)]
	case 1:
		doc += ` {"x": 1}`
	case 2:
		// (Not the JSON null: a row is an object, or SQL NULL; TemplateData cannot take a null.)
		doc = []string{"", `"x"`, "[1]", "{", "{}", "\x01{}", `{"code": "a` + "\n" + `"}`}[g.r.IntN(7)]
	}
	return []byte(doc)
}

// only is data restricted to fields.
func only(data map[string]any, fields []string) map[string]any {
	out := map[string]any{}
	for _, f := range fields {
		if v, ok := data[f]; ok {
			out[f] = v
		}
	}
	return out
}

// DataOf gives the values a template reads as TemplateData has them, over generated rows, for plain
// templates (only the columns they name are decoded) and others (the whole row), and the messages
// rendered over either are the same, errors included.
func TestDataOfIsTemplateDataForWhatTheTemplateReads(t *testing.T) {
	t.Parallel()
	contents := []struct {
		c     Content
		plain bool
	}{
		{Content{Subject: "{{.first_name}}, size özel", Text: "Merhaba {{.first_name}}, kodunuz {{.code}} ({{.city}}, {{.n}})", HTML: "<p>{{.city}} {{.first_name}}</p>"}, true},
		{Content{Text: "{{.user_id}} {{.email}} {{.phone}} {{.campaign}} {{.unsubscribe_url}} {{.code}}"}, true},
		{Content{Subject: "{{.x}} için", Text: "{{.code}}", HTML: "<p>{{.n}}</p>"}, true},
		{Content{Text: "sabit metin"}, true},
		{Content{Text: "{{.x}}", HTML: `<a href="https://example.com/?c={{.code}}">{{.first_name}}</a>`}, false},
		{Content{Subject: "{{if .city}}{{.city}}{{end}}", Text: "{{.first_name}}"}, false},
	}
	g := varsGen{rand.New(rand.NewPCG(5, 8))}
	decoded := 0
	for _, tc := range contents {
		tmpl, err := ParseContent(tc.c)
		if err != nil {
			t.Fatal(err)
		}
		if (tmpl.plainFields != nil) != tc.plain {
			t.Fatalf("%+v: fields %v, want plain: %v", tc.c, tmpl.plainFields, tc.plain)
		}
		for i := 0; i < 3000; i++ {
			r := Recipient{UserID: fmt.Sprint("u", i), Address: "a@example.com", Vars: g.vars()}
			if g.r.IntN(2) == 0 {
				r.Code = "KOD1"
			}
			if g.r.IntN(2) == 0 {
				r.UnsubscribeURL = "https://hooks.example.com/u/x"
			}
			ch := []Channel{ChannelEmail, ChannelSMS}[g.r.IntN(2)]
			vars := string(r.Vars)
			want := r.TemplateData(ch, "kampanya")
			got := tmpl.DataOf(&r, ch, "kampanya")
			if string(r.Vars) != vars {
				t.Fatalf("the row changed: %q -> %q", vars, r.Vars)
			}
			if tc.plain {
				want, got = only(want, tmpl.plainFields), only(got, tmpl.plainFields)
				if json.Valid(r.Vars) {
					decoded++
				}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("%s over %s:\n(-TemplateData +DataOf):\n%s", tc.c.Text, r.Vars, diff)
			}
			wantParts, wantErr := tmpl.RenderParts(r.TemplateData(ch, "kampanya"))
			gotParts, gotErr := tmpl.RenderParts(tmpl.DataOf(&r, ch, "kampanya"))
			if fmt.Sprint(wantErr) != fmt.Sprint(gotErr) || wantParts != gotParts {
				t.Fatalf("%s over %s: rendered %+q, %v; over TemplateData %+q, %v", tc.c.Text, r.Vars, gotParts, gotErr, wantParts, wantErr)
			}
		}
	}
	if decoded < 5000 {
		t.Errorf("only %d valid rows went through the scan", decoded)
	}
}

// The HTML part takes a NULL's fallback as the text does: html/template appends its escapers to an
// action once it has run ({{or .f "x" | _html_template_htmlescaper}}), and the field was taken for
// printed, its rows excluded as missing_value.
func TestAnHTMLFallbackIsAFallback(t *testing.T) {
	tmpl, err := ParseContent(Content{Text: "Kod {{.code}}", Subject: "x", HTML: `<p>Merhaba {{or .first_name "Müşterimiz"}}</p>{{with .city}}<b>{{.}}</b>{{end}}`})
	if err != nil {
		t.Fatal(err)
	}
	if got := tmpl.PrintedFields(); slices.Contains(got, "first_name") || slices.Contains(got, "city") {
		t.Fatalf("printed fields %v: first_name and city are only tested", got)
	}
	parts, err := tmpl.RenderParts(map[string]any{"code": "K1"})
	if err != nil || !strings.Contains(parts.HTML, "Merhaba Müşterimiz") {
		t.Fatalf("HTML %q (%v), want the fallback", parts.HTML, err)
	}
}
