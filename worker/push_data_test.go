package worker

import (
	"maps"
	"slices"
	"testing"

	"github.com/campaignctl/campaignctl/campaign"
)

// A push's data payload carries what the app needs, not the whole audience row: the engine's values
// (code, campaign, user), the columns the message prints, and the columns named data_*. An e-mail address
// or phone number the audience selected went to FCM and to the device before; so did a column named as
// one of FCM's reserved keys, which failed every message of the campaign.
func TestAPushsDataCarriesOnlyWhatTheAppNeeds(t *testing.T) {
	t.Parallel()
	vars := `{"first_name": "Ayşe", "email": "ayse@example.com", "phone": "0530 123 45 67", "data_link": "app://offer/7", "google_campaign": "x", "from": "y"}`
	for _, tc := range []struct {
		name, subject, body string
		want                []string
	}{
		{"plain", "Merhaba {{.first_name}}", "Kodunuz {{.code}}", []string{"campaign", "code", "data_link", "first_name", "user_id"}},
		// A template that is not plain may read anything: only the engine's values and data_* go.
		{"not plain", `{{if .first_name}}Merhaba {{.first_name}}{{end}}`, "Kodunuz {{.code}}", []string{"campaign", "code", "data_link", "user_id"}},
	} {
		tmpl, err := campaign.ParseContent(campaign.Content{Subject: tc.subject, Text: tc.body})
		if err != nil {
			t.Fatal(err)
		}
		c := &campaign.Campaign{ID: 7, Name: "yaz", Channel: campaign.ChannelPush}
		rd := Renderer{Campaign: c, Tmpl: tmpl}
		m, err := rd.Render(&campaign.Recipient{UserID: "u7", Address: "tok-7", Vars: []byte(vars), Code: "KOD-7"})
		if err != nil {
			t.Fatal(err)
		}
		if got := slices.Sorted(maps.Keys(m.Data)); !slices.Equal(got, tc.want) {
			t.Errorf("%s: the data payload has %v; want %v (%v)", tc.name, got, tc.want, m.Data)
		}
		if m.Data["code"] != "KOD-7" || m.Data["data_link"] != "app://offer/7" {
			t.Errorf("%s: data %v", tc.name, m.Data)
		}
	}
}
