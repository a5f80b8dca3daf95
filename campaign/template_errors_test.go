package campaign_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/campaignctl/campaignctl/campaign"
)

// A template that does not parse, or fails for a row, says where and what would fix it, in the
// campaign's words: not the template package's internal names ("root", "executing \"message\"").
func TestTemplateErrorsSayWhereAndTheFix(t *testing.T) {
	t.Parallel()
	data := map[string]any{"first_name": "Ada", "code": "C1"}
	for _, c := range []struct {
		src  string
		says []string
	}{
		{"Merhaba {{.first_name", []string{"does not parse", "line 1", "unclosed action (a {{ without its }})", "{{.first_name}}"}},
		{"Merhaba {{range .first_name}}x{{end}} {{.code}}", []string{"line 1, column", "range can't iterate over Ada", "needs a list"}},
		{"Merhaba {{.first_name.foo}}", []string{"at {{.first_name.foo}}", "no fields of its own: write {{.column}}"}},
		{`{{if eq .first_name 3}}x{{end}}`, []string{"incompatible types for comparison", `"quoted text"`}},
	} {
		tm, err := campaign.ParseTemplate(c.src)
		if err == nil {
			_, err = tm.Render(data)
		}
		if err == nil {
			t.Errorf("%s: no error", c.src)
			continue
		}
		msg := err.Error()
		for _, s := range c.says {
			if !strings.Contains(msg, s) {
				t.Errorf("%s: %q does not say %q", c.src, msg, s)
			}
		}
		if strings.Contains(msg, "root:") || strings.Contains(msg, `executing "`) {
			t.Errorf("%s: %q names the template package's internals", c.src, msg)
		}
		if c.src == "Merhaba {{.first_name" && !errors.Is(err, campaign.ErrInvalid) {
			t.Errorf("%s: not ErrInvalid", c.src)
		}
	}
}

// An HTML part that html/template cannot escape (it ends inside a tag, an attribute value, a comment or a
// script) is refused at parse with ErrInvalid and a message that says so, not a nil pointer at the first
// look at its fields (launch panicked, --dry-run too).
func TestAnHTMLPartThatCannotBeEscapedIsRefusedAtParse(t *testing.T) {
	for _, html := range []string{
		`<p>{{.first_name}} <b>{{.code}}</b`,
		`<a href="{{.code}}>x`,
		`<script>var x = {{.code}}`,
		`<p>{{.code}}</p><!-- {{.first_name}}`,
	} {
		tmpl, err := campaign.ParseContent(campaign.Content{Text: "Kod {{.code}}", Subject: "S", HTML: html})
		if !errors.Is(err, campaign.ErrInvalid) || !strings.Contains(err.Error(), "cannot be escaped") {
			t.Errorf("%q: %v, want ErrInvalid saying it cannot be escaped", html, err)
			continue
		}
		if tmpl != nil {
			t.Errorf("%q: a template came back with the error", html)
		}
	}
	// Well-formed HTML whose fields are missing from the data still parses (escaping needs no data).
	tmpl, err := campaign.ParseContent(campaign.Content{Text: "Kod {{.code}}", Subject: "S", HTML: `<p>{{.first_name}} <a href="https://x.example/{{.code}}">x</a></p>`})
	if err != nil {
		t.Fatal(err)
	}
	if got := tmpl.Fields(); len(got) != 2 {
		t.Errorf("fields %v, want code and first_name", got)
	}
}
