package campaign_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/iys"
)

// Every channel's registration is complete: a name --channel takes, an address column and how addresses
// are canonicalised, exactly one consent rule (an İYS type, or an opt-in column of the audience), a batch
// size a launch accepts; and the help lists it. The CLI's own test checks that a provider sends it.
func TestEveryChannelIsRegisteredCompletely(t *testing.T) {
	t.Parallel()
	chs := campaign.Channels()
	if len(chs) == 0 {
		t.Fatal("no channel is registered")
	}
	seen := map[campaign.Channel]bool{}
	for _, ch := range chs {
		name := ch.Name
		if name == "" || seen[name] || name != campaign.Channel(strings.ToLower(string(name))) {
			t.Errorf("channel %q: the name must be set, lower case and registered once", name)
		}
		seen[name] = true
		if got, err := campaign.ParseChannel(string(name)); err != nil || got != name {
			t.Errorf("channel %s: ParseChannel gives %q, %v", name, got, err)
		}
		if !strings.Contains(campaign.ChannelChoices(), string(name)) {
			t.Errorf("channel %s: not in the choices help lists (%q)", name, campaign.ChannelChoices())
		}
		if ch.Title == "" {
			t.Errorf("channel %s: no title for messages", name)
		}
		if ch.AddressColumn == "" || ch.Canonical == nil {
			t.Errorf("channel %s: address column %q, canonical form set %v: both are needed to read an audience", name, ch.AddressColumn, ch.Canonical != nil)
		}
		if name.Spec().AddressColumn != ch.AddressColumn || name.AddressColumn() != ch.AddressColumn {
			t.Errorf("channel %s: Spec and AddressColumn disagree with the registration", name)
		}
		switch {
		case (ch.IYSType == "") == (ch.OptInColumn == ""):
			t.Errorf("channel %s: İYS type %q and opt-in column %q: exactly one consent rule must be set", name, ch.IYSType, ch.OptInColumn)
		case ch.IYSType != "" && ch.IYSType != iys.TypeMessage && ch.IYSType != iys.TypeEmail && ch.IYSType != iys.TypeCall:
			t.Errorf("channel %s: İYS type %q is none İYS knows", name, ch.IYSType)
		case ch.OptInColumn != "" && (ch.OptInColumn == ch.AddressColumn || ch.OptInColumn == "user_id"):
			t.Errorf("channel %s: the opt-in column %q must be a column of its own", name, ch.OptInColumn)
		}
		if ch.BatchSize < 1 || ch.BatchSize > 10000 {
			t.Errorf("channel %s: batch size %d, want 1 to 10000 (what a launch accepts)", name, ch.BatchSize)
		}
	}
	if _, err := campaign.ParseChannel("fax"); !errors.Is(err, campaign.ErrInvalid) || !strings.Contains(err.Error(), campaign.ChannelChoices()) {
		t.Errorf("an unknown channel: %v; want ErrInvalid listing the channels", err)
	}
	if campaign.Channel("fax").Spec().Name != "" {
		t.Error("an unknown channel has a registration")
	}
}

// Each channel canonicalises its addresses as campaigns store them and İYS records them, and refuses what
// cannot be sent to.
func TestChannelAddressesAreCanonical(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ch       campaign.Channel
		raw, out string
		ok       bool
	}{
		{campaign.ChannelSMS, "0532 111 11 11", "+905321111111", true},
		{campaign.ChannelSMS, "12345", "", false},
		{campaign.ChannelEmail, " Ayse@Example.COM ", "ayse@example.com", true},
		{campaign.ChannelEmail, "ayse", "", false},
		{campaign.ChannelPush, " tok-1 ", "tok-1", true},
		{campaign.ChannelPush, "tok 1", "", false},
		{campaign.ChannelPush, "tok-ı", "", false},
		{campaign.ChannelPush, strings.Repeat("t", 4097), "", false},
		{campaign.ChannelWebhook, " u-1 ", "u-1", true},
		{campaign.ChannelWebhook, "  ", "", false},
		{campaign.ChannelWebhook, "müşteri 1", "müşteri 1", true},
	} {
		got, err := tc.ch.Spec().Canonical(tc.raw)
		if (err == nil) != tc.ok || (tc.ok && got != tc.out) {
			t.Errorf("%s %.20q: %q, %v; want %q (valid %v)", tc.ch, tc.raw, got, err, tc.out, tc.ok)
		}
	}
}
