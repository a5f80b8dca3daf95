package unsubscribe

import (
	"crypto/aes"
	"crypto/cipher"
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
	tok3 := strings.TrimPrefix(u, "https://hooks.example.com/u/")
	if got, err := s.Check(tok3); err != nil || got != l {
		t.Fatalf("Check = %+v %v, want %+v", got, err, l)
	}
	// Links of the earlier versions, which carry the user ID in the clear (2: with the nonce, 1: without),
	// are still read.
	tok := earlierToken("0123456789abcdef0123", l)
	if got, err := s.Check(tok); err != nil || got != l {
		t.Fatalf("Check of a version 2 link = %+v %v, want %+v", got, err, l)
	}
	old := Link{CampaignID: 42, UserID: "u:7"}
	if got, err := s.Check(earlierToken("0123456789abcdef0123", old)); err != nil || got != old {
		t.Fatalf("Check of a link without a nonce = %+v %v, want %+v", got, err, old)
	}
	other, _ := New("another-secret-of-enough-length", "https://hooks.example.com")
	// Version 3: another secret's, another part's, or a changed byte anywhere is refused.
	parts := strings.Split(tok3, ".")
	enc := base64.RawURLEncoding
	flip := func(part string) string {
		b, _ := enc.DecodeString(part)
		b[len(b)-1] ^= 1
		return enc.EncodeToString(b)
	}
	for name, bad := range map[string]string{
		"another secret's link":     other.Token(l),
		"another campaign's head":   strings.Join([]string{"3", enc.EncodeToString([]byte("43~mfz3k2x1a0")), parts[2], parts[3]}, "."),
		"the user changed":          strings.Join([]string{"3", parts[1], flip(parts[2]), parts[3]}, "."),
		"the tag changed":           strings.Join([]string{"3", parts[1], parts[2], flip(parts[3])}, "."),
		"another link's user":       strings.Join([]string{"3", parts[1], strings.Split(s.Token(Link{CampaignID: 42, Nonce: "mfz3k2x1a0", UserID: "u:8"}), ".")[2], parts[3]}, "."),
		"no user":                   strings.Join([]string{"3", parts[1], "", parts[3]}, "."),
		"a part too many":           tok3 + ".AA",
		"a part short":              strings.Join(parts[:3], "."),
		"version 3 without the tag": strings.Join(parts[:3], ".") + ".",
	} {
		if _, err := s.Check(bad); err != ErrBadLink {
			t.Errorf("%s: Check = %v, want ErrBadLink", name, err)
		}
	}
	// The user ID is not in the link: an audience keyed by e-mail address showed it in every link.
	mail := Link{CampaignID: 42, Nonce: "mfz3k2x1a0", UserID: "zeynep.erdogan@example.com"}
	if u := s.URL(mail); strings.Contains(u, enc.EncodeToString([]byte("zeynep"))[:6]) || strings.Contains(u, "zeynep") {
		t.Errorf("the link %s shows the user ID", u)
	}
	if got, err := s.Check(s.Token(mail)); err != nil || got != mail {
		t.Fatalf("Check = %+v %v, want %+v", got, err, mail)
	}
	payload, mac, _ := strings.Cut(tok, ".")
	with := func(payload string) string { return enc.EncodeToString([]byte(payload)) + "." + mac }
	for name, bad := range map[string]string{
		"another secret's signature":  earlierToken("another-secret-of-enough-length", l),
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
		"a version 1 link's mac on 2": enc.EncodeToString([]byte("42~mfz3k2x1a0:u:7")) + "." + strings.SplitN(earlierToken("0123456789abcdef0123", old), ".", 2)[1],
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
	for _, tk := range []string{tok, tok3} {
		for _, alt := range []byte("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") {
			bad := tk[:len(tk)-1] + string(alt)
			if bad == tk {
				continue
			}
			if _, err := s.Check(bad); err == nil {
				t.Fatalf("the token %s was also taken spelled %s", tk, bad)
			}
		}
	}
	if _, err := New("short", "https://x"); err == nil {
		t.Fatal("a short secret was taken")
	}
	if strings.Contains(s.String(), "0123456789") {
		t.Fatal("String shows the secret")
	}
}

// earlierToken is the token of l as versions 2 (with a nonce) and 1 (without) made it, as the package's
// doc describes them.
func earlierToken(secret string, l Link) string {
	prefix, payload := "campaignctl-unsubscribe-v1\x00", strconv.FormatInt(l.CampaignID, 10)+":"+l.UserID
	if l.Nonce != "" {
		prefix, payload = "campaignctl-unsubscribe-v2\x00", strconv.FormatInt(l.CampaignID, 10)+"~"+l.Nonce+":"+l.UserID
	}
	return base64.RawURLEncoding.EncodeToString([]byte(payload)) + "." + signature(secret, prefix, payload)
}

// signature is the documented signature of payload signed under prefix: the first 16 bytes of its
// HMAC-SHA256, in base64url.
func signature(secret, prefix, payload string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(prefix + payload))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:16])
}

// The token is the documented one (version 3: the user ID encrypted under a key derived from the secret,
// with the first 16 bytes of HMAC-SHA256 of the versioned payload as its tag and counter block), the same
// from every goroutine and every call: the Signer reuses its HMACs.
func TestTokenSignatureIsTheDocumentedHMAC(t *testing.T) {
	const secret = "a-secret-of-at-least-16-bytes"
	s, err := New(secret, "https://hooks.example.com")
	if err != nil {
		t.Fatal(err)
	}
	// Version 3, written out from the package's doc.
	k := hmac.New(sha256.New, []byte(secret))
	k.Write([]byte("campaignctl-unsubscribe-v3-key"))
	block, err := aes.NewCipher(k.Sum(nil))
	if err != nil {
		t.Fatal(err)
	}
	want := func(l Link) string {
		head := strconv.FormatInt(l.CampaignID, 10)
		if l.Nonce != "" {
			head += "~" + l.Nonce
		}
		m := hmac.New(sha256.New, []byte(secret))
		m.Write([]byte("campaignctl-unsubscribe-v3\x00" + head + ":" + l.UserID))
		tag := m.Sum(nil)[:16]
		ct := make([]byte, len(l.UserID))
		cipher.NewCTR(block, tag).XORKeyStream(ct, []byte(l.UserID))
		enc := base64.RawURLEncoding
		return "3." + enc.EncodeToString([]byte(head)) + "." + enc.EncodeToString(ct) + "." + enc.EncodeToString(tag)
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
