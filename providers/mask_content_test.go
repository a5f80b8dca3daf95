package providers_test

import (
	"errors"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/campaignctl/campaignctl/providers"
)

// A provider or gateway that echoes the request puts the recipients' message into its error: names,
// promo codes and identity numbers would reach the reasons status, report and dlq show, and the logs.
// MaskContent masks what the answer quotes of the messages, in the encodings a request carries them,
// and leaves the provider's own words.
func TestMaskContentMasksWhatAnAnswerQuotesOfTheMessages(t *testing.T) {
	body := "ACME A.Ş. Merhaba Mehmetcan Yıldırımoğlu, kodunuz 9W5Q88SJ. RET yazıp 4609'a gönderin"
	sms := providers.Message{To: "+905321234567", Body: body}
	shared := &providers.Shared{Text: "Sayın -campaignctl_v0, kodunuz -campaignctl_v1 ile indirim", Tags: []string{"-campaignctl_v0", "-campaignctl_v1"}}
	mails := []providers.Message{
		{To: "a@example.com", Subject: "Size özel", Shared: shared, Values: []string{"Ayşe Gizli", "P3CYWU7H"}},
		{To: "b@example.com", Subject: "Size özel", Shared: shared, Values: []string{"Ali", "Q9ZZTT01"}},
	}
	for _, tc := range []struct {
		name, answer string
		ms           []providers.Message
		gone         []string
		kept         []string
	}{
		{"the body as sent, quoted whole", "invalid parameter; you sent Body=" + body, []providers.Message{sms},
			[]string{"Mehmetcan", "9W5Q88SJ", "Yıldırımoğlu"}, []string{"invalid parameter; you sent Body="}},
		{"a piece of the body", "rejected near 'Mehmetcan Yıldırımoğlu, kod'", []providers.Message{sms},
			[]string{"Mehmetcan", "Yıldırımoğlu"}, []string{"rejected near"}},
		{"form-encoded", "bad request: Body=" + url.QueryEscape(body) + "&To=%2B905321234567", []providers.Message{sms},
			[]string{"Mehmetcan", "9W5Q88SJ"}, []string{"bad request: Body="}},
		{"JSON with escapes", `{"message":"bad","echo":"` + strings.Trim(strconvQuoteASCII(body), `"`) + `"}`, []providers.Message{sms},
			[]string{"Mehmetcan", "9W5Q88SJ"}, []string{`"message":"bad"`}},
		{"a batch's values and shared text", "first subject 'Size özel'; substitutions Ayşe Gizli P3CYWU7H, Ali Q9ZZTT01; text 'kodunuz -campaignctl_v1 ile indirim'", mails,
			[]string{"Ayşe Gizli", "P3CYWU7H", "Q9ZZTT01", "Ali", "Size özel", "ile indirim"}, []string{"first subject", "substitutions"}},
		{"the provider's own words", "The 'To' number is not a valid phone number.", []providers.Message{sms},
			nil, []string{"The 'To' number is not a valid phone number."}},
		// A value inside one of the provider's words is not a quote of it: "Ali" stays in "Invalid"
		// (before, "Inv[content]d"), and is masked where the answer names it.
		{"a short value inside the provider's word", "Invalid 'To' Phone Number; dear Ali, ALI's number", mails,
			[]string{"Ali,", "ALI's"}, []string{"Invalid 'To' Phone Number; dear "}},
		// A word in common with the message ("gönderin", "gönderimde") is not a quote of it.
		{"the provider's own words in Turkish", "İYS kontrollü gönderimde alıcının onayı yok.", []providers.Message{sms},
			nil, []string{"İYS kontrollü gönderimde alıcının onayı yok."}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pe := &providers.Error{Provider: "twilio", Code: 21211, Message: tc.answer, Class: providers.Permanent}
			err := providers.MaskContent(pe, tc.ms...)
			var got *providers.Error
			if !errors.As(err, &got) {
				t.Fatalf("MaskContent returned %v", err)
			}
			for _, s := range tc.gone {
				if strings.Contains(got.Reason(), s) {
					t.Errorf("the reason still quotes %q: %s", s, got.Reason())
				}
			}
			for _, s := range tc.kept {
				if !strings.Contains(got.Message, s) {
					t.Errorf("the provider's own %q is gone: %s", s, got.Message)
				}
			}
		})
	}
	if err := providers.MaskContent(errors.New("plain"), sms); err.Error() != "plain" {
		t.Errorf("a plain error changed: %v", err)
	}
}

func strconvQuoteASCII(s string) string { return strconv.QuoteToASCII(s) }
