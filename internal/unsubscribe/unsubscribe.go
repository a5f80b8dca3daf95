// Package unsubscribe builds and checks the one-click unsubscribe links of commercial e-mails (RFC 8058):
// one per recipient of a campaign, signed with UNSUBSCRIBE_SECRET, served by `campaignctl webhooks` at
// Path.
//
// A link is BASE/u/TOKEN, TOKEN = base64url(PAYLOAD) "." base64url of the first 16 bytes of
// HMAC-SHA256(secret, "campaignctl-unsubscribe-v2\x00" PAYLOAD), PAYLOAD = campaign ID as decimal "~" the
// campaign's nonce ":" user ID. The nonce (the campaign's creation time in microseconds, base 36: the one
// its claims and its messages' receipts carry) tells the campaign from another that had the same ID: a
// database re-created, or another engine signing with the same secret. A link without a nonce (version 1:
// PAYLOAD = campaign ID ":" user ID, signed under "campaignctl-unsubscribe-v1\x00") is what earlier
// versions made; it is still read, and names its campaign by ID alone.
//
// A link names the audience row it was made for and nothing else (no address); it cannot be forged
// without the secret, nor found by trying campaign and user IDs. It does not expire: a person may
// unsubscribe from an e-mail read months later, and a replayed link only repeats a refusal already
// recorded.
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

// The prefixes of the payload in the signed message: a link without a nonce (version 1) and one with it.
const (
	signedV1 = "campaignctl-unsubscribe-v1\x00"
	signedV2 = "campaignctl-unsubscribe-v2\x00"
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

// appendToken appends the token of l to b.
func (s *Signer) appendToken(b []byte, l Link) []byte {
	enc := base64.RawURLEncoding
	s.sign(l, func(payload, sig []byte) {
		b = append(enc.AppendEncode(b, payload), '.')
		b = enc.AppendEncode(b, sig)
	})
	return b
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
var maxToken = base64.RawURLEncoding.EncodedLen(len("9223372036854775807~:")+maxNonce+MaxUserID) + 1 + base64.RawURLEncoding.EncodedLen(16)

// Check returns the link a token was made for, or ErrBadLink.
func (s *Signer) Check(token string) (Link, error) {
	if len(token) > maxToken {
		return Link{}, ErrBadLink
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
	cid, nonce, v2 := strings.Cut(head, "~")
	id, err := strconv.ParseInt(cid, 10, 64)
	if err != nil || id < 0 || strconv.FormatInt(id, 10) != cid {
		return Link{}, ErrBadLink
	}
	// One spelling per nonce too: a positive number in base 36, lower case, without leading zeros.
	if n, err := strconv.ParseInt(nonce, 36, 64); v2 && (err != nil || n <= 0 || strconv.FormatInt(n, 36) != nonce) {
		return Link{}, ErrBadLink
	}
	l := Link{CampaignID: id, Nonce: nonce, UserID: user}
	var good bool
	s.sign(l, func(_, sig []byte) { good = hmac.Equal(mac, sig) })
	if !good {
		return Link{}, ErrBadLink
	}
	return l, nil
}
