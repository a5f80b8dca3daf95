package campaign

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/campaignctl/campaignctl/internal/pgtext"
	"github.com/campaignctl/campaignctl/iys"
)

// ErrNoRecipient is returned by LinkRecipient for a campaign and user that were never planned together.
var ErrNoRecipient = errors.New("no such recipient of the campaign")

// LinkRecipient returns the address campaign id was planned to send to userID, with the campaign's channel
// and İYS brand: what a one-click unsubscribe link of that recipient refuses. unsure says whether the
// recipient's outcome is unknown: recorded unknown, or pending again for `resume --resend-unknown` after it
// was (a used link then proves that the first message went out). ErrNoRecipient when the user is not in
// the campaign, or when nonce (the campaign's nonce the link carries; "" for a link without one) is not
// this campaign's: the link is of another campaign that had the same ID (a database re-created, another
// engine signing with the same secret), whose recipient this one is not.
func (s *Store) LinkRecipient(ctx context.Context, id int64, nonce, userID string) (address string, ch Channel, brand string, unsure bool, err error) {
	err = s.pool.QueryRow(ctx, `SELECT r.address, c.channel, c.brand_code,
			r.status = `+sqlUnknown+` OR r.status = `+sqlPending+` AND r.ever_unknown
		FROM campaign_recipients r JOIN campaigns c ON c.id = r.campaign_id
		WHERE r.campaign_id = $1 AND r.user_id = $2
		  AND ($3::bigint = 0 OR $3::bigint = `+createdMicros("c")+`)`, id, userID, NonceMicros(nonce)).Scan(&address, &ch, &brand, &unsure)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", "", false, ErrNoRecipient
	}
	if err != nil {
		return "", "", "", false, fmt.Errorf("unsubscribe link: %w", err)
	}
	return address, ch, brand, unsure, nil
}

// ProviderNoConsent records that a provider refused c's message to addrs for want of consent (Netgsm
// found none in İYS: providers.Error.NoConsent): the ONAYs stored for them under c's brand and recipient
// type turn RET here, so that no later campaign sends them a commercial message through a provider that
// does not check. Nothing is queued for İYS. It returns how many consents turned; a campaign whose
// messages İYS does not govern (transactional, or a channel without an İYS type) records nothing.
func (s *Store) ProviderNoConsent(ctx context.Context, c *Campaign, addrs []string, source string, at time.Time) (int64, error) {
	ns := make([]ProviderRefusal, len(addrs))
	for i, a := range addrs {
		ns[i] = ProviderRefusal{Addr: a, Source: source, At: at}
	}
	return s.ProviderNoConsents(ctx, c, ns)
}

// ProviderRefusal is one of c's messages a provider refused for want of consent: to Addr, in the
// provider's words Source, at At (when the provider asked İYS: a consent given after it stands).
type ProviderRefusal struct {
	Addr, Source string
	At           time.Time
}

// ProviderNoConsents is ProviderNoConsent for refusals with a source and a time each (Netgsm's reports of
// status 16, each dated with its send), in one write.
func (s *Store) ProviderNoConsents(ctx context.Context, c *Campaign, rs []ProviderRefusal) (int64, error) {
	if !c.ChecksIYS() || len(rs) == 0 {
		return 0, nil
	}
	ns := make([]iys.NoConsent, len(rs))
	for i, r := range rs {
		ns[i] = iys.NoConsent{Recipient: r.Addr, Type: c.Channel.IYSType(), RecipientType: c.IYSRecipientType(), Source: r.Source, At: r.At}
	}
	return iys.RecordNoConsent(ctx, s.pool, c.BrandCode, ns)
}

// ProviderOptOut records that the provider refused c's message to addrs (planned for userIDs, in the same
// order) because the people had opted out with it (Twilio's 21610: they replied STOP to the brand's
// sender): their refusals through the brand's channel, recorded as such in one transaction
// (iys.RecordRefusals: the consents turn RET, and the RETs wait for İYS), as the same error in a status
// callback is, whatever the message: a transactional one too, since the person refused the sender, not
// the message (and no status callback follows: Twilio created none). It returns how many consents turned;
// a channel İYS does not govern records nothing.
func (s *Store) ProviderOptOut(ctx context.Context, c *Campaign, userIDs, addrs []string, evidence string, at time.Time) (int64, error) {
	typ := c.Channel.IYSType()
	if typ == "" || len(addrs) == 0 {
		return 0, nil
	}
	rs := make([]iys.Refusal, len(addrs))
	for i, a := range addrs {
		rs[i] = iys.Refusal{Via: iys.ViaTwilioOptOut, EventID: fmt.Sprintf("create:%d:%s:opted_out", c.ID, userIDs[i]), Kind: "opted_out",
			Recipient: a, Type: typ, CampaignID: c.ID, UserID: userIDs[i], Evidence: evidence, At: at}
	}
	rep, err := iys.RecordRefusals(ctx, s.pool, c.BrandCode, rs)
	return int64(rep.Revoked), err
}

// PendingRefusal is a provider's refusal for want of consent (ProviderNoConsent, or ProviderOptOut when
// OptedOut) kept in Postgres until its consents are written, so that a worker killed before it wrote them
// leaves it to another (TakePendingRefusals) instead of losing it.
type PendingRefusal struct {
	ID         int64
	CampaignID int64
	UserIDs    []string
	Addrs      []string // in the order of UserIDs
	OptedOut   bool
	Reason     string
	At         time.Time
	// Holder is the liveness key of the worker writing it (0: none): nobody else takes it while that
	// worker's lock is held.
	Holder int64
}

// KeepPendingRefusal stores p until DropPendingRefusal and returns its ID. A refusal without a holder is
// not taken by another worker for hold. Provider text Postgres refuses (a NUL, invalid UTF-8) is stored
// with U+FFFD in its place.
func (s *Store) KeepPendingRefusal(ctx context.Context, p PendingRefusal, hold time.Duration) (int64, error) {
	var id int64
	err := s.pool.QueryRow(ctx, `INSERT INTO pending_provider_refusals (campaign_id, user_ids, addresses, opted_out, reason, refused_at, holder, taken_until)
		VALUES ($1, $2, $3, $4, $5, $6, NULLIF($7::bigint, 0), now() + $8 * interval '1 millisecond') RETURNING id`,
		p.CampaignID, p.UserIDs, p.Addrs, p.OptedOut, pgtext.Clean(p.Reason), p.At, p.Holder, hold.Milliseconds()).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("keep a provider's refusal: %w", err)
	}
	return id, nil
}

// TakePendingRefusals takes, for holder (its liveness key, 0 for none) and for hold, up to limit refusals
// whose worker is gone (its liveness lock is not held), or whose hold has passed while they had no holder
// or were holder's own (taken before, and neither written nor let go: ReleasePendingRefusals). The oldest
// come first.
func (s *Store) TakePendingRefusals(ctx context.Context, holder int64, limit int, hold time.Duration) ([]PendingRefusal, error) {
	rows, err := s.pool.Query(ctx, `
		UPDATE pending_provider_refusals p SET holder = NULLIF($1::bigint, 0), taken_until = now() + $3 * interval '1 millisecond'
		FROM (SELECT id FROM pending_provider_refusals
			WHERE CASE WHEN holder IS NULL OR holder = $1 THEN taken_until < now() ELSE NOT `+holderLocked("holder")+` END
			ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED) t
		WHERE p.id = t.id
		RETURNING p.id, p.campaign_id, p.user_ids, p.addresses, p.opted_out, p.reason, p.refused_at`, holder, limit, hold.Milliseconds())
	if err != nil {
		return nil, fmt.Errorf("take providers' refusals left by gone workers: %w", err)
	}
	ps, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (PendingRefusal, error) {
		p := PendingRefusal{Holder: holder}
		err := r.Scan(&p.ID, &p.CampaignID, &p.UserIDs, &p.Addrs, &p.OptedOut, &p.Reason, &p.At)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("take providers' refusals left by gone workers: %w", err)
	}
	return ps, nil
}

// DropPendingRefusal forgets a kept refusal once its consents are written (or can never be).
func (s *Store) DropPendingRefusal(ctx context.Context, id int64) error {
	if _, err := s.pool.Exec(ctx, `DELETE FROM pending_provider_refusals WHERE id = $1`, id); err != nil {
		return fmt.Errorf("drop a provider's refusal once written: %w", err)
	}
	return nil
}

// ReleasePendingRefusals lets go of kept refusals taken (TakePendingRefusals) and not written: any worker
// takes them again after after.
func (s *Store) ReleasePendingRefusals(ctx context.Context, ids []int64, after time.Duration) error {
	if len(ids) == 0 {
		return nil
	}
	if _, err := s.pool.Exec(ctx, `UPDATE pending_provider_refusals SET holder = NULL, taken_until = now() + $2 * interval '1 millisecond' WHERE id = ANY($1)`,
		ids, after.Milliseconds()); err != nil {
		return fmt.Errorf("let go of providers' refusals not written: %w", err)
	}
	return nil
}
