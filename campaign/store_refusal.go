package campaign

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/campaignctl/campaignctl/iys"
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

// ProviderNoConsent records that a provider refused c's message to addrs for want of consent (Netgsm
// found none in İYS: providers.Error.NoConsent): the ONAYs stored for them under c's brand and recipient
// type turn RET here, so that no later campaign sends them a commercial message through a provider that
// does not check. Nothing is queued for İYS. It returns how many consents turned; a campaign whose
// messages İYS does not govern (transactional, or a channel without an İYS type) records nothing.
func (s *Store) ProviderNoConsent(ctx context.Context, c *Campaign, addrs []string, source string, at time.Time) (int64, error) {
	if !c.ChecksIYS() || len(addrs) == 0 {
		return 0, nil
	}
	ns := make([]iys.NoConsent, len(addrs))
	for i, a := range addrs {
		ns[i] = iys.NoConsent{Recipient: a, Type: c.Channel.IYSType(), RecipientType: c.IYSRecipientType(), Source: source, At: at}
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
		rs[i] = iys.Refusal{Via: iys.ViaTwilioInbound, EventID: fmt.Sprintf("create:%d:%s:opted_out", c.ID, userIDs[i]), Kind: "opted_out",
			Recipient: a, Type: typ, CampaignID: c.ID, UserID: userIDs[i], Evidence: evidence, At: at}
	}
	rep, err := iys.RecordRefusals(ctx, s.pool, c.BrandCode, rs)
	return int64(rep.Revoked), err
}
