package iys

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// KeepTokensIn makes the client keep its tokens in pool (table iys_tokens) between runs, sealed with a key
// derived from its password, and read them from there before it asks İYS for one: İYS gives 10 tokens an
// hour per IP and restarts the hour on an early request, and every run of a command asked for one (a
// cron of sync and push every 15 minutes, with checks, ran into the limit, and from then on each run asked
// early and kept İYS's hour from ending). İYS's refusal of new tokens (H084) is kept too: a later run does
// not ask before it ends. Call it before the first request.
func (c *Client) KeepTokensIn(pool *pgxpool.Pool) { c.tokens.keep = pool }

// keptToken is what is sealed in iys_tokens.
type keptToken struct {
	Access       string    `json:"a"`
	Expires      time.Time `json:"e"`
	RenewAt      time.Time `json:"r"`
	Refresh      string    `json:"f,omitempty"`
	RefreshUntil time.Time `json:"u,omitempty"`
}

// keepKey names the client's row: its API and user, hashed (the user name is no secret, but neither is it
// needed in clear).
func (t *tokenSource) keepKey() string {
	h := sha256.Sum256([]byte(t.c.cfg.BaseURL + "\x00" + t.c.cfg.Username))
	return hex.EncodeToString(h[:])
}

// aead is the cipher the tokens are sealed with: AES-256-GCM under a key derived from the user and the
// password.
func (t *tokenSource) aead() (cipher.AEAD, error) {
	k := sha256.Sum256([]byte("campaignctl iys tokens v1\x00" + t.c.cfg.Username + "\x00" + t.c.cfg.Password))
	block, err := aes.NewCipher(k[:])
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// loadKept reads the kept token and halt, once, into t (called with t.sem held). A token that cannot be
// opened (another password, a damaged row) is ignored: a new one is asked for. A failure to read is
// logged and ignored: the run asks İYS as it did before.
func (t *tokenSource) loadKept(ctx context.Context) {
	if t.keep == nil || t.loaded {
		return
	}
	t.loaded = true
	var sealed []byte
	var halt *time.Time
	err := t.keep.QueryRow(ctx, `SELECT sealed, halt_until FROM iys_tokens WHERE key = $1`, t.keepKey()).Scan(&sealed, &halt)
	if errors.Is(err, pgx.ErrNoRows) {
		return
	}
	if err != nil {
		t.c.log.Warn("iys: the kept token could not be read; asking İYS for one", "err", err.Error())
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if halt != nil && t.c.now().Before(*halt) {
		t.haltUntil = *halt
		t.haltErr = errors.New("iys token: İYS refused new tokens (H084, at most 10 an hour) in an earlier run")
	}
	a, err := t.aead()
	if err != nil || len(sealed) < a.NonceSize() {
		return
	}
	plain, err := a.Open(nil, sealed[:a.NonceSize()], sealed[a.NonceSize():], []byte(t.keepKey()))
	if err != nil {
		return // sealed under another password
	}
	var k keptToken
	if json.Unmarshal(plain, &k) != nil || k.Access == "" {
		return
	}
	if t.access == "" && t.c.now().Before(k.Expires) {
		t.access, t.expires, t.renewAt = k.Access, k.Expires, k.RenewAt
	}
	if t.refresh == "" && k.Refresh != "" && t.c.now().Before(k.RefreshUntil) {
		t.refresh, t.refreshUntil = k.Refresh, k.RefreshUntil
	}
}

// saveKept writes t's token (and halt) for later runs. A failure is logged: this run goes on.
func (t *tokenSource) saveKept(ctx context.Context) {
	if t.keep == nil {
		return
	}
	t.mu.Lock()
	k := keptToken{Access: t.access, Expires: t.expires, RenewAt: t.renewAt, Refresh: t.refresh, RefreshUntil: t.refreshUntil}
	var halt *time.Time
	if !t.haltUntil.IsZero() {
		h := t.haltUntil
		halt = &h
	}
	t.mu.Unlock()
	var sealed []byte
	if k.Access != "" {
		a, err := t.aead()
		if err != nil {
			return
		}
		plain, _ := json.Marshal(k)
		nonce := make([]byte, a.NonceSize())
		if _, err := rand.Read(nonce); err != nil {
			return
		}
		sealed = a.Seal(nonce, nonce, plain, []byte(t.keepKey()))
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := t.keep.Exec(ctx, `INSERT INTO iys_tokens (key, sealed, halt_until) VALUES ($1, $2, $3)
		ON CONFLICT (key) DO UPDATE SET sealed = coalesce(EXCLUDED.sealed, iys_tokens.sealed), halt_until = EXCLUDED.halt_until, updated_at = now()`,
		t.keepKey(), sealed, halt); err != nil {
		t.c.log.Warn("iys: the token could not be kept for later runs", "err", fmt.Sprint(err))
	}
}
