package campaign

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// The shared form of an e-mail, with each recipient's values put in for its tags in one pass, is byte for
// byte what the template packages render for that recipient; only templates whose text and HTML are plain
// (text and {{.field}}) and whose own text never holds the tags' prefix get one; a value only the template
// packages print (not a string or number) leaves the recipient without values.
func TestSharedFormRendersAsTheTemplatePackages(t *testing.T) {
	t.Parallel()
	const prefix = "-campaignctl_v"
	cases := []struct {
		name   string
		c      Content
		shared bool
	}{
		{"text only", Content{Subject: "{{.first_name}}", Text: "Merhaba {{.first_name}}, kodunuz {{.code}}"}, true},
		{"text and HTML", Content{Subject: "Size özel", Text: "Kodunuz {{.code}} {{.code}}",
			HTML: `<!-- yorum --><p>Merhaba {{.first_name}},</p><p>Kodunuz: <b>{{.code}}</b> &amp; -</p>`}, true},
		{"tag-like text", Content{Text: "-{{.code}}-campaignctl_{{.first_name}}-", HTML: "<p>-{{.code}}-</p>"}, true},
		{"the prefix in the text", Content{Text: "x -campaignctl_v0- {{.code}}"}, false},
		{"the prefix in the HTML", Content{Text: "{{.code}}", HTML: "<p>-campaignctl_v {{.code}}</p>"}, false},
		{"value in a URL", Content{Text: "x", HTML: `<a href="https://example.com/?c={{.code}}">{{.first_name}}</a>`}, false},
		{"condition", Content{Text: "{{if .first_name}}Merhaba {{.first_name}}{{end}} {{.code}}"}, false},
		{"provider template", Content{TemplateID: "d-0123"}, false},
	}
	values := []any{"", "Ayşe", "Zeynep & Can", "Ömer <Ö>", `"quoted" 'single'`, "a+b=c", "nul\x00byte", "\xff\xfe invalid utf-8",
		"-campaignctl_v0-", "-campaignctl_v1- x", "çok uzun " + strings.Repeat("ğüşıöç", 50), json.Number("1234567"), true, 3.25}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tmpl, err := ParseContent(tc.c)
			if err != nil {
				t.Fatal(err)
			}
			f := tmpl.Shared(prefix)
			if (f != nil) != tc.shared {
				t.Fatalf("shared form %+v, want one: %v", f, tc.shared)
			}
			if f == nil {
				return
			}
			for _, tag := range f.Tags {
				if !strings.HasPrefix(tag, prefix) || strings.Count(f.Text+f.HTML, prefix) < 1 {
					t.Fatalf("tag %q, content %q %q", tag, f.Text, f.HTML)
				}
			}
			for i := 0; i < 300; i++ {
				data := map[string]any{}
				for _, k := range []string{"first_name", "code"} {
					data[k] = values[rng.IntN(len(values))]
				}
				want, err := tmpl.RenderParts(data)
				if err != nil {
					t.Fatal(err)
				}
				vals, ok, err := f.Values(data)
				if err != nil {
					t.Fatal(err)
				}
				_, plainish := data["first_name"].(bool)
				_, f64 := data["first_name"].(float64)
				_, cb := data["code"].(bool)
				_, cf := data["code"].(float64)
				if ok == (plainish || f64 || cb || cf) {
					t.Fatalf("over %#v: values ok %v", data, ok)
				}
				if !ok {
					continue
				}
				if got := SubstituteOnce(f.Text, f.Tags, vals); got != want.Text {
					t.Fatalf("over %#v: text %q, want %q", data, got, want.Text)
				}
				if got := SubstituteOnce(f.HTML, f.Tags, vals); got != want.HTML {
					t.Fatalf("over %#v: HTML %q, want %q", data, got, want.HTML)
				}
			}
			if _, _, err := f.Values(map[string]any{"code": "x"}); err == nil {
				t.Fatal("a missing value gave no error")
			}
		})
	}
}

// RenderShared gives a recipient's subject and values as RenderParts and the form's Values give them over
// the recipient's data, and their text and HTML with the values put in are RenderParts' text and HTML;
// it fails where RenderParts fails, with its error (a missing value in each part, a part too long, in
// escapes too), and leaves to RenderParts exactly the rows it cannot render (a value only the template
// packages print, a row that is not one valid JSON object) and the templates that are not plain.
func TestRenderSharedIsRenderPartsWithTheFormsValues(t *testing.T) {
	t.Parallel()
	contents := []struct {
		c     Content
		plain bool // every part plain: RenderShared renders
	}{
		{Content{Subject: "{{.first_name}}, size özel", Text: "Merhaba {{.first_name}}, kodunuz {{.code}} ({{.city}}, {{.n}})",
			HTML: "<p>{{.city}} {{.first_name}} <b>{{.code}}</b></p>"}, true},
		{Content{Subject: "{{.n}} için", Text: "{{.code}} {{.user_id}} {{.email}} {{.phone}}", HTML: "<p>{{.n}} {{.campaign}} {{.unsubscribe_url}}</p>"}, true},
		{Content{Text: "{{.city}}{{.city}} {{.x}}", HTML: "<i>{{.x}}</i>"}, true},
		{Content{Subject: "sabit", Text: "yalnız metin {{.first_name}}"}, true},
		{Content{Subject: "{{if .first_name}}{{.first_name}}{{end}}", Text: "{{.first_name}}", HTML: "<p>{{.code}}</p>"}, false},
	}
	g := varsGen{rand.New(rand.NewPCG(21, 34))}
	huge := strings.Repeat("<", MaxPartBytes/4+10) // fits the text, not the HTML once escaped
	rendered := 0
	for _, tc := range contents {
		tmpl, err := ParseContent(tc.c)
		if err != nil {
			t.Fatal(err)
		}
		f := tmpl.Shared("-campaignctl_v")
		if f == nil {
			t.Fatalf("%+v has no shared form", tc.c)
		}
		for i := 0; i < 3000; i++ {
			r := Recipient{UserID: fmt.Sprint("u", i), Address: "a@example.com", Vars: g.vars()}
			if g.r.IntN(2) == 0 {
				r.Code = "KOD1"
			}
			if g.r.IntN(2) == 0 {
				r.UnsubscribeURL = "https://hooks.example.com/u/x"
			}
			if g.r.IntN(2) == 0 {
				// A row with every field the templates read, strings and numbers, and some more members.
				var m []string
				for _, k := range []string{"first_name", "city", "n", "x", "code"} {
					v := g.str()
					if g.r.IntN(3) == 0 {
						v = "-12.5e3"
					}
					m = append(m, g.sp()+`"`+k+`":`+g.sp()+v)
				}
				r.Vars = []byte("{" + strings.Join(m, ",") + "," + string(g.object(0)[1:]))
				if bytes.HasSuffix(r.Vars, []byte(",}")) {
					r.Vars = append(r.Vars[:len(r.Vars)-2], '}')
				}
			}
			if i%500 == 7 {
				r.Vars = []byte(`{"city": "` + huge + `", "x": "` + huge + `", "first_name": "` + huge[:MaxPartBytes/8] + `", "n": 1}`)
			}
			ch := []Channel{ChannelEmail, ChannelSMS}[g.r.IntN(2)]
			data := tmpl.DataOf(&r, ch, "kampanya")
			want, wantErr := tmpl.RenderParts(data)
			wantVals, _, _ := f.Values(data)
			plain := true
			for _, v := range data {
				switch v.(type) {
				case string, json.Number:
				default:
					plain = false
				}
			}
			got, ok, err := tmpl.RenderShared(f, &r, ch, "kampanya")
			object := len(r.Vars) == 0 || (json.Valid(r.Vars) && bytes.TrimSpace(r.Vars)[0] == '{')
			wantOK := tc.plain && plain && object
			if ok != wantOK {
				t.Fatalf("%s over %.200s: rendered %v, want %v", tc.c.Text, r.Vars, ok, wantOK)
			}
			if !ok {
				continue
			}
			if fmt.Sprint(err) != fmt.Sprint(wantErr) {
				t.Fatalf("%s over %.200s: error %v, RenderParts' %v", tc.c.Text, r.Vars, err, wantErr)
			}
			if err != nil {
				continue
			}
			rendered++
			if got.Subject != want.Subject || !slices.Equal(got.Values, wantVals) ||
				SubstituteOnce(f.Text, f.Tags, got.Values) != want.Text || SubstituteOnce(f.HTML, f.Tags, got.Values) != want.HTML {
				t.Fatalf("%s over %.200s:\n got %+q %+q\nwant %+q %+q", tc.c.Text, r.Vars, got.Subject, got.Values, want, wantVals)
			}
		}
	}
	if rendered < 2000 {
		t.Errorf("only %d messages rendered without error", rendered)
	}
}
