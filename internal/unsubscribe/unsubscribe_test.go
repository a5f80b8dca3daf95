package unsubscribe

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"strings"
	"sync"
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

// The token's signature is the documented one (the first 16 bytes of HMAC-SHA256 of the versioned
// payload), the same from every goroutine and every call: the Signer reuses its HMACs.
func TestTokenSignatureIsTheDocumentedHMAC(t *testing.T) {
	const secret = "a-secret-of-at-least-16-bytes"
	s, err := New(secret, "https://hooks.example.com")
	if err != nil {
		t.Fatal(err)
	}
	want := func(cid int64, user string) string {
		m := hmac.New(sha256.New, []byte(secret))
		m.Write([]byte("campaignctl-unsubscribe-v1\x00" + strconv.FormatInt(cid, 10) + ":" + user))
		return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(cid, 10)+":"+user)) + "." +
			base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:16])
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 200 {
				// User IDs short and long (past the signing state's buffers as first made), in any script.
				cid, user := int64(g+1)*int64(i+1), "u"+strconv.Itoa(i)+strings.Repeat("ş€", i%7*20)
				if got := s.Token(cid, user); got != want(cid, user) {
					t.Errorf("token of %d/%s = %s, want %s", cid, user, got, want(cid, user))
					return
				}
				if got, url := s.URL(cid, user), "https://hooks.example.com/u/"+want(cid, user); got != url {
					t.Errorf("link of %d/%s = %s, want %s", cid, user, got, url)
					return
				}
				if got := string(s.AppendURL([]byte("<"), cid, user)); got != "<https://hooks.example.com/u/"+want(cid, user) {
					t.Errorf("link of %d/%s appended to %q: %s", cid, user, "<", got)
					return
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkURL is the link of one recipient of a commercial e-mail.
func BenchmarkURL(b *testing.B) {
	s, err := New("0123456789abcdef0123", "https://hooks.example.com")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for i := range b.N {
		_ = s.URL(42, "c"+strconv.Itoa(i&1023))
	}
}
