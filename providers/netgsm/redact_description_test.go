package netgsm_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/netgsm"
)

// Netgsm's description may quote the number as the operator wrote it ("0532 123 45 67", "+90 532 123 4567",
// "90-532-123-45-67"): the error, stored as the recipient's reason and logged, must not carry it (the
// Twilio adapter blanks anything phone-shaped for the same reason).
func TestReformattedNumberInDescriptionIsRedacted(t *testing.T) {
	t.Parallel()
	for _, desc := range []string{
		"Hatalı numara: 0532 123 45 67",
		"Hatalı numara: +90 532 123 4567",
		"Numara 0(532)1234567 İYS onayı yok",
		// Dots and slashes, as often as spaces in Turkish: the general pattern cannot take them without
		// eating dates and IP addresses; the recipient's own digits are masked however they are separated.
		"Hatalı numara: 0532.123.45.67",
		"Hatalı numara: 0532/123 45 67",
		"Numara 532.123.4567 İYS onayı yok",
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"code":"50","description":"` + desc + `"}`))
		}))
		p, err := netgsm.New(netgsm.Config{UserCode: "8503000000", Password: "s3cretpass", Header: "KAMPANYA", BaseURL: srv.URL})
		if err != nil {
			t.Fatal(err)
		}
		_, err = p.Send(context.Background(), providers.Message{To: "+905321234567", Body: "kod", Commercial: true})
		srv.Close()
		var pe *providers.Error
		if err == nil || !strings.Contains(err.Error(), "code 50") {
			t.Fatalf("err %v", err)
		}
		pe = err.(*providers.Error)
		digits := strings.Map(func(r rune) rune {
			if r >= '0' && r <= '9' {
				return r
			}
			return -1
		}, pe.Reason())
		if strings.Contains(digits, "5321234567") {
			t.Errorf("the recipient's number is in the reason stored and logged: %q", pe.Reason())
		}
	}
}
