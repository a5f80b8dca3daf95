package state

import (
	"context"
	"fmt"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
)

// AddProgress advances campaign id's progress counters by what moved (status → count); counters are a
// fast view for the progress bars, rebuilt from Postgres by resume. When a recipient settled (any status
// but pending), it also notes when (ProgressMovedAt).
func (s *Store) AddProgress(ctx context.Context, id int64, moved map[string]int64) error {
	if len(moved) == 0 {
		return nil
	}
	pipe := s.rdb.Pipeline()
	key := ProgressKey(id)
	settled := false
	for st, n := range moved {
		pipe.HIncrBy(ctx, key, st, n)
		settled = settled || st != campaign.StatusPending && n > 0
	}
	if settled {
		pipe.HSet(ctx, key, ProgressMovedAt, time.Now().UnixMilli())
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("progress counters of campaign %d: %w", id, err)
	}
	return nil
}
