package netgsm_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"html"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

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

// A description that quotes the password in another spelling (escaped for a URL or HTML, in another case,
// inside the Basic credentials) carries none of them into the error, on the send and on the report.
func TestPasswordInAnySpellingIsRedacted(t *testing.T) {
	t.Parallel()
	const user, pass = "8503000000", "S3cret&Pw<1"
	basic := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
	for _, quoted := range []string{pass, url.QueryEscape(pass), html.EscapeString(pass), strings.ToUpper(pass), strings.ToLower(pass), "Basic " + basic} {
		desc, _ := json.Marshal("Geçersiz kullanıcı: " + quoted)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"code":"30","description":` + string(desc) + `}`))
		}))
		p, err := netgsm.New(netgsm.Config{UserCode: user, Password: pass, Header: "KAMPANYA", BaseURL: srv.URL})
		if err != nil {
			t.Fatal(err)
		}
		_, sendErr := p.Send(context.Background(), providers.Message{To: "+905321234567", Body: "kod", Commercial: true})
		_, reportErr := p.Report(context.Background(), []string{"1"}, time.Now().Add(-time.Hour), time.Now())
		srv.Close()
		for _, err := range []error{sendErr, reportErr} {
			if err == nil {
				t.Fatalf("quoting %q: no error", quoted)
			}
			if msg := err.Error(); strings.Contains(msg, quoted) || strings.Contains(msg, basic) || !strings.Contains(msg, "[secret]") {
				t.Errorf("quoting %q: %s", quoted, msg)
			}
		}
	}
}
