package campaign

import (
	"context"
	"fmt"
	"time"
)

// Lease identifies one run of one batch: the rows of the chunk it is sending carry its token until they
// get an outcome or the run ends (see migrations/0002_leases.sql).
type Lease struct {
	Batch int
	// Token is random per batch run.
	Token string
	// Epoch is the Redis epoch the run's claims are taken under.
	Epoch string
	// TTL is how long a lease lasts without renewal; it must exceed the provider's timeout.
	TTL time.Duration
	// AnyState leases whatever the campaign's state (the sweeper, which settles and sends nothing).
	AnyState bool
}

// Chunk is what LeaseChunk found and took.
type Chunk struct {
	// State is the campaign's state now.
	State State
	// Leased holds the users whose rows are now leased to the run. The value is true for a row taken over
	// from a run that died under another Redis epoch: a missing claim proves nothing for it.
	Leased map[string]bool
	// Busy counts pending rows under another run's live lease.
	Busy int
	// Consent holds the addresses that have consent right now (İYS ONAY for the channel and the campaign's
	// recipient type). Channels without an İYS type (push) report every address: their opt-in is decided at plan
	// time.
	Consent map[string]bool
}

// LeaseChunk reads the campaign's state and the consents of addrs, and leases the still-pending rows of
// users that no live run holds, in one statement. Rows are leased only while the campaign is running or
// cancelled (a cancelled campaign's batches are closed under leases too); in any other state nothing is
// leased and the caller waits.
func (s *Store) LeaseChunk(ctx context.Context, c *Campaign, users, addrs []string, l Lease) (Chunk, error) {
	ch := Chunk{Leased: map[string]bool{}, Consent: make(map[string]bool, len(addrs))}
	var leased []string
	var suspect []bool
	var ok []string
	err := s.pool.QueryRow(ctx, `
		WITH st AS (
			SELECT coalesce((SELECT state FROM campaigns WHERE id = $1), 'cancelled') AS state
		), cur AS (
			-- One primary-key lookup per user (OFFSET 0 keeps the planner from turning this into a scan of
			-- every pending row of the campaign, whatever its statistics say).
			SELECT r.user_id, r.lease_token, r.lease_until, r.lease_epoch
			FROM unnest($2::text[]) AS u(user_id) CROSS JOIN LATERAL (
				SELECT * FROM campaign_recipients r
				WHERE r.campaign_id = $1 AND r.user_id = u.user_id
				OFFSET 0) r
			WHERE r.status = 'pending' AND ($8 OR (SELECT state FROM st) IN ('running', 'cancelled'))
			FOR UPDATE OF r
		), got AS (
			UPDATE campaign_recipients r SET lease_token = $3, lease_epoch = $4,
				lease_until = now() + $5 * interval '1 millisecond',
				consent_snapshot = (SELECT jsonb_build_object('status', c.status, 'source', c.source, 'date', c.consent_date,
						'transaction_id', c.transaction_id, 'synced_at', coalesce(c.synced_at, c.updated_at))
					FROM iys_consents c WHERE c.recipient = r.address AND c.type = $7 AND c.recipient_type = $9 AND c.brand_code = $10)
			FROM cur
			WHERE r.campaign_id = $1 AND r.user_id = cur.user_id
			  AND (cur.lease_token IS NULL OR cur.lease_token = $3 OR cur.lease_until < now())
			RETURNING r.user_id,
				cur.lease_token IS NOT NULL AND cur.lease_token <> $3 AND coalesce(cur.lease_epoch, '') <> $4 AS suspect
		)
		SELECT (SELECT state FROM st),
			array(SELECT user_id FROM got ORDER BY user_id),
			array(SELECT suspect FROM got ORDER BY user_id),
			(SELECT count(*) FROM cur) - (SELECT count(*) FROM got),
			array(SELECT recipient FROM iys_consents
				WHERE recipient = ANY($6) AND type = $7 AND recipient_type = $9 AND brand_code = $10 AND status = 'ONAY')`,
		c.ID, users, l.Token, l.Epoch, l.TTL.Milliseconds(), addrs, c.Channel.IYSType(), l.AnyState, recipientTypeOf(c), c.BrandCode).
		Scan(&ch.State, &leased, &suspect, &ch.Busy, &ok)
	if err != nil {
		return ch, fmt.Errorf("lease chunk of batch %d: %w", l.Batch, err)
	}
	for i, u := range leased {
		ch.Leased[u] = suspect[i]
	}
	if c.Channel.IYSType() == "" || c.Transactional {
		// Push and webhook opt-ins are decided at plan time; a transactional message needs no consent.
		for _, a := range addrs {
			ch.Consent[a] = true
		}
	}
	for _, a := range ok {
		ch.Consent[a] = true
	}
	return ch, nil
}

func recipientTypeOf(c *Campaign) string {
	if c.RecipientType == "" {
		return "BIREYSEL"
	}
	return c.RecipientType
}

// RenewLease extends the run's lease on users' rows that are still pending. It returns how many it
// extended: fewer than asked means another run took some over (the lease had expired) and this run must
// stop sending them.
func (s *Store) RenewLease(ctx context.Context, campaignID int64, users []string, l Lease) (int, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE campaign_recipients SET lease_until = now() + $4 * interval '1 millisecond'
		WHERE campaign_id = $1 AND user_id = ANY($2) AND status = 'pending' AND lease_token = $3`,
		campaignID, users, l.Token, l.TTL.Milliseconds())
	if err != nil {
		return 0, fmt.Errorf("renew lease of batch %d: %w", l.Batch, err)
	}
	return int(tag.RowsAffected()), nil
}

// CancelUnleased marks the pending recipients of a cancelled campaign that no run ever leased (or whose
// run let them go unsent) as skipped (cancelled), and returns their codes to the pool. Such a row has
// never been claimed for a send, or its claim was released because nothing was accepted: none of them
// can have been sent. Rows under a lease are left to the batch runs, which read the claims.
func (s *Store) CancelUnleased(ctx context.Context, id int64) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, `
		WITH upd AS (
			UPDATE campaign_recipients r SET status = 'skipped', reason = 'cancelled', code = NULL, code_id = NULL,
				updated_at = now()
			FROM campaign_recipients old
			WHERE r.campaign_id = $1 AND r.status = 'pending' AND r.lease_token IS NULL
			  AND old.campaign_id = r.campaign_id AND old.user_id = r.user_id
			  AND EXISTS (SELECT 1 FROM campaigns WHERE id = $1 AND state = 'cancelled')
			RETURNING r.user_id, old.code_id
		), log AS (
			INSERT INTO send_log (campaign_id, user_id, status, reason)
			SELECT $1, user_id, 'skipped', 'cancelled' FROM upd
		), released AS (
			INSERT INTO released_codes (code_id, pool)
			SELECT upd.code_id, p.pool FROM upd JOIN promo_codes p ON p.id = upd.code_id
			ON CONFLICT (code_id) DO NOTHING
		)
		SELECT count(*) FROM upd`, id).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("cancel recipients of campaign %d: %w", id, err)
	}
	return n, nil
}

// Unknown returns the users of campaign id whose outcome is unknown.
func (s *Store) Unknown(ctx context.Context, id int64) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT user_id FROM campaign_recipients WHERE campaign_id = $1 AND status = 'unknown'`, id)
	if err != nil {
		return nil, fmt.Errorf("unknown recipients: %w", err)
	}
	var out []string
	for rows.Next() {
		var u string
		if err := rows.Scan(&u); err != nil {
			return nil, fmt.Errorf("unknown recipients: %w", err)
		}
		out = append(out, u)
	}
	return out, rows.Err()
}

// Resend moves users of campaign id from unknown back to pending, keeping their codes (a person who did
// get the first message gets the same code again, never a second one), and logs the decision. Their claims
// must have been cleared first. It returns how many moved.
func (s *Store) Resend(ctx context.Context, id int64, users []string) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, `
		WITH upd AS (
			UPDATE campaign_recipients SET status = 'pending', reason = NULL,
				lease_token = NULL, lease_until = NULL, lease_epoch = NULL, updated_at = now()
			WHERE campaign_id = $1 AND user_id = ANY($2) AND status = 'unknown'
			RETURNING user_id
		), log AS (
			INSERT INTO send_log (campaign_id, user_id, status, reason)
			SELECT $1, user_id, 'pending', 'resend of an unknown outcome (resume --resend-unknown)' FROM upd
		)
		SELECT count(*) FROM upd`, id, users).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("resend unknown recipients of campaign %d: %w", id, err)
	}
	return n, nil
}

// CountReason counts campaign id's recipients in status with reason.
func (s *Store) CountReason(ctx context.Context, id int64, status, reason string) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM campaign_recipients WHERE campaign_id = $1 AND status = $2 AND reason = $3`,
		id, status, reason).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count %s (%s) recipients: %w", status, reason, err)
	}
	return n, nil
}

// Expired is a batch with rows under leases that expired: the run that held them died.
type Expired struct {
	CampaignID int64
	Batch      int
	Users      []string
}

// ExpiredLeases returns up to limit rows under expired leases, grouped by batch.
func (s *Store) ExpiredLeases(ctx context.Context, limit int) ([]Expired, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT campaign_id, batch, array_agg(user_id ORDER BY user_id) FROM (
			SELECT campaign_id, batch, user_id FROM campaign_recipients
			WHERE lease_token IS NOT NULL AND lease_until < now() AND status = 'pending'
			ORDER BY lease_until LIMIT $1
		) x GROUP BY campaign_id, batch`, limit)
	if err != nil {
		return nil, fmt.Errorf("expired leases: %w", err)
	}
	var out []Expired
	for rows.Next() {
		var e Expired
		if err := rows.Scan(&e.CampaignID, &e.Batch, &e.Users); err != nil {
			return nil, fmt.Errorf("expired leases: %w", err)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}
