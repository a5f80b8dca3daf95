package faults

import (
	"context"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
)

// Store is a campaign.Store whose send-path methods go through rules (matched by method name, e.g.
// Method("Record")); the others are the real store's.
type Store struct {
	*campaign.Store
	rules
}

// NewStore wraps s.
func NewStore(s *campaign.Store) *Store { return &Store{Store: s} }

func (s *Store) call(ctx context.Context, name string, fn func() error) error {
	return around(ctx, s.pick(Call{Name: name}), fn)
}

// Get is campaign.Store.Get under the rules.
func (s *Store) Get(ctx context.Context, id int64) (c *campaign.Campaign, err error) {
	err = s.call(ctx, "Get", func() (err error) { c, err = s.Store.Get(ctx, id); return })
	return c, err
}

// StartIfDue is campaign.Store.StartIfDue under the rules.
func (s *Store) StartIfDue(ctx context.Context, id int64) (st campaign.State, err error) {
	err = s.call(ctx, "StartIfDue", func() (err error) { st, err = s.Store.StartIfDue(ctx, id); return })
	return st, err
}

// LoadBatch is campaign.Store.LoadBatch under the rules.
func (s *Store) LoadBatch(ctx context.Context, id int64, batch int) (rs []campaign.Recipient, err error) {
	err = s.call(ctx, "LoadBatch", func() (err error) { rs, err = s.Store.LoadBatch(ctx, id, batch); return })
	return rs, err
}

// LeaseChunk is campaign.Store.LeaseChunk under the rules.
func (s *Store) LeaseChunk(ctx context.Context, c *campaign.Campaign, users []string, l campaign.Lease) (ch campaign.Chunk, err error) {
	err = s.call(ctx, "LeaseChunk", func() (err error) { ch, err = s.Store.LeaseChunk(ctx, c, users, l); return })
	return ch, err
}

// RenewLease is campaign.Store.RenewLease under the rules.
func (s *Store) RenewLease(ctx context.Context, id int64, l campaign.Lease) (held bool, err error) {
	err = s.call(ctx, "RenewLease", func() (err error) { held, err = s.Store.RenewLease(ctx, id, l); return })
	return held, err
}

// ReleaseBatch is campaign.Store.ReleaseBatch under the rules.
func (s *Store) ReleaseBatch(ctx context.Context, id int64, l campaign.Lease) error {
	return s.call(ctx, "ReleaseBatch", func() error { return s.Store.ReleaseBatch(ctx, id, l) })
}

// Record is campaign.Store.Record under the rules.
func (s *Store) Record(ctx context.Context, id int64, outcomes []campaign.Outcome, l campaign.Lease, inHand []string) (moved map[string]int64, err error) {
	err = s.call(ctx, "Record", func() (err error) { moved, err = s.Store.Record(ctx, id, outcomes, l, inHand); return })
	return moved, err
}

// CloseBatch is campaign.Store.CloseBatch under the rules.
func (s *Store) CloseBatch(ctx context.Context, id int64, batch int) (done, open bool, err error) {
	err = s.call(ctx, "CloseBatch", func() (err error) { done, open, err = s.Store.CloseBatch(ctx, id, batch); return })
	return done, open, err
}

// ExpiredLeases is campaign.Store.ExpiredLeases under the rules.
func (s *Store) ExpiredLeases(ctx context.Context, limit int, gone []int64, holderGrace time.Duration) (es []campaign.Expired, err error) {
	err = s.call(ctx, "ExpiredLeases", func() (err error) { es, err = s.Store.ExpiredLeases(ctx, limit, gone, holderGrace); return })
	return es, err
}

// GoneHolders is campaign.Store.GoneHolders under the rules.
func (s *Store) GoneHolders(ctx context.Context) (hs []int64, err error) {
	err = s.call(ctx, "GoneHolders", func() (err error) { hs, err = s.Store.GoneHolders(ctx); return })
	return hs, err
}

// RecentSends is campaign.Store.RecentSends under the rules. A rule that fails it after Skip sends (Kind
// Fail with Match Method("RecentSends/row")) breaks the stream in the middle, as a connection lost while
// the rows come in would.
func (s *Store) RecentSends(ctx context.Context, yield func(campaign.RecentSend) error) (longest time.Duration, err error) {
	err = s.call(ctx, "RecentSends", func() (err error) {
		longest, err = s.Store.RecentSends(ctx, func(rs campaign.RecentSend) error {
			if err := around(ctx, s.pick(Call{Name: "RecentSends/row"}), func() error { return nil }); err != nil {
				return err
			}
			return yield(rs)
		})
		return err
	})
	return longest, err
}

// ChunksInHand is campaign.Store.ChunksInHand under the rules.
func (s *Store) ChunksInHand(ctx context.Context, epoch string) (n int, err error) {
	err = s.call(ctx, "ChunksInHand", func() (err error) { n, err = s.Store.ChunksInHand(ctx, epoch); return })
	return n, err
}
