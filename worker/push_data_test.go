package worker

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/providers"
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

// A token FCM cannot reach for the project's APNs or web push credentials (THIRD_PARTY_AUTH_ERROR) waits
// alone for a later run; the batch's other tokens go. Before, one such token held the whole campaign as
// provider_auth, Android tokens included: an outside run crawled at half a message a second.
func TestAThirdPartyAuthErrorHoldsItsTokenAloneNotTheCampaign(t *testing.T) {
	t.Parallel()
	db, store, _, launch := pushPlan(t)
	ctx := context.Background()
	if _, err := db.Exec(ctx, `UPDATE devices SET push_token = 'thirdparty-1' WHERE user_id = 'u1'`); err != nil {
		t.Fatal(err)
	}
	id := launch("push-apns").ID
	rdb, _ := testredis.New(t)
	for _, window := range []int{1, 8} {
		h := NewHandler(Config{Store: store, Redis: rdb, Owner: "w", SendWindow: window,
			Providers:     map[campaign.Channel]providers.Provider{campaign.ChannelPush: pushProvider(t)},
			ProviderRates: map[string]float64{}})
		err := h.RunBatch(ctx, id, 0)
		var re *RetryError
		if !errors.As(err, &re) || re.Failure || !re.Wait || re.After < 9*time.Minute {
			t.Fatalf("window %d: the run returned %v; want the batch back in about ten minutes for u1 alone, not a failure", window, err)
		}
		c, err := store.Counts(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if c.Sent != 4 || c.Pending != 1 {
			t.Fatalf("window %d: counts %+v; want the 4 other tokens sent, u1 pending", window, c)
		}
		if w, _ := state.Waits(ctx, rdb, id); len(w) > 0 {
			t.Errorf("window %d: the campaign is said to wait for %v", window, w)
		}
	}
}
