package campaign

import (
	"context"
	"fmt"
	"time"
)

// RecentSend is a message that went out, or may have (unknown), lately: the frequency mark it left.
type RecentSend struct {
	CampaignID int64
	// CampaignCreated is the campaign's CreatedAt (its claims' and marks' nonce is made of it).
	CampaignCreated time.Time
	Channel         Channel
	Address         string
	At              time.Time
	// Beside, when set, says this is not the latest send to the address but the latest of another
	// campaign than the latest's, which was at Latest: its mark is kept beside the latest's (a campaign's
	// own mark does not cap it, another's within its cap does).
	Beside bool
	Latest time.Time
}

// longestCapSQL is the longest frequency cap, in seconds, a campaign that may still send keeps, at least
// $1 (DefaultFrequencyCap): how far back the marks a Redis that lost its data must get back reach.
const longestCapSQL = `SELECT greatest($1::bigint, coalesce(max(frequency_cap_seconds), 0)) FROM campaigns
		WHERE state IN (` + sqlStatePlanning + `, ` + sqlStateScheduled + `, ` + sqlStateRunning + `, '` + string(StatePaused) + `')`

// HasRecentSends says whether RecentSends would yield anything: a send (or an unknown one) within the
// default frequency cap or the longest a campaign that may still send keeps, or a chunk in hand. Without
// any, a Redis that lost its data (or is new) lost no frequency mark.
func (s *Store) HasRecentSends(ctx context.Context) (bool, error) {
	var any bool
	err := s.pool.QueryRow(ctx, `
		SELECT EXISTS (SELECT 1 FROM send_log l WHERE l.status IN (`+sqlSent+`, `+sqlUnknown+`)
			AND l.at > now() - (`+longestCapSQL+`) * interval '1 second')
		OR EXISTS (SELECT 1 FROM campaign_batches b WHERE b.lease_users <> '{}' OR b.suspect_users <> '{}')`,
		int64(DefaultFrequencyCap/time.Second)).Scan(&any)
	if err != nil {
		return false, fmt.Errorf("recent sends: %w", err)
	}
	return any, nil
}

// RecentSends calls yield with the latest send to each address on each channel (and the latest of another
// campaign, Beside, when there is one) within the longest
// frequency cap a campaign that may still send keeps (at least DefaultFrequencyCap), read from the audit
// log and the chunks in hand, and returns that cap. It is what a Redis that lost its data must get back before anything is
// claimed again: the marks the send-time cap reads.
func (s *Store) RecentSends(ctx context.Context, yield func(RecentSend) error) (time.Duration, error) {
	var secs int64
	if err := s.pool.QueryRow(ctx, longestCapSQL, int64(DefaultFrequencyCap/time.Second)).Scan(&secs); err != nil {
		return 0, fmt.Errorf("recent sends: the longest cap: %w", err)
	}
	// Besides the audit log, the pending recipients of every chunk in hand (and every suspect) are sends
	// as of now: a run that died with its chunk in hand may have sent them, and its answers were only in
	// the claims Redis lost; they reach the audit log (unknown) only once the sweeper settles the chunk,
	// after the marks are back. A mark of a message that does not go out makes the person wait out the
	// cap: never a second message within it.
	// Per address, the latest send, and the latest of another campaign than the latest's: a campaign
	// whose own send (an unknown one, logged when its chunk ended) is the latest must still be capped by
	// another campaign's message before it, as it was by that campaign's mark before the loss.
	rows, err := s.pool.Query(ctx, `
		SELECT DISTINCT ON (channel, address, campaign_id <> top) campaign_id, created_at, channel, address, at, campaign_id <> top, top_at FROM (
		SELECT s.*, first_value(campaign_id) OVER w AS top, first_value(at) OVER w AS top_at FROM (
			SELECT l.campaign_id, c.created_at, c.channel, r.address, l.at
			FROM send_log l
			JOIN campaigns c ON c.id = l.campaign_id
			JOIN campaign_recipients r ON r.campaign_id = l.campaign_id AND r.user_id = l.user_id
			WHERE NOT c.transactional AND l.status IN (`+sqlSent+`, `+sqlUnknown+`) AND l.at > now() - $1 * interval '1 second'
			UNION ALL
			SELECT b.campaign_id, c.created_at, c.channel, r.address, now()
			FROM campaign_batches b
			JOIN campaigns c ON c.id = b.campaign_id
			CROSS JOIN LATERAL unnest(b.lease_users || b.suspect_users) AS u
			JOIN campaign_recipients r ON r.campaign_id = b.campaign_id AND r.user_id = u
			WHERE (b.lease_users <> '{}' OR b.suspect_users <> '{}') AND r.status = `+sqlPending+` AND NOT c.transactional
		) s
		WINDOW w AS (PARTITION BY channel, address ORDER BY at DESC, campaign_id)
		) t
		ORDER BY channel, address, campaign_id <> top, at DESC, campaign_id`, secs)
	if err != nil {
		return 0, fmt.Errorf("recent sends: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var rs RecentSend
		var ch string
		if err := rows.Scan(&rs.CampaignID, &rs.CampaignCreated, &ch, &rs.Address, &rs.At, &rs.Beside, &rs.Latest); err != nil {
			return 0, fmt.Errorf("recent sends: %w", err)
		}
		rs.Channel = Channel(ch)
		if err := yield(rs); err != nil {
			return 0, err
		}
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("recent sends: %w", err)
	}
	return time.Duration(secs) * time.Second, nil
}

// ChunksInHand counts the batches with a chunk in hand under a live lease of another Redis epoch than
// epoch: runs that leased before Redis lost its data and are still sending. Their answered sends reach the
// audit log only when they record their chunks (at their next claim, refused, or as soon as a wait of
// theirs sees the new epoch), so the marks of an epoch are written back once there are none. A dead run's
// chunk (its lease expired) does not count: its answers were only in the claims Redis lost, and it becomes
// unknown; RecentSends marks its recipients as sent when the marks come back. The caller's own batch counts like any other: a live run that holds it
// (the task delivered again, by a resume say) has sends of its own that are not in the audit log yet.
func (s *Store) ChunksInHand(ctx context.Context, epoch string) (int, error) {
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM campaign_batches
		WHERE lease_users <> '{}' AND coalesce(lease_epoch, '') <> $1 AND lease_until > now()`, epoch).Scan(&n); err != nil {
		return 0, fmt.Errorf("chunks in hand under another epoch: %w", err)
	}
	return n, nil
}
