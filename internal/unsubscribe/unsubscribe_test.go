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
	l := Link{CampaignID: 42, Nonce: "mfz3k2x1a0", UserID: "u:7"}
	u := s.URL(l)
	if !strings.HasPrefix(u, "https://hooks.example.com/u/") {
		t.Fatalf("link %s", u)
	}
	tok := strings.TrimPrefix(u, "https://hooks.example.com/u/")
	if got, err := s.Check(tok); err != nil || got != l {
		t.Fatalf("Check = %+v %v, want %+v", got, err, l)
	}
	// A link of an earlier version, without the nonce, is still read.
	old := Link{CampaignID: 42, UserID: "u:7"}
	if got, err := s.Check(s.Token(old)); err != nil || got != old {
		t.Fatalf("Check of a link without a nonce = %+v %v, want %+v", got, err, old)
	}
	other, _ := New("another-secret-of-enough-length", "https://hooks.example.com")
	payload, mac, _ := strings.Cut(tok, ".")
	enc := base64.RawURLEncoding
	with := func(payload string) string { return enc.EncodeToString([]byte(payload)) + "." + mac }
	for name, bad := range map[string]string{
		"another secret's signature":  other.Token(l),
		"another user, same mac":      with("42~mfz3k2x1a0:u:8"),
		"another nonce, same mac":     with("42~mfz3k2x1a1:u:7"),
		"the nonce taken off":         with("42:u:7"),
		"no signature":                payload,
		"empty signature":             payload + ".",
		"garbage":                     "%%%.%%%",
		"campaign with leading zero":  with("042~mfz3k2x1a0:u:7"),
		"nonce in upper case":         with("42~MFZ3K2X1A0:u:7"),
		"nonce with a leading zero":   with("42~0mfz3k2x1a0:u:7"),
		"empty nonce":                 with("42~:u:7"),
		"a version 1 link's mac on 2": enc.EncodeToString([]byte("42~mfz3k2x1a0:u:7")) + "." + strings.SplitN(s.Token(old), ".", 2)[1],
	} {
		if _, err := s.Check(bad); err != ErrBadLink {
			t.Errorf("%s: Check = %v, want ErrBadLink", name, err)
		}
	}
	// Each version signs under its own prefix: the version 1 message of a payload that looks like version
	// 2's is not the version 2 message.
	forged := signature("0123456789abcdef0123", "campaignctl-unsubscribe-v1\x00", "42~mfz3k2x1a0:u:7")
	if _, err := s.Check(enc.EncodeToString([]byte("42~mfz3k2x1a0:u:7")) + "." + forged); err != ErrBadLink {
		t.Errorf("a version 2 payload signed under version 1's prefix: Check = %v, want ErrBadLink", err)
	}
	// One spelling per token: a last character that differs only in bits base64 drops is refused.
	for _, alt := range []byte("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") {
		bad := tok[:len(tok)-1] + string(alt)
		if bad == tok {
			continue
		}
		if _, err := s.Check(bad); err == nil {
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

// signature is the documented signature of payload signed under prefix: the first 16 bytes of its
// HMAC-SHA256, in base64url.
func signature(secret, prefix, payload string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(prefix + payload))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:16])
}

// The token's signature is the documented one (the first 16 bytes of HMAC-SHA256 of the versioned
// payload), the same from every goroutine and every call: the Signer reuses its HMACs.
func TestTokenSignatureIsTheDocumentedHMAC(t *testing.T) {
	const secret = "a-secret-of-at-least-16-bytes"
	s, err := New(secret, "https://hooks.example.com")
	if err != nil {
		t.Fatal(err)
	}
	want := func(l Link) string {
		prefix, payload := "campaignctl-unsubscribe-v1\x00", strconv.FormatInt(l.CampaignID, 10)+":"+l.UserID
		if l.Nonce != "" {
			prefix, payload = "campaignctl-unsubscribe-v2\x00", strconv.FormatInt(l.CampaignID, 10)+"~"+l.Nonce+":"+l.UserID
		}
		return base64.RawURLEncoding.EncodeToString([]byte(payload)) + "." + signature(secret, prefix, payload)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 200 {
				// User IDs short and long (past the signing state's buffers as first made), in any script.
				// With a nonce and without (a test send's link), in turn.
				l := Link{CampaignID: int64(g+1) * int64(i+1), UserID: "u" + strconv.Itoa(i) + strings.Repeat("ş€", i%7*20)}
				if i%2 == 0 {
					l.Nonce = strconv.FormatInt(1764900000000000+int64(i), 36)
				}
				if got := s.Token(l); got != want(l) {
					t.Errorf("token of %+v = %s, want %s", l, got, want(l))
					return
				}
				if got, url := s.URL(l), "https://hooks.example.com/u/"+want(l); got != url {
					t.Errorf("link of %+v = %s, want %s", l, got, url)
					return
				}
				if got := string(s.AppendURL([]byte("<"), l)); got != "<https://hooks.example.com/u/"+want(l) {
					t.Errorf("link of %+v appended to %q: %s", l, "<", got)
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
		_ = s.URL(Link{CampaignID: 42, Nonce: "mfz3k2x1a0", UserID: "c" + strconv.Itoa(i&1023)})
	}
}
