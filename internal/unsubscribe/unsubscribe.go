// Package unsubscribe builds and checks the one-click unsubscribe links of commercial e-mails (RFC 8058):
// one per recipient of a campaign, signed with UNSUBSCRIBE_SECRET, served by `campaignctl webhooks` at
// Path.
//
// A link is BASE/u/TOKEN, TOKEN = base64url(campaign ID as decimal ":" user ID) "." base64url of the first
// 16 bytes of HMAC-SHA256(secret, "campaignctl-unsubscribe-v1\x00" campaign ID ":" user ID). It names the
// audience row it was made for and nothing else (no address); it cannot be forged without the secret, nor
// found by trying campaign and user IDs. It does not expire: a person may unsubscribe from an e-mail read
// months later, and a replayed link only repeats a refusal already recorded.
package unsubscribe

import (
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
}

// macState is an HMAC with the buffers of one signature: the signed message and the sum.
type macState struct {
	h        hash.Hash
	msg, sum []byte
}

// signed prefixes the payload (campaign ID ":" user ID) in the signed message.
const signed = "campaignctl-unsubscribe-v1\x00"

// New returns a Signer for the secret and the base URL where `campaignctl webhooks` is reached
// (WEBHOOKS_PUBLIC_URL, without a trailing slash). The secret must be at least MinSecret bytes.
func New(secret, base string) (*Signer, error) {
	if len(secret) < MinSecret {
		return nil, errors.New("UNSUBSCRIBE_SECRET is shorter than 16 bytes: generate one with `openssl rand -hex 32` and give the same value to the workers and to campaignctl webhooks")
	}
	s := &Signer{key: []byte(secret), base: strings.TrimSuffix(base, "/")}
	s.macs.New = func() any { return &macState{h: hmac.New(sha256.New, s.key)} }
	return s, nil
}

// String never shows the secret.
func (s *Signer) String() string { return "unsubscribe.Signer{base: " + s.base + "}" }

// sign signs the payload of campaignID and userID, and calls f with the payload and the signature (valid
// only during the call).
func (s *Signer) sign(campaignID int64, userID string, f func(payload, sig []byte)) {
	st := s.macs.Get().(*macState)
	st.msg = append(strconv.AppendInt(append(st.msg[:0], signed...), campaignID, 10), ':')
	st.msg = append(st.msg, userID...)
	st.h.Reset()
	st.h.Write(st.msg)
	st.sum = st.h.Sum(st.sum[:0])
	f(st.msg[len(signed):], st.sum[:16])
	s.macs.Put(st)
}

// appendToken appends the token for userID of campaignID to b.
func (s *Signer) appendToken(b []byte, campaignID int64, userID string) []byte {
	enc := base64.RawURLEncoding
	s.sign(campaignID, userID, func(payload, sig []byte) {
		b = append(enc.AppendEncode(b, payload), '.')
		b = enc.AppendEncode(b, sig)
	})
	return b
}

// Token returns the token of the link for userID of campaignID.
func (s *Signer) Token(campaignID int64, userID string) string {
	return string(s.appendToken(nil, campaignID, userID))
}

// URL returns the link for userID of campaignID.
func (s *Signer) URL(campaignID int64, userID string) string {
	return string(s.AppendURL(nil, campaignID, userID))
}

// AppendURL appends the link for userID of campaignID to b, as URL returns it. Its token is what follows
// its last '/' (base64url has none): a message that carries the link and the token builds both at once.
func (s *Signer) AppendURL(b []byte, campaignID int64, userID string) []byte {
	b = append(append(b, s.base...), Path...)
	return s.appendToken(b, campaignID, userID)
}

// MaxUserID is the longest user ID a link is made for, in bytes: a launch that needs links refuses a
// longer one (a link carries its user ID, and mail clients cut long links).
const MaxUserID = 512

// maxToken is the length of a token for the longest campaign ID and user ID.
var maxToken = base64.RawURLEncoding.EncodedLen(len("9223372036854775807:")+MaxUserID) + 1 + base64.RawURLEncoding.EncodedLen(16)

// Check returns the campaign and user a token was made for, or ErrBadLink.
func (s *Signer) Check(token string) (int64, string, error) {
	if len(token) > maxToken {
		return 0, "", ErrBadLink
	}
	payload, sig, ok := strings.Cut(token, ".")
	if !ok {
		return 0, "", ErrBadLink
	}
	enc := base64.RawURLEncoding.Strict() // one spelling per token: unused bits must be zero
	raw, err1 := enc.DecodeString(payload)
	mac, err2 := enc.DecodeString(sig)
	if err1 != nil || err2 != nil {
		return 0, "", ErrBadLink
	}
	cid, user, ok := strings.Cut(string(raw), ":")
	if !ok || user == "" {
		return 0, "", ErrBadLink
	}
	id, err := strconv.ParseInt(cid, 10, 64)
	if err != nil || id <= 0 || strconv.FormatInt(id, 10) != cid {
		return 0, "", ErrBadLink
	}
	var good bool
	s.sign(id, user, func(_, sig []byte) { good = hmac.Equal(mac, sig) })
	if !good {
		return 0, "", ErrBadLink
	}
	return id, user, nil
}
