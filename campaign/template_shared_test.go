package campaign

import (
	"encoding/json"
	"math/rand/v2"
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
