package providers

import (
	"strings"
	"testing"
)

func TestMaskAddress(t *testing.T) {
	for in, want := range map[string]string{
		"+905321234567":           "+905*****4567",
		"ayse.yilmaz@example.com": "a***@example.com",
		"12345":                   "*****",
	} {
		got := MaskAddress(in)
		if got != want {
			t.Errorf("MaskAddress(%q) = %q, want %q", in, got, want)
		}
		if in != "12345" && strings.Contains(got, in) {
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
