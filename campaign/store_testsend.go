package campaign

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/campaignctl/campaignctl/providers"
)

// TestCampaignID is the campaign_id of a test send's audit entry: a test send creates no campaign, and
// send_log.campaign_id cannot be NULL; no campaign has ID 0 (campaigns' IDs are an identity from 1).
const TestCampaignID = 0

// StatusTest is the send_log status of a test send the provider accepted; StatusTestFailed of one it
// did not.
const (
	StatusTest       = "test"
	StatusTestFailed = "test_failed"
)

// TestRecipient runs spec's audience query as a launch does (read-only, under its statement timeout, as
// the audience role) and returns one of its rows as a recipient without a code: the first row, or the
// row whose user_id is userID. The template is checked against the row's columns as a launch checks it.
// Nothing is written.
func (p *Planner) TestRecipient(ctx context.Context, spec Spec, userID string) (Recipient, error) {
	if spec.StatementTimeout == 0 {
		spec.StatementTimeout = 5 * time.Minute
	}
	tmpl, err := ParseContent(spec.Content())
	if err != nil {
		return Recipient{}, err
	}
	atx, err := p.Audience.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return Recipient{}, fmt.Errorf("audience database: %w", err)
	}
	defer atx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	if _, err := atx.Exec(ctx, fmt.Sprintf(`SET LOCAL statement_timeout = %d`, spec.StatementTimeout.Milliseconds())); err != nil {
		return Recipient{}, fmt.Errorf("audience database: %w", err)
	}
	rows, cols, err := runAudience(ctx, atx, spec)
	if err != nil {
		return Recipient{}, err
	}
	defer rows.Close()
	src := &audienceSource{rows: rows, names: cols, userIdx: -1, addrIdx: -1, canonical: spec.Channel.Spec().Canonical}
	for i, name := range cols {
		if name == "user_id" {
			src.userIdx = i
		}
		if name == spec.Channel.AddressColumn() {
			src.addrIdx = i
		}
	}
	if len(cols) == 0 {
		rows.Close()
		if err := rows.Err(); err != nil {
			return Recipient{}, audienceError(err, spec.StatementTimeout, !spec.AllowPrivilegedAudience)
		}
		return Recipient{}, fmt.Errorf("%w: the audience query returned no columns; it must be one SELECT returning user_id and %s", ErrInvalid, spec.Channel.AddressColumn())
	}
	if src.userIdx < 0 || src.addrIdx < 0 {
		missing := "user_id"
		if src.userIdx >= 0 {
			missing = spec.Channel.AddressColumn()
		}
		return Recipient{}, fmt.Errorf("%w: the audience query returns no %s column (it returns: %v)", ErrInvalid, missing, cols)
	}
	keys := append(append([]string(nil), cols...), "campaign")
	if spec.CodePool != "" {
		keys = append(keys, "code")
	}
	if spec.OneClickUnsubscribe() {
		keys = append(keys, "unsubscribe_url")
	} else if slices.Contains(tmpl.Fields(), "unsubscribe_url") && !slices.Contains(cols, "unsubscribe_url") {
		return Recipient{}, fmt.Errorf("%w: the message template uses {{.unsubscribe_url}}, which a %s message without a one-click unsubscribe link does not have; remove it", ErrInvalid, spec.Channel.Spec().Title)
	}
	if err := tmpl.Check(keys); err != nil {
		return Recipient{}, err
	}
	for src.Next() {
		vals, err := src.Values()
		if err != nil {
			return Recipient{}, err
		}
		user, _ := vals[1].(string)
		if userID != "" && user != userID {
			continue
		}
		addr, _ := vals[2].(string)
		vars, _ := vals[3].(json.RawMessage)
		return Recipient{UserID: user, Address: addr, Vars: vars}, nil
	}
	if err := src.Err(); err != nil {
		return Recipient{}, audienceError(err, spec.StatementTimeout, !spec.AllowPrivilegedAudience)
	}
	if userID != "" {
		return Recipient{}, fmt.Errorf("%w: the audience has no row with user_id %q; pick another --test-user, or leave it out to use the first row", ErrInvalid, providers.MaskUserID(userID))
	}
	return Recipient{}, fmt.Errorf("%w: the audience query returned no rows: a test send renders the message for one of them", ErrInvalid)
}

// TestConsent returns the İYS status (ONAY or RET) of address's consent under spec's rule (the
// channel's İYS type, the recipient type and brand), "" when there is none.
// CheckPool returns ErrInvalid when spec names a code pool that does not exist: a test send reserves no
// code, but the campaign it tries out would be refused for it.
func (p *Planner) CheckPool(ctx context.Context, spec Spec) error {
	if spec.CodePool == "" {
		return nil
	}
	var ok bool
	if err := p.Engine.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM code_pools WHERE name = $1)`, spec.CodePool).Scan(&ok); err != nil {
		return fmt.Errorf("code pool: %w", err)
	}
	if !ok {
		return errNoPool(spec.CodePool)
	}
	return nil
}

func (p *Planner) TestConsent(ctx context.Context, spec Spec, address string) (string, error) {
	rule := spec.consentRule()
	var args params
	q := `SELECT c.status FROM iys_consents c WHERE ` + rule.joinSQL("c", args.bind(address), args.bind)
	var status string
	err := p.Engine.QueryRow(ctx, q, args...).Scan(&status)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read consent: %w", err)
	}
	return status, nil
}

// LogTest records a test send in the audit (send_log): under TestCampaignID, with status StatusTest (or
// StatusTestFailed), the masked address it went to in reason, the provider's message ID and the content's
// hash.
func (p *Planner) LogTest(ctx context.Context, spec Spec, userID, status, reason, messageID string) error {
	var msgID *string
	if messageID != "" {
		msgID = &messageID
	}
	_, err := p.Engine.Exec(ctx, `INSERT INTO send_log (campaign_id, user_id, status, reason, provider_message_id, channel, template_hash)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`, TestCampaignID, userID, status, reason, msgID, string(spec.Channel), spec.Content().Hash())
	if err != nil {
		return fmt.Errorf("audit test send: %w", err)
	}
	return nil
}
