package state

import (
	"context"
	"fmt"
)

// AddProgress advances campaign id's progress counters by what moved (status → count); counters are a
// fast view for the progress bars, rebuilt from Postgres by resume.
func (s *Store) AddProgress(ctx context.Context, id int64, moved map[string]int64) error {
	if len(moved) == 0 {
		return nil
	}
	pipe := s.rdb.Pipeline()
	key := ProgressKey(id)
	for st, n := range moved {
		pipe.HIncrBy(ctx, key, st, n)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("progress counters of campaign %d: %w", id, err)
	}
	return nil
}
