package sandbox

import (
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// readTwilioForm reads what r.ParseForm and r.PostForm.Get read, and fails where ParseForm fails.
func TestReadTwilioFormMatchesParseForm(t *testing.T) {
	const form = "application/x-www-form-urlencoded"
	bodies := []string{
		"", "To=%2B905321234567&From=%2B905550000000&Body=Merhaba+Ali%2C+kodunuz+K7Q2M9XW+-+RET+yaz%C4%B1p",
		"T%6F=%2B905321234567&%42ody=b", "To=&To=%2B905321234567", "To=%2B1&To=%2B2&Body=x&Body=y",
		"To", "=x", "&&To=a&&", "To=a=b", "To=a+b+", "Body=%zz&To=a", "To=a&Body=%4", "To=a&%zz=1", "Body=%",
		"To=a;b", "To=a&x=1;2", "To=a&Body=%E2%80%A8%F0%9F%98%80%FF", "MessagingServiceSid=MG1&MediaUrl=http%3A%2F%2Fx&ContentSid=HX1",
		"StatusCallback=http%3A%2F%2F127.0.0.1%3A8080%2Fcb%3Fa%3D1%26b%3D2&To=%2B1", "to=lower&TO=upper",
		"To=a" + strings.Repeat("&", maxFormFields-2), "To=a" + strings.Repeat("&", maxFormFields-1),
		strings.Repeat("x", 1<<16) + "&To=a", // over the body limit
	}
	type variant struct {
		contentType, query string
	}
	variants := []variant{
		{form, ""}, {form + "; charset=utf-8", ""}, {"Application/X-WWW-Form-Urlencoded", ""}, {"", ""},
		{"multipart/form-data; boundary=x", ""}, {"text/plain", ""}, {"application/x-www-form-urlencoded;;", ""},
		{form, "To=q"}, {form, "a;b"}, {form, "x=%zz"},
	}
	type result struct {
		Form twilioForm
		Err  bool
	}
	read := func(v variant, body string, parse func(*http.Request) result) result {
		r := httptest.NewRequest(http.MethodPost, "/2010-04-01/Accounts/AC1/Messages.json?"+v.query, strings.NewReader(body))
		if v.query == "" {
			r.URL.RawQuery = ""
		}
		if v.contentType != "" {
			r.Header.Set("Content-Type", v.contentType)
		}
		r.Body = http.MaxBytesReader(httptest.NewRecorder(), r.Body, 1<<16)
		return parse(r)
	}
	viaParseForm := func(r *http.Request) result {
		err := r.ParseForm()
		p := r.PostForm
		return result{twilioForm{to: p.Get("To"), from: p.Get("From"), msid: p.Get("MessagingServiceSid"), body: p.Get("Body"),
			mediaURL: p.Get("MediaUrl"), contentSID: p.Get("ContentSid"), statusCallback: p.Get("StatusCallback")}, err != nil}
	}
	viaRead := func(r *http.Request) result {
		f, err := readTwilioForm(r)
		return result{f, err != nil}
	}
	compare := func() {
		t.Helper()
		for _, v := range variants {
			for _, body := range bodies {
				want, got := read(v, body, viaParseForm), read(v, body, viaRead)
				if diff := cmp.Diff(want, got, cmp.AllowUnexported(twilioForm{})); diff != "" {
					name := body
					if len(name) > 60 {
						name = name[:60] + "..."
					}
					t.Errorf("GODEBUG %q, Content-Type %q, query %q, body %q (-ParseForm +readTwilioForm):\n%s",
						os.Getenv("GODEBUG"), v.contentType, v.query, name, diff)
				}
			}
		}
	}
	compare()
	// A bound of its own on the fields: ParseForm refuses three of them, and so does the sandbox.
	t.Setenv("GODEBUG", "urlmaxqueryparams=3")
	if got := read(variants[0], "To=a&From=b&Body=c", viaParseForm); !got.Err {
		t.Fatal("ParseForm ignores GODEBUG=urlmaxqueryparams=3: this test no longer checks the fallback")
	}
	compare()
}
