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
