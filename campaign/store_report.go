package campaign

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/campaignctl/campaignctl/providers"
)

// sample renders the message of the first planned recipient, so the marketer sees exactly what goes out.
func (p *Planner) sample(ctx context.Context, tx pgx.Tx, id int64, spec Spec, tmpl *Template, rep *Report) error {
	var r Recipient
	err := tx.QueryRow(ctx, `SELECT user_id, address, vars, coalesce(code, '') FROM campaign_recipients
		WHERE campaign_id = $1 ORDER BY batch, user_id LIMIT 1`, id).Scan(&r.UserID, &r.Address, &r.Vars, &r.Code)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	if spec.OneClickUnsubscribe() {
		r.UnsubscribeURL = UnsubscribeSample
		if spec.UnsubscribeSample != "" {
			r.UnsubscribeURL = spec.UnsubscribeSample
		}
	}
	parts, err := tmpl.RenderParts(r.TemplateData(spec.Channel, spec.Name))
	if err != nil {
		return fmt.Errorf("%w: the message template fails for user %s: %v", ErrInvalid, r.UserID, err)
	}
	msg := parts.Text
	rep.SampleMessage, rep.SampleSubject, rep.SampleHTML = msg, parts.Subject, parts.HTML
	if spec.Channel.Spec().Segmented {
		rep.Encoding, rep.SegmentsPerMessage = providers.SMSSegments(msg)
		if err := CheckSMSLength(msg, spec.MaxSegments); err != nil {
			return fmt.Errorf("%w: the first message (user %s) %v", ErrInvalid, r.UserID, err)
		}
		if rep.SegmentsPerMessage > WarnSegments {
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("each message takes %d SMS segments (%s): it is billed %d times; shorten it to %d or fewer if you can",
				rep.SegmentsPerMessage, rep.Encoding, rep.SegmentsPerMessage, WarnSegments))
		}
	}
	return nil
}

// countSegments renders every planned message, as the worker will, and adds up its SMS segments. A
// message that fails to render stops the launch before anything is written.
func (p *Planner) countSegments(ctx context.Context, tx pgx.Tx, id int64, spec Spec, tmpl *Template, rep *Report) error {
	rows, err := tx.Query(ctx, `SELECT user_id, address, vars, coalesce(code, '') FROM campaign_recipients WHERE campaign_id = $1`, id)
	if err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	defer rows.Close()
	var r Recipient
	var tooLong int
	var firstLong string
	for rows.Next() {
		if err := rows.Scan(&r.UserID, &r.Address, &r.Vars, &r.Code); err != nil {
			return fmt.Errorf("plan: %w", err)
		}
		msg, err := tmpl.Render(r.TemplateData(spec.Channel, spec.Name))
		if err != nil {
			return fmt.Errorf("%w: the message template fails for user %s: %v", ErrInvalid, r.UserID, err)
		}
		enc, n := providers.SMSSegments(msg)
		rep.TotalSegments += int64(n)
		if enc == providers.EncodingUCS2 {
			rep.UCS2Messages++
		}
		if err := CheckSMSLength(msg, spec.MaxSegments); err != nil && tooLong == 0 {
			tooLong, firstLong = 1, fmt.Sprintf("user %s's message %v", r.UserID, err)
		} else if err != nil {
			tooLong++
		}
	}
	if tooLong > 0 {
		return fmt.Errorf("%w: %d messages are too long; %s", ErrInvalid, tooLong, firstLong)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	return nil
}

// ReasonCounts returns the campaign's failed and skipped recipients counted by reason, at most top
// reasons of each (the most frequent).
func (s *Store) ReasonCounts(ctx context.Context, id int64, top int) (failed, skipped map[string]int64, err error) {
	rows, err := s.pool.Query(ctx, `
		SELECT status, reason, n FROM (
			SELECT status, coalesce(reason, '') AS reason, count(*) AS n,
			       row_number() OVER (PARTITION BY status ORDER BY count(*) DESC, coalesce(reason, '')) AS rank
			FROM campaign_recipients WHERE campaign_id = $1 AND status IN ('failed', 'skipped') GROUP BY status, coalesce(reason, '')
		) r WHERE rank <= $2`, id, top)
	if err != nil {
		return nil, nil, fmt.Errorf("reasons: %w", err)
	}
	defer rows.Close()
	failed, skipped = map[string]int64{}, map[string]int64{}
	for rows.Next() {
		var st, reason string
		var n int64
		if err := rows.Scan(&st, &reason, &n); err != nil {
			return nil, nil, fmt.Errorf("reasons: %w", err)
		}
		if st == StatusFailed {
			failed[reason] = n
		} else {
			skipped[reason] = n
		}
	}
	return failed, skipped, rows.Err()
}
