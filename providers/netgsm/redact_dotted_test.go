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

// Turkish numbers are as often written with dots or slashes as with spaces ("0532.123.45.67",
// "0532/123 45 67", "0 532 123.45.67"): MaskPhoneLike only knows spaces, hyphens and brackets, so such a
// quote of the recipient in Netgsm's description is stored as the reason and logged.
func TestDottedNumberInDescriptionIsRedacted(t *testing.T) {
	t.Parallel()
	for _, desc := range []string{
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
		pe, ok := err.(*providers.Error)
		if !ok {
			t.Fatalf("err %v", err)
		}
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
