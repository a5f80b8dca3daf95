package unsubscribe

import (
	"strings"
	"testing"
)

func TestLinksRoundTripAndCannotBeForged(t *testing.T) {
	s, err := New("0123456789abcdef0123", "https://hooks.example.com/")
	if err != nil {
		t.Fatal(err)
	}
	u := s.URL(42, "u:7")
	if !strings.HasPrefix(u, "https://hooks.example.com/u/") {
		t.Fatalf("link %s", u)
	}
	tok := strings.TrimPrefix(u, "https://hooks.example.com/u/")
	id, user, err := s.Check(tok)
	if err != nil || id != 42 || user != "u:7" {
		t.Fatalf("Check = %d %q %v, want 42 u:7", id, user, err)
	}
	other, _ := New("another-secret-of-enough-length", "https://hooks.example.com")
	payload, _, _ := strings.Cut(tok, ".")
	for name, bad := range map[string]string{
		"another secret's signature": other.Token(42, "u:7"),
		"another user, same mac":     s.Token(42, "u:8")[:strings.Index(s.Token(42, "u:8"), ".")] + tok[strings.Index(tok, "."):],
		"no signature":               payload,
		"empty signature":            payload + ".",
		"garbage":                    "%%%.%%%",
		"campaign with leading zero": s.Token(42, "u:7")[:0] + "MDQyOnU6Nw" + tok[strings.Index(tok, "."):],
	} {
		if _, _, err := s.Check(bad); err != ErrBadLink {
			t.Errorf("%s: Check = %v, want ErrBadLink", name, err)
		}
	}
	// One spelling per token: a last character that differs only in bits base64 drops is refused.
	for _, alt := range []byte("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") {
		bad := tok[:len(tok)-1] + string(alt)
		if bad == tok {
			continue
		}
		if _, _, err := s.Check(bad); err == nil {
			t.Fatalf("the token %s was also taken spelled %s", tok, bad)
		}
	}
	if _, err := New("short", "https://x"); err == nil {
		t.Fatal("a short secret was taken")
	}
	if strings.Contains(s.String(), "0123456789") {
		t.Fatal("String shows the secret")
	}
}
