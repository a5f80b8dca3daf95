package providers_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/campaignctl/campaignctl/providers"
)

// A message's parts are its Body and HTML, or its shared content with its values put in for the tags in
// one pass: a tag that is a prefix of none of the others, each value as it is (a value that holds a tag
// is not substituted again), a tag that occurs twice replaced twice.
func TestMessageParts(t *testing.T) {
	t.Parallel()
	shared := &providers.Shared{
		Text: "Merhaba -campaignctl_v0-, kodunuz -campaignctl_v1- (-campaignctl_v10-) -campaignctl_v0-",
		HTML: "<p>-campaignctl_v2-</p>",
		Tags: []string{"-campaignctl_v0-", "-campaignctl_v1-", "-campaignctl_v2-", "-campaignctl_v3-", "-campaignctl_v4-", "-campaignctl_v5-",
			"-campaignctl_v6-", "-campaignctl_v7-", "-campaignctl_v8-", "-campaignctl_v9-", "-campaignctl_v10-"},
	}
	vals := []string{"Ayşe -campaignctl_v1-", "K1", "Zeynep &amp; Can", "", "", "", "", "", "", "", "on"}
	cases := []struct {
		name       string
		m          providers.Message
		text, html string
	}{
		{"rendered", providers.Message{Body: "metin", HTML: "<p>x</p>"}, "metin", "<p>x</p>"},
		{"shared", providers.Message{Body: "ignored", Shared: shared, Values: vals},
			"Merhaba Ayşe -campaignctl_v1-, kodunuz K1 (on) Ayşe -campaignctl_v1-", "<p>Zeynep &amp; Can</p>"},
	}
	for _, tc := range cases {
		text, html := tc.m.Parts()
		if diff := cmp.Diff([2]string{tc.text, tc.html}, [2]string{text, html}); diff != "" {
			t.Errorf("%s: parts (-want +got):\n%s", tc.name, diff)
		}
	}
}
