package iys

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func intp(i int) *int { return &i }

func TestParseAPIError(t *testing.T) {
	jsonHeader := http.Header{"Content-Type": {"application/json"}}
	for _, tt := range []struct {
		name   string
		op     string
		status int
		header http.Header
		body   string
		want   *APIError
	}{
		{
			name: "validation with location and value", op: opMultiStatus, status: 422, header: jsonHeader,
			body: `{"errors":[{"code":"H193","location":["recipients",3],"message":"Alıcı (recipient) değeri liste içinde tekrarlanamaz.","value":"+905055566791"}]}`,
			want: &APIError{Op: opMultiStatus, Status: 422, Code: "H193", Message: "Alıcı (recipient) değeri liste içinde tekrarlanamaz.",
				Field: "recipients.3", Value: "+905055566791",
				Details: []ErrorDetail{{Code: "H193", Message: "Alıcı (recipient) değeri liste içinde tekrarlanamaz.", Field: "recipients.3", Value: "+905055566791"}}},
		},
		{
			name: "several, with index and a list value", op: opMultiStatus, status: 422, header: jsonHeader,
			body: `{"errors":[{"code":"H120","location":["recipients",0],"value":"ornekmail.com","message":"m1","index":0},{"code":"H164","location":["recipients"],"value":[],"message":"m2"}]}`,
			want: &APIError{Op: opMultiStatus, Status: 422, Code: "H120", Message: "m1", Field: "recipients.0", Value: "ornekmail.com", Index: intp(0),
				Details: []ErrorDetail{{Code: "H120", Message: "m1", Field: "recipients.0", Value: "ornekmail.com", Index: intp(0)}, {Code: "H164", Message: "m2", Field: "recipients", Value: "[]"}}},
		},
		{
			name: `the documented "code:" typo`, op: opStatus, status: 403, header: jsonHeader,
			body: `{"errors":[{"code:":"H353","message":"iysCode, kullanıcı izinleriyle eşleştiriliemiyor"}]}`,
			want: &APIError{Op: opStatus, Status: 403, Code: "H353", Message: "iysCode, kullanıcı izinleriyle eşleştiriliemiyor",
				Details: []ErrorDetail{{Code: "H353", Message: "iysCode, kullanıcı izinleriyle eşleştiriliemiyor"}}},
		},
		{
			name: "OAuth shape", op: opToken, status: 400, header: jsonHeader,
			body: `{"error":"invalid_grant","error_description":"Yenileme jetonu boş olamaz."}`,
			want: &APIError{Op: opToken, Status: 400, Code: "invalid_grant", Message: "Yenileme jetonu boş olamaz."},
		},
		{
			name: "rate limit with Retry-After", op: opChanges, status: 429, header: http.Header{"Retry-After": {"2"}},
			body: `{"errors":[{"code":"H124","message":"Saniyede kabul edilen istek limitine ulaşıldı. Lütfen daha sonra tekrar deneyiniz."}]}`,
			want: &APIError{Op: opChanges, Status: 429, Code: "H124", Message: "Saniyede kabul edilen istek limitine ulaşıldı. Lütfen daha sonra tekrar deneyiniz.",
				RetryAfter: 2 * time.Second, Details: []ErrorDetail{{Code: "H124", Message: "Saniyede kabul edilen istek limitine ulaşıldı. Lütfen daha sonra tekrar deneyiniz."}}},
		},
		{
			name: "hourly limit without Retry-After", op: opStatus, status: 429,
			body: `{"errors":[{"code":"H086","message":"m"}]}`,
			want: &APIError{Op: opStatus, Status: 429, Code: "H086", Message: "m", RetryAfter: time.Hour, Details: []ErrorDetail{{Code: "H086", Message: "m"}}},
		},
		{
			name: "HTML from a proxy", op: opChanges, status: 503, header: http.Header{"Content-Type": {"text/html; charset=utf-8"}},
			body: "<html><body>503 +905321234567</body></html>",
			want: &APIError{Op: opChanges, Status: 503, Message: "unreadable error body (43 bytes of text/html)"},
		},
		{
			name: "empty body", op: opStatus, status: 404,
			want: &APIError{Op: opStatus, Status: 404, Message: "Not Found"},
		},
		{
			name: "404 with a message and no code", op: opStatus, status: 404, body: `{"errors":[{"message":"İzin bulunamadı."}]}`,
			want: &APIError{Op: opStatus, Status: 404, Message: "İzin bulunamadı.", Details: []ErrorDetail{{Message: "İzin bulunamadı."}}},
		},
	} {
		h := tt.header
		if h == nil {
			h = http.Header{}
		}
		got := parseAPIError(tt.op, tt.status, h, []byte(tt.body))
		if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(APIError{})); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tt.name, diff)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 3, 10, 9, 0, 0, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"":                              0,
		"3":                             3 * time.Second,
		" 120 ":                         2 * time.Minute,
		"-4":                            0,
		"soon":                          0,
		"Tue, 10 Mar 2026 09:00:30 GMT": 30 * time.Second,
		"Tue, 10 Mar 2026 08:00:00 GMT": 0,
	} {
		if got := parseRetryAfter(v, now); got != want {
			t.Errorf("parseRetryAfter(%q) = %v, want %v", v, got, want)
		}
	}
}

func TestAPIErrorString(t *testing.T) {
	e := &APIError{Op: opStatus, Status: 422, Code: "H121", Message: "Alıcı (recipient) için E164 ...", Field: "recipient", Value: "+905321234567",
		Details: []ErrorDetail{{}, {}}}
	got := e.Error()
	want := "iys status: HTTP 422 H121: Alıcı (recipient) için E164 ... (field recipient, value +905*****4567) and 1 more"
	if got != want {
		t.Errorf("Error() = %q\nwant %q", got, want)
	}
	e = &APIError{Op: opMultiStatus, Status: 422, Code: "H464", Message: "m", Value: "ayse.yilmaz@example.com"}
	if got := e.Error(); got != "iys multi_status: HTTP 422 H464: m (value a***@example.com)" {
		t.Errorf("Error() = %q", got)
	}
	if !errors.Is(&APIError{Op: opStatus, Status: 404, notFound: true}, ErrNoConsent) || errors.Is(&APIError{Status: 404}, ErrNoConsent) {
		t.Errorf("only a status 404 is ErrNoConsent")
	}
}

func TestClassification(t *testing.T) {
	wrap := func(e *APIError) error { return fmt.Errorf("sync: %w", e) }
	type class struct{ rate, auth, valid, account, retry bool }
	for _, tt := range []struct {
		err  error
		want class
	}{
		{wrap(&APIError{Op: opChanges, Status: 429, Code: "H124"}), class{rate: true, retry: true}},
		{wrap(&APIError{Op: opChanges, Status: 429, Code: "H083"}), class{rate: true, retry: true}},
		{wrap(&APIError{Op: opToken, Status: 429, Code: "H084"}), class{rate: true}},
		{wrap(&APIError{Op: opStatus, Status: 429, Code: "H086"}), class{rate: true}},
		{wrap(&APIError{Op: opStatus, Status: 429}), class{rate: true, retry: true}},
		{wrap(&APIError{Op: opToken, Status: 400, Code: "invalid_request"}), class{auth: true}},
		{wrap(&APIError{Op: opChanges, Status: 401, Code: "H351"}), class{auth: true}},
		{wrap(&APIError{Op: opMultiStatus, Status: 422, Code: "H193"}), class{valid: true}},
		{wrap(&APIError{Op: opStatus, Status: 400, Code: "H014"}), class{valid: true}},
		{wrap(&APIError{Op: opChanges, Status: 403, Code: "H353"}), class{account: true}},
		{wrap(&APIError{Op: opChanges, Status: 403, Code: "H586"}), class{account: true}},
		{wrap(&APIError{Op: opChanges, Status: 500, Code: "H103"}), class{retry: true}},
		{wrap(&APIError{Op: opChanges, Status: 503, Code: "H192"}), class{retry: true}},
		{fmt.Errorf("iys changes: %w", &net.OpError{Op: "dial", Err: errors.New("connection refused")}), class{retry: true}},
		{errors.New("something else"), class{}},
	} {
		got := class{IsRateLimited(tt.err), IsAuth(tt.err), IsValidation(tt.err), IsAccount(tt.err), IsRetryable(tt.err)}
		if got != tt.want {
			t.Errorf("%v: got %+v, want %+v", tt.err, got, tt.want)
		}
	}
}

func TestMaskRecipient(t *testing.T) {
	for in, want := range map[string]string{
		"+905321234567":    "+905*****4567",
		"ayse@example.com": "a***@example.com",
		"@x.com":           "***@x.com",
		"12345":            "*****",
		"12345678":         "1***5678",
	} {
		if got := maskRecipient(in); got != want {
			t.Errorf("maskRecipient(%q) = %q, want %q", in, got, want)
		}
	}
}
