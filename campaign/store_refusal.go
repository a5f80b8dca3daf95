package campaign

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ErrNoRecipient is returned by LinkRecipient for a campaign and user that were never planned together.
var ErrNoRecipient = errors.New("no such recipient of the campaign")

// LinkRecipient returns the address campaign id was planned to send to userID, with the campaign's channel
// and İYS brand: what a one-click unsubscribe link of that recipient refuses. ErrNoRecipient when the
// user is not in the campaign.
func (s *Store) LinkRecipient(ctx context.Context, id int64, userID string) (address string, ch Channel, brand string, err error) {
	err = s.pool.QueryRow(ctx, `SELECT r.address, c.channel, c.brand_code FROM campaign_recipients r JOIN campaigns c ON c.id = r.campaign_id
		WHERE r.campaign_id = $1 AND r.user_id = $2`, id, userID).Scan(&address, &ch, &brand)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", "", ErrNoRecipient
	}
	if err != nil {
		return "", "", "", fmt.Errorf("unsubscribe link: %w", err)
	}
	return address, ch, brand, nil
}
