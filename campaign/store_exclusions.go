package campaign

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// StatusExcluded is the report's status of an audience row the launch excluded (with its reason); such
// a row never became a recipient.
const StatusExcluded = "excluded"

// ReportStatuses lists the statuses a report row may have, in the order help text names them.
var ReportStatuses = []string{StatusSent, StatusFailed, StatusSkipped, StatusUnknown, StatusPending, StatusExcluded}

// ReportRow is one audience row of a campaign as Report sees it: a planned recipient, or a row the launch
// excluded. Text the row does not have is "" (an excluded row has no code, a row without a user_id has
// none either), a time it does not have is nil.
type ReportRow struct {
	UserID  string `json:"user_id"`
	Address string `json:"address"`
	// Status is one of ReportStatuses.
	Status string `json:"status"`
	// Reason is the exclusion's reason, a skip's, a permanent failure's (the provider's words) or the
	// last error of an unknown or pending row.
	Reason string `json:"reason"`
	Code   string `json:"code"`
	// Provider names the provider that sent (or refused) the message, as the worker recorded it (or, for
	// a row recorded before that, as a send that failed over to the fallback says in its reason). ""
	// otherwise (the caller knows the channel's).
	Provider          string `json:"provider"`
	ProviderMessageID string `json:"provider_message_id"`
	Attempts          int    `json:"attempts"`
	// Delivery is the last delivery receipt's word (delivered, undelivered, bounced, ...), "" before any.
	Delivery    string     `json:"delivery"`
	SentAt      *time.Time `json:"sent_at"`
	DeliveredAt *time.Time `json:"delivered_at"`
	// DeliveryError is why the last receipt says the message was not delivered (the provider's words,
	// "netgsm 16: İYS holds no consent for the number"), "" otherwise.
	DeliveryError string `json:"delivery_error"`
}

// insertExclusions keeps every audience row the classification excluded, with its reason, in one
// set-based statement. No ORDER BY: the rows go in as the temporary table is read, with nothing to sort.
func (p *Planner) insertExclusions(ctx context.Context, tx pgx.Tx, id int64) error {
	t0 := time.Now()
	if _, err := tx.Exec(ctx, `INSERT INTO campaign_exclusions (campaign_id, user_id, address, reason)
		SELECT $1, user_id, coalesce(address, raw_address), reason FROM audience_classified WHERE reason IS NOT NULL`, id); err != nil {
		return fmt.Errorf("plan: exclusions: %w", err)
	}
	p.step("exclusions", t0)
	return nil
}

// ParseReportStatuses reads a comma-separated list of report statuses ("" or "all": every one). An
// unknown status is an error that names the valid ones (the caller's usage error: it is not a campaign's).
func ParseReportStatuses(s string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.ToLower(strings.TrimSpace(f))
		switch {
		case f == "":
			continue
		case !slices.Contains(ReportStatuses, f):
			return nil, fmt.Errorf("unknown status %q; use one or more of %s, comma-separated", f, strings.Join(ReportStatuses, ", "))
		case !slices.Contains(out, f):
			out = append(out, f)
		}
	}
	return out, nil
}

// Report calls fn with every audience row of campaign id whose status is one of statuses (none: every
// row): the planned recipients first, then the excluded rows. The rows are streamed from one statement
// (one snapshot) as Postgres sends them, never gathered, so a campaign of millions reports in constant
// memory; they come in no particular order, since sorting a million rows would cost more than it gives.
// An error from fn stops the report and is returned as it is. An unknown id is an ErrNotFound.
func (s *Store) Report(ctx context.Context, id int64, statuses []string, fn func(ReportRow) error) error {
	var exists bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM campaigns WHERE id = $1)`, id).Scan(&exists); err != nil {
		return fmt.Errorf("report campaign %d: %w", id, err)
	}
	if !exists {
		return fmt.Errorf("%w: no campaign has id %d (campaignctl status lists them)", ErrNotFound, id)
	}
	var planned []string
	excluded := len(statuses) == 0
	for _, st := range statuses {
		if st == StatusExcluded {
			excluded = true
		} else {
			planned = append(planned, st)
		}
	}
	var parts []string
	if len(statuses) == 0 || len(planned) > 0 {
		filter := ""
		if len(planned) > 0 {
			filter = ` AND r.status = ANY($2::text[])`
		}
		// A failover send names the fallback in its reason (worker: "sent through X, the fallback (...)").
		parts = append(parts, `SELECT r.user_id, r.address, r.status, coalesce(r.reason, r.last_error, ''), coalesce(r.code, ''),
			coalesce(r.provider, substring(r.reason from '^sent through (\S+), the fallback'), ''), coalesce(r.provider_message_id, ''),
			r.attempts, coalesce(r.delivery, ''), r.sent_at,
			CASE WHEN r.delivery = `+quoteLiteral(DeliveryDelivered)+` THEN r.delivery_at END, coalesce(r.delivery_error, '')
			FROM campaign_recipients r WHERE r.campaign_id = $1`+filter)
	}
	if excluded {
		parts = append(parts, `SELECT coalesce(e.user_id, ''), coalesce(e.address, ''), `+quoteLiteral(StatusExcluded)+`, e.reason, '',
			'', '', 0, '', NULL::timestamptz, NULL::timestamptz, ''
			FROM campaign_exclusions e WHERE e.campaign_id = $1`)
	}
	args := []any{id}
	if len(planned) > 0 {
		args = append(args, planned)
	}
	rows, err := s.pool.Query(ctx, strings.Join(parts, "\nUNION ALL\n"), args...)
	if err != nil {
		return fmt.Errorf("report campaign %d: %w", id, err)
	}
	defer rows.Close()
	var r ReportRow
	for rows.Next() {
		r.SentAt, r.DeliveredAt = nil, nil
		if err := rows.Scan(&r.UserID, &r.Address, &r.Status, &r.Reason, &r.Code, &r.Provider, &r.ProviderMessageID,
			&r.Attempts, &r.Delivery, &r.SentAt, &r.DeliveredAt, &r.DeliveryError); err != nil {
			return fmt.Errorf("report campaign %d: %w", id, err)
		}
		if err := fn(r); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		if errors.Is(err, context.Canceled) {
			return err
		}
		return fmt.Errorf("report campaign %d: %w", id, err)
	}
	return nil
}
