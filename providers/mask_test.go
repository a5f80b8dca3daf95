package providers

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestMaskAddress(t *testing.T) {
	for in, want := range map[string]string{
		"+905321234567":           "+905*****4567",
		"ayse.yilmaz@example.com": "a***@example.com",
		"12345":                   "*****",
		// By characters: the mask of an address of Turkish letters is valid UTF-8 (a report's CSV).
		"şule@example.com":    "ş***@example.com",
		"ççççççççç":           "ç****çççç",
		"İ":                   "*",
		"Ümit.Öz@example.com": "Ü***@example.com",
	} {
		got := MaskAddress(in)
		if got != want {
			t.Errorf("MaskAddress(%q) = %q, want %q", in, got, want)
		}
		if !utf8.ValidString(got) {
			t.Errorf("MaskAddress(%q) = %q: not valid UTF-8", in, got)
		}
		if in != "12345" && in != "İ" && strings.Contains(got, in) {
			t.Errorf("MaskAddress(%q) leaks the address", in)
		}
	}
}

// A rate-limit answer asks every worker to slow down, whichever way the provider says it.
func TestAsksToSlowDown(t *testing.T) {
	for _, tc := range []struct {
		e    Error
		want bool
	}{
		{Error{Status: 429}, true},
		{Error{Status: 400, Code: 20429}, true},
		{Error{Status: 200, Code: 80, Throttled: true}, true},
		{Error{Status: 503}, false},
		{Error{Status: 200, Code: 100}, false},
	} {
		if got := tc.e.AsksToSlowDown(); got != tc.want {
			t.Errorf("%+v: AsksToSlowDown %v, want %v", tc.e, got, tc.want)
		}
	}
}

// What a provider or a registry may quote back (the request's Authorization header, its recipients and
// audience values, a form or URL encoding of them) is masked in every text an error shows, whatever the
// adapter left in Message: Error and Reason scrub it.
func TestErrorTextsScrubWhatAnAnswerQuotes(t *testing.T) {
	basic := "QUN0ZXN0MDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDE6czNjcmV0VG9rM25WYWx1ZQ=="
	bearer := "ya29.a0AfH6SMBxSECRETmarker_0123456789-abcdef"
	secrets := []string{basic, bearer, "+905551234567", "905551234567", "0532 987 65 43", "hunt.f06@huntmail.com", "hunt.f06%40huntmail.com", "ayse%2540example.com"}
	e := &Error{Provider: "x", Status: 401, Class: Permanent,
		Message: "Authenticate Basic " + basic + "; Bearer " + bearer + `; {"to":"+905551234567","alt":"0532 987 65 43","mail":"hunt.f06@huntmail.com"} to=hunt.f06%40huntmail.com&cc=ayse%2540example.com`,
		Err:     errors.New("Post http://127.0.0.1:8025/v3/mail/send?k=1 (Authorization: bearer " + bearer + ")")}
	for _, text := range []string{e.Error(), e.Reason()} {
		for _, s := range secrets {
			if strings.Contains(text, s) {
				t.Errorf("%q shows %q", text, s)
			}
		}
	}
	// A number next to a SID is masked, the SID kept.
	if got, want := ScrubText("reply from +90 532 987 65 43 to SM0123456789abcdef0123456789abcdef: STOP"), "reply from [number] to SM0123456789abcdef0123456789abcdef: STOP"; got != want {
		t.Errorf("ScrubText = %q, want %q", got, want)
	}
	if got := e.Error(); !strings.Contains(got, "Basic [secret]") || !strings.Contains(got, "h***@huntmail.com") ||
		!strings.Contains(got, "[number]") || !strings.Contains(got, "127.0.0.1:8025") {
		t.Errorf("Error() = %q: want the credentials as [secret], addresses masked, and the transport's URL kept", got)
	}
	// Prose is left alone: "Basic" and "Bearer" followed by words, short digits, codes, and a message SID
	// whose hex digits hold a long run of digits (what an operator looks the message up by).
	for _, s := range []string{"Basic authentication failed", "Bearer token expired", "code 21211, see https://www.twilio.com/docs/errors/21211",
		"STOP reply to SM5f0123456789ab2345678901cdef0123, from MG12345678901234567890123456789012"} {
		if got := ScrubText(s); got != s {
			t.Errorf("ScrubText(%q) = %q, want it unchanged", s, got)
		}
	}
}

// A user ID that is an address (an audience keyed by e-mail or phone) is masked where logs and errors
// show it; any other ID is shown as it is, for the operator to find the row.
func TestMaskUserID(t *testing.T) {
	for in, want := range map[string]string{
		"hunt.q@example.com": "h***@example.com",
		"+905321234567":      "+905*****4567",
		"05321234567":        "0532***4567",
		// The shapes a CRM keeps numbers and addresses in.
		"(0532) 111-00-64":  "(053********0-64",
		"tel:+905321110069": "tel:*********0069",
		"+90 532 111 00 70": "+90 *********0 70",
		"şule@example.com":  "ş***@example.com",
		"ALI@EXAMPLE.COM":   "A***@EXAMPLE.COM",
		"1234567":           "1234567",
		"SIP-2024-000123":   "SIP-2024-000123",
		"c00000100":         "c00000100",
		"u-42":              "u-42",
		"musteri@":          "musteri@",
		"":                  "",
	} {
		if got := MaskUserID(in); got != want {
			t.Errorf("MaskUserID(%q) = %q, want %q", in, got, want)
		}
	}
}
