package campaign

import (
	"context"
	"fmt"
	"time"
)

// ReportDue is a message a provider accepted whose delivery is not known to be final: what a poll of the
// provider's reports asks about (Netgsm posts no receipts).
type ReportDue struct {
	CampaignID int64
	UserID     string
	// Address is where the message went (E.164 for an SMS); MessageID what the provider answered the send
	// with (Netgsm's job ID).
	Address, MessageID string
	SentAt             time.Time
}

// ReportsDue returns up to limit of the SMS recipients sent through provider since since whose delivery
// is not final yet (no receipt, or only an intermediate one), after the recipient (afterCampaign,
// afterUser) in the order of the recipients' key. A caller walks through them all by passing the last one
// back, and starts again from (0, "") once none is left. Only the campaigns still sending since since are
// read, each through its range of the primary key.
func (s *Store) ReportsDue(ctx context.Context, provider string, since time.Time, afterCampaign int64, afterUser string, limit int) ([]ReportDue, error) {
	// Campaign by campaign, each a range of the primary key: the recipients of campaigns that finished
	// before since, however many, are never read.
	rows, err := s.pool.Query(ctx, `
		SELECT r.campaign_id, r.user_id, r.address, r.provider_message_id, r.sent_at
		FROM (SELECT id FROM campaigns WHERE channel = `+quoteLiteral(string(ChannelSMS))+`
				AND (finished_at IS NULL OR finished_at > $2) AND id >= $3) c
		CROSS JOIN LATERAL (
			SELECT r.campaign_id, r.user_id, r.address, r.provider_message_id, r.sent_at
			FROM campaign_recipients r
			WHERE r.campaign_id = c.id AND (r.campaign_id, r.user_id) > ($3, $4)
			  AND r.provider = $1 AND r.status = `+sqlSent+` AND r.provider_message_id IS NOT NULL AND r.sent_at > $2
			  AND (r.delivery IS NULL OR `+deliveryRank("r.delivery")+` < 3)
			ORDER BY r.user_id
			LIMIT $5) r
		ORDER BY r.campaign_id, r.user_id
		LIMIT $5`, provider, since, afterCampaign, afterUser, limit)
	if err != nil {
		return nil, fmt.Errorf("messages due a report: %w", err)
	}
	defer rows.Close()
	var out []ReportDue
	for rows.Next() {
		var d ReportDue
		if err := rows.Scan(&d.CampaignID, &d.UserID, &d.Address, &d.MessageID, &d.SentAt); err != nil {
			return nil, fmt.Errorf("messages due a report: %w", err)
		}
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("messages due a report: %w", err)
	}
	return out, nil
}
