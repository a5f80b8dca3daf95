package faults

import (
	"context"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
)

// State is a state.Store (the send path's Redis state) whose methods go through rules, matched by method
// name (Method("ClaimSend")): the seam a worker test puts between the handler and Redis.
type State struct {
	*state.Store
	rules
}

// NewState wraps s.
func NewState(s *state.Store) *State { return &State{Store: s} }

func (s *State) call(ctx context.Context, name string, fn func() error) error {
	return around(ctx, s.pick(Call{Name: name}), fn)
}

// Epoch is state.Store.Epoch under the rules.
func (s *State) Epoch(ctx context.Context) (e string, err error) {
	err = s.call(ctx, "Epoch", func() (err error) { e, err = s.Store.Epoch(ctx); return })
	return e, err
}

// ClaimSend is state.Store.ClaimSend under the rules.
func (s *State) ClaimSend(ctx context.Context, c *campaign.Campaign, nonce string, sc state.SendClaim, g state.Guard, prev *state.Answer, pauseKey string, now time.Time) (cl state.Claimed, err error) {
	err = s.call(ctx, "ClaimSend", func() (err error) { cl, err = s.Store.ClaimSend(ctx, c, nonce, sc, g, prev, pauseKey, now); return })
	return cl, err
}

// ClaimWindow is state.Store.ClaimWindow under the rules.
func (s *State) ClaimWindow(ctx context.Context, c *campaign.Campaign, nonce string, scs []state.SendClaim, g state.Guard, prev []state.Answer, pauseKey string, now time.Time) (cls []state.Claimed, pause time.Duration, err error) {
	err = s.call(ctx, "ClaimWindow", func() (err error) {
		cls, pause, err = s.Store.ClaimWindow(ctx, c, nonce, scs, g, prev, pauseKey, now)
		return
	})
	return cls, pause, err
}

// StillGuarded is state.Store.StillGuarded under the rules.
func (s *State) StillGuarded(ctx context.Context, g state.Guard) error {
	return s.call(ctx, "StillGuarded", func() error { return s.Store.StillGuarded(ctx, g) })
}

// Take is state.Store.Take under the rules.
func (s *State) Take(ctx context.Context, key, nonce, val string, g state.Guard) (old string, ours bool, err error) {
	err = s.call(ctx, "Take", func() (err error) { old, ours, err = s.Store.Take(ctx, key, nonce, val, g); return })
	return old, ours, err
}

// Settle is state.Store.Settle under the rules.
func (s *State) Settle(ctx context.Context, key, nonce, inflight, answer string) error {
	return s.call(ctx, "Settle", func() error { return s.Store.Settle(ctx, key, nonce, inflight, answer) })
}

// SettleMany is state.Store.SettleMany under the rules.
func (s *State) SettleMany(ctx context.Context, keys []string, nonce string, inflight, vals []string) error {
	return s.call(ctx, "SettleMany", func() error { return s.Store.SettleMany(ctx, keys, nonce, inflight, vals) })
}

// Release is state.Store.Release under the rules.
func (s *State) Release(ctx context.Context, key, nonce, inflight string) error {
	return s.call(ctx, "Release", func() error { return s.Store.Release(ctx, key, nonce, inflight) })
}

// ReleaseMany is state.Store.ReleaseMany under the rules.
func (s *State) ReleaseMany(ctx context.Context, keys []string, nonce string, inflight []string) error {
	return s.call(ctx, "ReleaseMany", func() error { return s.Store.ReleaseMany(ctx, keys, nonce, inflight) })
}

// ReleaseMarks is state.Store.ReleaseMarks under the rules.
func (s *State) ReleaseMarks(ctx context.Context, c *campaign.Campaign, nonce string, addrs []string, now time.Time) error {
	return s.call(ctx, "ReleaseMarks", func() error { return s.Store.ReleaseMarks(ctx, c, nonce, addrs, now) })
}

// Fence is state.Store.Fence under the rules.
func (s *State) Fence(ctx context.Context, epoch, token string) error {
	return s.call(ctx, "Fence", func() error { return s.Store.Fence(ctx, epoch, token) })
}

// ReadClaims is state.Store.ReadClaims under the rules.
func (s *State) ReadClaims(ctx context.Context, epoch string, keys []string) (vals []any, err error) {
	err = s.call(ctx, "ReadClaims", func() (err error) { vals, err = s.Store.ReadClaims(ctx, epoch, keys); return })
	return vals, err
}

// AddProgress is state.Store.AddProgress under the rules.
func (s *State) AddProgress(ctx context.Context, id int64, moved map[string]int64) error {
	return s.call(ctx, "AddProgress", func() error { return s.Store.AddProgress(ctx, id, moved) })
}
