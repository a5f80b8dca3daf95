package unsubscribe

import (
	"strings"
	"testing"
)

// Every link the product signs must verify, up to the longest user ID a launch with links accepts
// (MaxUserID): before, a user ID of 400 bytes, which a launch accepted, got a link Check refused (403 "not
// valid"), and the person had no way to unsubscribe with one click. A longer token is refused.
func TestTheLongestUserIDsLinkChecks(t *testing.T) {
	s, err := New("hunt-unsubscribe-secret-0123456789", "https://hooks.example.com")
	if err != nil {
		t.Fatal(err)
	}
	for _, user := range []string{"customer-" + strings.Repeat("x", 391), strings.Repeat("ğ", MaxUserID/2)} {
		l := Link{CampaignID: 9223372036854775807, Nonce: "1y2p0ij32e8e7", UserID: user}
		tok := s.Token(l)
		if got, err := s.Check(tok); err != nil || got != l {
			t.Fatalf("the link signed for a %d-byte user ID (token %d chars) does not check: %v", len(user), len(tok), err)
		}
	}
	if _, err := s.Check(s.Token(Link{CampaignID: 1, Nonce: "1y2p0ij32e8e7", UserID: strings.Repeat("x", 4*MaxUserID)})); err == nil {
		t.Fatal("a token far longer than any link the product makes was checked")
	}
}
