package campaign

import (
	"bytes"
	"encoding/json"
	htmltemplate "html/template"
	"math/rand/v2"
	"strings"
	"testing"
	"text/template"
)

// The plain form of a part renders byte for byte what text/template and html/template render, for every
// value a recipient can have (strings with every character the escapers treat, numbers, booleans,
// missing keys), and only parts made of text and {{.field}} actions get one.
func TestPlainPartsRenderAsTheTemplatePackages(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name                string
		c                   Content
		text, subject, html bool // which parts must have a plain form
	}{
		{"sms", Content{Text: "Merhaba {{.first_name}}, kodunuz {{.code}} - RET yazıp 3338e gönderin"}, true, false, false},
		{"trim markers and repeats", Content{Text: "{{.code -}}  ,  {{- .code}} {{.first_name}}{{.first_name}}"}, true, false, false},
		{"e-mail in HTML text", Content{Subject: "{{.first_name}}, size özel", Text: "Kodunuz {{.code}}",
			HTML: `<!-- yorum --><p>Merhaba {{.first_name}},</p><p>Kodunuz: <b>{{.code}}</b></p>`}, true, true, true},
		{"value in a URL", Content{Text: "x", HTML: `<a href="https://example.com/?c={{.code}}">{{.first_name}}</a>`}, true, false, false},
		{"value in an attribute", Content{Text: "x", HTML: `<p title="{{.first_name}}">{{.code}}</p>`}, true, false, false},
		{"value in a script", Content{Text: "x", HTML: `<script>var c = {{.code}};</script>`}, true, false, false},
		{"condition", Content{Text: "{{if .first_name}}Merhaba {{.first_name}}{{end}} {{.code}}"}, false, false, false},
		{"function", Content{Text: "{{printf \"%s!\" .first_name}}", Subject: "{{.first_name | html}}"}, false, false, false},
		{"nested field", Content{Text: "{{.first_name.x}}"}, false, false, false},
		{"variable", Content{Text: "{{$x := .code}}{{$x}}"}, false, false, false},
	}
	values := []any{"", "Ayşe", "Zeynep & Can", "Ömer <Ö>", `"quoted" 'single'`, "a+b=c", "nul\x00byte", "\xff\xfe invalid utf-8",
		"çok uzun " + strings.Repeat("ğüşıöç", 50), json.Number("1234567"), json.Number("-0.5"), true, 3.25, []any{"x"}, map[string]any{"k": 1}}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tmpl, err := ParseContent(tc.c)
			if err != nil {
				t.Fatal(err)
			}
			if got := [3]bool{tmpl.plainText != nil, tmpl.plainSubject != nil, tmpl.plainHTMLPart != nil}; got != [3]bool{tc.text, tc.subject, tc.html} {
				t.Fatalf("plain forms (text, subject, html) = %v, want %v", got, [3]bool{tc.text, tc.subject, tc.html})
			}
			ref := reference(t, tc.c)
			for i := 0; i < 300; i++ {
				data := map[string]any{}
				for _, k := range []string{"first_name", "code"} {
					if i%50 != 7 || k != "code" { // now and then a missing key
						data[k] = values[rng.IntN(len(values))]
					}
				}
				got, gotErr := tmpl.RenderParts(data)
				want, wantErr := ref(data)
				if (gotErr != nil) != (wantErr != nil) {
					t.Fatalf("over %#v: error %v, the template packages' %v", data, gotErr, wantErr)
				}
				if gotErr == nil && got != want {
					t.Fatalf("over %#v:\n got %+q\nwant %+q", data, got, want)
				}
			}
		})
	}
}

// reference renders c with text/template and html/template alone.
func reference(t *testing.T, c Content) func(map[string]any) (Parts, error) {
	t.Helper()
	text := template.Must(template.New("t").Option("missingkey=error").Parse(c.Text))
	var subject *template.Template
	if c.Subject != "" {
		subject = template.Must(template.New("s").Option("missingkey=error").Parse(c.Subject))
	}
	var html *htmltemplate.Template
	if c.HTML != "" {
		html = htmltemplate.Must(htmltemplate.New("h").Option("missingkey=error").Parse(c.HTML))
	}
	return func(data map[string]any) (Parts, error) {
		var p Parts
		var b bytes.Buffer
		if err := text.Execute(&b, data); err != nil {
			return p, err
		}
		p.Text = b.String()
		if subject != nil {
			b.Reset()
			if err := subject.Execute(&b, data); err != nil {
				return p, err
			}
			p.Subject = b.String()
		}
		if html != nil {
			b.Reset()
			if err := html.Execute(&b, data); err != nil {
				return p, err
			}
			p.HTML = b.String()
		}
		return p, nil
	}
}
