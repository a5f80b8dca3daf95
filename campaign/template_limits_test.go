package campaign

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// A template is bounded in what it may do and produce: each case is refused when parsed, or fails fast
// when rendered, with ErrInvalid and words that say what to change.
func TestTemplateLimits(t *testing.T) {
	big := strings.Repeat("x", 60<<10)
	for _, tc := range []struct {
		name, text string
		data       map[string]any
		parse      bool // refused when parsed (else when rendered)
		says       string
	}{
		{"a billion loops", `{{range 1000000000}}x{{end}}`, nil, false, "more than 1000 items"},
		{"a billion silent loops", `{{range 1000000000}}{{end}}`, nil, false, "more than 1000 items"},
		{"a loop over a value", `{{range .n}}x{{end}}`, map[string]any{"n": int64(5000000)}, false, "more than 1000 items"},
		{"loops inside loops", `{{range 1000}}{{range 1000}}{{range 1000}}{{end}}{{end}}{{end}}`, nil, true, "nests {{range}}"},
		{"two loops of a thousand", `{{range 1000}}{{range 1000}}{{end}}{{end}}`, nil, false, "in all"},
		{"a megabyte of output", `{{range 1000}}{{$.big}}{{end}}`, map[string]any{"big": big}, false, "longer than 1024 KiB"},
		{"a wide printf", `{{printf "%0999999d" 1}}`, nil, false, "width or precision"},
		{"a wide printf by argument", `{{printf "%*d" 999999 1}}`, nil, false, "width or precision"},
		{"a template of its own", `{{define "a"}}{{template "a"}}{{end}}{{template "a"}}`, nil, true, "defines templates"},
		{"a block", `{{block "b" .}}x{{end}}`, nil, true, "defines templates"},
		{"the whole row", `Merhaba {{.}}`, nil, true, "{{.}}"},
		{"the whole row through printf", `Merhaba {{printf "%v" .}}`, nil, true, "{{.}}"},
		{"the whole row as $", `{{range 2}}{{$}}{{end}}`, nil, true, "{{$}}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmpl, err := ParseTemplate(tc.text)
			if tc.parse {
				if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.says) {
					t.Fatalf("parse: %v, want ErrInvalid saying %q", err, tc.says)
				}
				return
			}
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			data := map[string]any{"first_name": "Ali"}
			for k, v := range tc.data {
				data[k] = v
			}
			start := time.Now()
			out, err := tmpl.Render(data)
			if took := time.Since(start); took > 2*RenderDeadline {
				t.Errorf("render took %v", took)
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("render: %d bytes, %v; want ErrInvalid saying %q", len(out), err, tc.says)
			}
			if _, ok := data[budgetKey]; ok {
				t.Error("the render's budget was left in the data")
			}
		})
	}
	// What a message does need still works: a short loop, dot inside it, a printf of sensible width.
	tmpl, err := ParseTemplate(`{{range .items}}[{{.}}]{{end}} {{printf "%05d" .n}} {{with .first_name}}{{.}}{{end}}`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := tmpl.Render(map[string]any{"items": []any{"a", "b"}, "n": 42, "first_name": "Ali"})
	if err != nil || out != "[a][b] 00042 Ali" {
		t.Fatalf("render %q, %v", out, err)
	}
}

// The subject and the HTML part are bounded the same way.
func TestTemplateLimitsCoverEveryPart(t *testing.T) {
	for _, c := range []Content{
		{Text: "x", Subject: "{{.}}"},
		{Text: "x", HTML: "<p>{{.}}</p>"},
		{Text: "x", HTML: `{{define "a"}}{{end}}`},
	} {
		if _, err := ParseContent(c); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: %v, want ErrInvalid", c, err)
		}
	}
	tmpl, err := ParseContent(Content{Text: "x", Subject: "{{range 5000}}x{{end}}", HTML: "<p>{{range 5000}}x{{end}}</p>"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tmpl.RenderParts(map[string]any{}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "more than 1000 items") {
		t.Fatalf("render: %v", err)
	}
}

// A field no audience column gives is reported with the part that uses it, so the fix goes where it
// belongs: the message, the subject or the HTML part.
func TestAMissingFieldNamesThePartThatUsesIt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		c    Content
		part string
	}{
		{Content{Text: "Merhaba {{.nick}}"}, "the message template uses {{.nick}}"},
		{Content{Text: "Merhaba", Subject: "Selam {{.nick}}"}, "the subject (--subject) uses {{.nick}}"},
		{Content{Text: "Merhaba", HTML: "<p>{{.nick}}</p>"}, "the HTML part (--html) uses {{.nick}}"},
	} {
		tmpl, err := ParseContent(tc.c)
		if err != nil {
			t.Fatal(err)
		}
		if err := tmpl.Check([]string{"first_name"}); err == nil || !strings.Contains(err.Error(), tc.part) {
			t.Errorf("%+v: %v; want it to say %q", tc.c, err, tc.part)
		}
	}
}
