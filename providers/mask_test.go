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
