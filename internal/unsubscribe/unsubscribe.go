// Package unsubscribe builds and checks the one-click unsubscribe links of commercial e-mails (RFC 8058):
// one per recipient of a campaign, signed with UNSUBSCRIBE_SECRET, served by `campaignctl webhooks` at
// Path.
//
// A link is BASE/u/TOKEN, TOKEN = "3." base64url(HEAD) "." base64url(USER') "." base64url(TAG), where HEAD
// = campaign ID as decimal "~" the campaign's nonce (a test send's link: "0"), TAG = the first 16 bytes of
// HMAC-SHA256(secret, "campaignctl-unsubscribe-v3\x00" HEAD ":" user ID), and USER' = the user ID
// encrypted with AES-256 in CTR mode under the key HMAC-SHA256(secret, "campaignctl-unsubscribe-v3-key")
// with TAG as its counter block (a synthetic IV: the same link always, and a changed byte of any part
// fails the TAG). The nonce (the campaign's creation time in microseconds, base 36: the one its claims and
// its messages' receipts carry) tells the campaign from another that had the same ID: a database
// re-created, or another engine signing with the same secret.
//
// The user ID is encrypted because it is often an e-mail address or a phone number (an audience keyed by
// either), and a link travels further than its e-mail: forwarded, in a proxy's or a browser's history.
// Links of earlier versions, which carried the user ID in the clear, are still read: version 2, TOKEN =
// base64url(HEAD ":" user ID) "." base64url of the first 16 bytes of HMAC-SHA256(secret,
// "campaignctl-unsubscribe-v2\x00" HEAD ":" user ID), and version 1, the same without the nonce, signed
// under "campaignctl-unsubscribe-v1\x00" (it names its campaign by ID alone).
//
// A link names the audience row it was made for and nothing else, and shows neither the user ID nor an
// address; it cannot be forged without the secret, nor found by trying campaign and user IDs. It does not
// expire: a person may unsubscribe from an e-mail read months later, and a replayed link only repeats a
// refusal already recorded.
package unsubscribe

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"hash"
	"strconv"
	"strings"
	"sync"
)

// Path is the route prefix of the links on the webhooks server.
const Path = "/u/"

// MinSecret is the shortest UNSUBSCRIBE_SECRET accepted, in bytes.
const MinSecret = 16

// ErrBadLink is returned for a token that is malformed or whose signature does not match.
var ErrBadLink = errors.New("unsubscribe link not valid")

// Signer makes and checks the links of one secret and public base URL.
type Signer struct {
	key  []byte
	base string
	// macs holds signing states (an HMAC keyed with key, reset between uses, and its buffers): a
	// commercial e-mail campaign signs a link per recipient, and a new HMAC hashes the key's two pads again
	// and allocates two hash states each time.
	macs sync.Pool
	// block encrypts the user IDs of version 3 links (safe for concurrent use).
	block cipher.Block
}

// macState is an HMAC with the buffers of one signature: the signed message and the sum.
type macState struct {
	h        hash.Hash
	msg, sum []byte
}

// The prefixes of the payload in the signed message: a link without a nonce (version 1) and one with it.
const (
	signedV1 = "campaignctl-unsubscribe-v1\x00"
	signedV2 = "campaignctl-unsubscribe-v2\x00"
	signedV3 = "campaignctl-unsubscribe-v3\x00"
	// keyV3 derives the key that encrypts a version 3 link's user ID from the secret.
	keyV3 = "campaignctl-unsubscribe-v3-key"
)

// maxNonce is the longest nonce: a positive int64 in base 36.
const maxNonce = 13

// Link is what a link names: a campaign (its ID, and its nonce when the link carries one) and a user.
type Link struct {
	// CampaignID 0 is a test send's (launch --test-to), which has no campaign.
	CampaignID int64
	// Nonce is the campaign's nonce the link was made with; "" for a link of an earlier version.
	Nonce  string
	UserID string
}

// New returns a Signer for the secret and the base URL where `campaignctl webhooks` is reached
// (WEBHOOKS_PUBLIC_URL, without a trailing slash). The secret must be at least MinSecret bytes.
func New(secret, base string) (*Signer, error) {
	if len(secret) < MinSecret {
		return nil, errors.New("UNSUBSCRIBE_SECRET is shorter than 16 bytes: generate one with `openssl rand -hex 32` and give the same value to the workers and to campaignctl webhooks")
	}
	s := &Signer{key: []byte(secret), base: strings.TrimSuffix(base, "/")}
	s.macs.New = func() any { return &macState{h: hmac.New(sha256.New, s.key)} }
	k := hmac.New(sha256.New, s.key)
	k.Write([]byte(keyV3))
	block, err := aes.NewCipher(k.Sum(nil))
	if err != nil {
		return nil, err
	}
	s.block = block
	return s, nil
}

// String never shows the secret.
func (s *Signer) String() string { return "unsubscribe.Signer{base: " + s.base + "}" }

// sign signs the payload of l (version 2 with a nonce, version 1 without), and calls f with the payload and
// the signature (valid only during the call).
func (s *Signer) sign(l Link, f func(payload, sig []byte)) {
	st := s.macs.Get().(*macState)
	prefix := signedV1
	if l.Nonce != "" {
		prefix = signedV2
	}
	st.msg = strconv.AppendInt(append(st.msg[:0], prefix...), l.CampaignID, 10)
	if l.Nonce != "" {
		st.msg = append(append(st.msg, '~'), l.Nonce...)
	}
	st.msg = append(append(st.msg, ':'), l.UserID...)
	st.h.Reset()
	st.h.Write(st.msg)
	st.sum = st.h.Sum(st.sum[:0])
	f(st.msg[len(prefix):], st.sum[:16])
	s.macs.Put(st)
}

// appendToken appends the token of l to b: version 3 (the package's doc).
func (s *Signer) appendToken(b []byte, l Link) []byte {
	enc := base64.RawURLEncoding
	s.signV3(l, func(head, tag []byte) {
		b = append(enc.AppendEncode(append(b, '3', '.'), head), '.')
		var buf [MaxUserID]byte
		ct := buf[:0]
		if len(l.UserID) > len(buf) {
			ct = make([]byte, 0, len(l.UserID))
		}
		ct = s.xorCTR(append(ct, l.UserID...), tag)
		b = append(enc.AppendEncode(b, ct), '.')
		b = enc.AppendEncode(b, tag)
	})
	return b
}

// signV3 signs l as version 3 does, and calls f with its HEAD and its TAG (valid only during the call).
func (s *Signer) signV3(l Link, f func(head, tag []byte)) {
	st := s.macs.Get().(*macState)
	st.msg = strconv.AppendInt(append(st.msg[:0], signedV3...), l.CampaignID, 10)
	if l.Nonce != "" {
		st.msg = append(append(st.msg, '~'), l.Nonce...)
	}
	headEnd := len(st.msg)
	st.msg = append(append(st.msg, ':'), l.UserID...)
	st.h.Reset()
	st.h.Write(st.msg)
	st.sum = st.h.Sum(st.sum[:0])
	f(st.msg[len(signedV3):headEnd], st.sum[:16])
	s.macs.Put(st)
}

// Token returns the token of the link l.
func (s *Signer) Token(l Link) string {
	return string(s.appendToken(nil, l))
}

// URL returns the link l.
func (s *Signer) URL(l Link) string {
	return string(s.AppendURL(nil, l))
}

// AppendURL appends the link l to b, as URL returns it. Its token is what follows its last '/' (base64url
// has none): a message that carries the link and the token builds both at once.
func (s *Signer) AppendURL(b []byte, l Link) []byte {
	b = append(append(b, s.base...), Path...)
	return s.appendToken(b, l)
}

// MaxUserID is the longest user ID a link is made for, in bytes: a launch that needs links refuses a
// longer one (a link carries its user ID, and mail clients cut long links).
const MaxUserID = 512

// maxToken is the length of a token for the longest campaign ID, nonce and user ID.
var maxToken = max(
	base64.RawURLEncoding.EncodedLen(len("9223372036854775807~:")+maxNonce+MaxUserID)+1+base64.RawURLEncoding.EncodedLen(16),
	len("3.")+base64.RawURLEncoding.EncodedLen(len("9223372036854775807~")+maxNonce)+1+base64.RawURLEncoding.EncodedLen(MaxUserID)+1+base64.RawURLEncoding.EncodedLen(16))

// Check returns the link a token was made for, or ErrBadLink.
func (s *Signer) Check(token string) (Link, error) {
	if len(token) > maxToken {
		return Link{}, ErrBadLink
	}
	if v3, ok := strings.CutPrefix(token, "3."); ok {
		return s.checkV3(v3)
	}
	payload, sig, ok := strings.Cut(token, ".")
	if !ok {
		return Link{}, ErrBadLink
	}
	enc := base64.RawURLEncoding.Strict() // one spelling per token: unused bits must be zero
	raw, err1 := enc.DecodeString(payload)
	mac, err2 := enc.DecodeString(sig)
	if err1 != nil || err2 != nil {
		return Link{}, ErrBadLink
	}
	head, user, ok := strings.Cut(string(raw), ":")
	if !ok || user == "" {
		return Link{}, ErrBadLink
	}
	l, ok := parseHead(head)
	if !ok {
		return Link{}, ErrBadLink
	}
	l.UserID = user
	var good bool
	s.sign(l, func(_, sig []byte) { good = hmac.Equal(mac, sig) })
	if !good {
		return Link{}, ErrBadLink
	}
	return l, nil
}

// xorCTR encrypts (or decrypts) b in place with AES in CTR mode, counter block iv (16 bytes, incremented
// as a big-endian number), as cipher.NewCTR does, without the stream's allocations: a commercial e-mail
// campaign makes a link per recipient.
func (s *Signer) xorCTR(b, iv []byte) []byte {
	var ctr, ks [aes.BlockSize]byte
	copy(ctr[:], iv)
	for i := 0; i < len(b); i += aes.BlockSize {
		s.block.Encrypt(ks[:], ctr[:])
		for j := i; j < len(b) && j < i+aes.BlockSize; j++ {
			b[j] ^= ks[j-i]
		}
		for k := aes.BlockSize - 1; k >= 0; k-- {
			if ctr[k]++; ctr[k] != 0 {
				break
			}
		}
	}
	return b
}

// checkV3 checks the parts of a version 3 token after its "3.".
func (s *Signer) checkV3(token string) (Link, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return Link{}, ErrBadLink
	}
	enc := base64.RawURLEncoding.Strict() // one spelling per token: unused bits must be zero
	head, err1 := enc.DecodeString(parts[0])
	ct, err2 := enc.DecodeString(parts[1])
	tag, err3 := enc.DecodeString(parts[2])
	if err1 != nil || err2 != nil || err3 != nil || len(tag) != 16 || len(ct) == 0 {
		return Link{}, ErrBadLink
	}
	l, ok := parseHead(string(head))
	if !ok {
		return Link{}, ErrBadLink
	}
	l.UserID = string(s.xorCTR(ct, tag))
	var good bool
	s.signV3(l, func(h, sum []byte) { good = hmac.Equal(tag, sum) && string(h) == string(head) })
	if !good {
		return Link{}, ErrBadLink
	}
	return l, nil
}

// parseHead reads a link's campaign ID and, after a "~", its nonce, each in its one spelling.
func parseHead(head string) (Link, bool) {
	cid, nonce, withNonce := strings.Cut(head, "~")
	id, err := strconv.ParseInt(cid, 10, 64)
	if err != nil || id < 0 || strconv.FormatInt(id, 10) != cid {
		return Link{}, false
	}
	// One spelling per nonce too: a positive number in base 36, lower case, without leading zeros.
	if n, err := strconv.ParseInt(nonce, 36, 64); withNonce && (err != nil || n <= 0 || strconv.FormatInt(n, 36) != nonce) {
		return Link{}, false
	}
	return Link{CampaignID: id, Nonce: nonce}, true
}
