package iys

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Origins of a consent change in the history.
const (
	OriginPull     = "pull"
	OriginReverify = "reverify"
)

// Sources of iys_sync_state besides SourceImport: one cursor per pull source, and the re-verification.
const (
	SourcePullHS   = "pull:" + PullHS
	SourcePullIYS  = "pull:" + PullIYS
	SourceReverify = "reverify"
)

// ApplyChanges records consents the İYS API reported, in tx: every one is appended to the history, and
// each becomes the current consent of its key unless a later decision is stored already (İYS keeps the
// latest). It returns how many current consents changed.
func ApplyChanges(ctx context.Context, tx pgx.Tx, brand string, rs []Record, origin string) (int64, error) {
	if len(rs) == 0 {
		return 0, nil
	}
	n := len(rs)
	rec, typ, rtype, st, src, txn := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	date := make([]time.Time, n)
	for i, r := range rs {
		rec[i], typ[i], rtype[i], st[i], src[i], txn[i] = r.Recipient, r.Type, r.RecipientType, r.Status, r.Source, r.TransactionID
		date[i] = r.ConsentDate
		if date[i].IsZero() {
			date[i] = r.CreationDate // a TACIR record may come without a consent date
		}
	}
	// After any refusal under way has committed, so that the statement below reads it (takeConsentsTurn).
	if err := takeConsentsTurn(ctx, tx); err != nil {
		return 0, fmt.Errorf("apply consent changes: %w", err)
	}
	var changed int64
	err := tx.QueryRow(ctx, `
		WITH c AS (
			SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::timestamptz[], $7::text[])
				WITH ORDINALITY AS c(recipient, type, recipient_type, status, source, consent_date, transaction_id, ord)
		), hist AS (
			INSERT INTO iys_consent_history (recipient, type, recipient_type, brand_code, status, source, consent_date, transaction_id, origin)
			SELECT recipient, type, recipient_type, $9, status, source, consent_date, NULLIF(transaction_id, ''), $8 FROM c ORDER BY ord
		), l AS (
			SELECT DISTINCT ON (recipient, type, recipient_type) * FROM c
			ORDER BY recipient, type, recipient_type, consent_date DESC, ord DESC
		), latest AS (
			-- An ONAY given before a refusal of its address is stored as that refusal's RET (afterRefusalSQL).
			SELECT l.recipient, l.type, l.recipient_type, `+afterRefusalSQL+`, l.transaction_id,
				f.id AS refusal_id, l.status = 'ONAY' AND f.refused_at > l.consent_date AS overruled
			FROM l LEFT JOIN `+refusedSQL+` f ON f.recipient = l.recipient AND f.type = l.type
		), requeued AS (
			-- İYS holds an ONAY older than a refusal made here: that refusal's RET has not reached İYS (it
			-- found the consent RET here already and queued nothing, say), so it is queued now, unless a RET
			-- at least as new is on its way or registered. A RET waiting with an older date takes this one's.
			-- It is due two days after the refusal (calendar days: never later than the law's business
			-- days), however late this pull found it: a refusal a week old is overdue at once.
			INSERT INTO iys_outbox (refusal_id, brand_code, recipient, type, recipient_type, source, consent_date, due_at)
			SELECT refusal_id, $9, recipient, type, recipient_type, source, consent_date, consent_date + interval '2 days' FROM latest
			WHERE overruled AND NOT EXISTS (SELECT 1 FROM iys_outbox x
				WHERE x.brand_code = $9 AND x.recipient = latest.recipient AND x.type = latest.type
				  AND x.recipient_type = latest.recipient_type AND x.state <> 'refused' AND x.consent_date >= latest.consent_date)
			`+outboxOneWaitingSQL+`
		), up AS (
			INSERT INTO iys_consents AS k (recipient, type, recipient_type, brand_code, status, source, consent_date, transaction_id, synced_at, updated_at)
			SELECT recipient, type, recipient_type, $9, status, source, consent_date, NULLIF(transaction_id, ''), now(), now() FROM latest
			ON CONFLICT (recipient, type, recipient_type, brand_code) DO UPDATE SET
				status = EXCLUDED.status, source = EXCLUDED.source, consent_date = EXCLUDED.consent_date,
				transaction_id = EXCLUDED.transaction_id, synced_at = now(), updated_at = now()
			-- İYS keeps the latest decision. Its dates are whole seconds, and the two pull sources (the
			-- brand's, then the citizens') come one after the other, so the order of two decisions of one
			-- second is not known here: a pulled ONAY of the same second as a stored RET does not replace
			-- it (the side of a refusal, which the daily re-verification, asking İYS itself, corrects).
			WHERE EXCLUDED.consent_date > k.consent_date
			   OR EXCLUDED.consent_date = k.consent_date AND ($8 <> '`+OriginPull+`' OR EXCLUDED.status = 'RET' OR k.status <> 'RET')
			RETURNING 1
		)
		SELECT count(*) FROM up`, rec, typ, rtype, st, src, date, txn, origin, brand).Scan(&changed)
	if err != nil {
		return 0, fmt.Errorf("record İYS consents: %w", err)
	}
	return changed, nil
}

// Cursor returns the stored pull cursor of source for brand ("" when none).
func Cursor(ctx context.Context, db *pgxpool.Pool, brand, source string) (string, error) {
	var c string
	err := db.QueryRow(ctx, `SELECT cursor FROM iys_sync_state WHERE brand_code = $1 AND source = $2`, brand, source).Scan(&c)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("İYS pull cursor: %w", err)
	}
	return c, nil
}

func saveCursor(ctx context.Context, tx pgx.Tx, brand, source, cursor string) error {
	_, err := tx.Exec(ctx, `INSERT INTO iys_sync_state (brand_code, source, cursor) VALUES ($1, $2, $3)
		ON CONFLICT (brand_code, source) DO UPDATE SET cursor = EXCLUDED.cursor`, brand, source, cursor)
	if err != nil {
		return fmt.Errorf("İYS pull cursor: %w", err)
	}
	return nil
}

// SyncReport is what a sync did.
type SyncReport struct {
	// Changes counts the changes received per pull source (HS, IYS); Applied how many current consents
	// they changed.
	Changes map[string]int `json:"changes"`
	Applied int64          `json:"applied"`
	// Reverified is how many stored consents a re-verification asked İYS about, and Corrected how many
	// İYS answered differently.
	Reverified int   `json:"reverified,omitempty"`
	Corrected  int64 `json:"corrected,omitempty"`
	// UpToDateAt is what the consents are up to date with: İYS as it was then. A pull leaves out what İYS
	// recorded in its last hour (PullLag); a re-verification asks İYS itself, as of when it began.
	UpToDateAt time.Time `json:"up_to_date_at"`
}

// Sync pulls the consent changes of both sources (the brand's own and the citizens' in İYS) from where
// the last sync stopped, storing each page with its cursor in one transaction, so a sync that fails half
// way resumes without losing or repeating anything. When both pulls reach the end, the consents count as
// up to date (launches check how long ago that was). Syncs of one brand take turns: one started while
// another runs waits for it, and then pulls from where it stopped.
func Sync(ctx context.Context, db *pgxpool.Pool, c *Client) (SyncReport, error) {
	rep := SyncReport{Changes: map[string]int{}}
	release, err := runAlone(ctx, db, c, "sync")
	if err != nil {
		return rep, err
	}
	defer release()
	brand := c.BrandCode()
	for _, src := range []struct{ pull, state string }{{PullHS, SourcePullHS}, {PullIYS, SourcePullIYS}} {
		// What İYS recorded up to PullLag before this pull began is in it; what came later may not be.
		began := time.Now()
		after, err := Cursor(ctx, db, brand, src.state)
		if err != nil {
			return rep, err
		}
		err = c.PullAll(ctx, src.pull, after, func(p Page) error {
			return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
				n, err := ApplyChanges(ctx, tx, brand, p.Changes, OriginPull)
				if err != nil {
					return err
				}
				rep.Changes[src.pull] += len(p.Changes)
				rep.Applied += n
				return saveCursor(ctx, tx, brand, src.state, p.After)
			})
		})
		if err != nil {
			return rep, fmt.Errorf("İYS pull of source %s: %w", src.pull, err)
		}
		if err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			return MarkSynced(ctx, tx, brand, src.state, PullLag+time.Since(began))
		}); err != nil {
			return rep, err
		}
		if rep.UpToDateAt.IsZero() {
			rep.UpToDateAt = began.Add(-PullLag)
		}
	}
	return rep, nil
}

// Reverify asks İYS for the current status of every stored consent of type typ and recipientType
// (multi-status, in the API's chunks) and records the answers that differ. It is the full pass that
// catches anything a pull missed; it takes about a second per 10,000 consents at İYS's rate limit.
func Reverify(ctx context.Context, db *pgxpool.Pool, c *Client, typ, recipientType string) (SyncReport, error) {
	rep := SyncReport{Changes: map[string]int{}}
	// İYS's answers are as of when each was asked: the first when the pass began.
	began := time.Now()
	brand := c.BrandCode()
	rows, err := db.Query(ctx, `SELECT recipient, status, consent_date FROM iys_consents WHERE type = $1 AND recipient_type = $2 AND brand_code = $3
		ORDER BY recipient`, typ, recipientType, brand)
	if err != nil {
		return rep, fmt.Errorf("re-verify: %w", err)
	}
	type held struct {
		status string
		date   time.Time
	}
	stored := map[string]held{}
	var recipients []string
	for rows.Next() {
		var r string
		var h held
		if err := rows.Scan(&r, &h.status, &h.date); err != nil {
			rows.Close()
			return rep, fmt.Errorf("re-verify: %w", err)
		}
		stored[r] = h
		recipients = append(recipients, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return rep, fmt.Errorf("re-verify: %w", err)
	}
	const chunk = 10 * MaxMultiStatus
	for start := 0; start < len(recipients); start += chunk {
		part := recipients[start:min(start+chunk, len(recipients))]
		got, err := c.MultiStatus(ctx, recipientType, typ, part)
		if err != nil {
			return rep, fmt.Errorf("re-verify: %w", err)
		}
		rep.Reverified += len(part)
		// Multi-status names only the approved recipients: anyone else is RET or unknown to İYS, and may
		// not be sent a commercial message either way. Its answers carry no date. One that differs from what
		// is stored was decided after it: it is dated just after it, not now, so that a decision a later pull
		// brings, dated between the two, still wins.
		var differ []Record
		for _, r := range part {
			want := StatusRejected
			if _, ok := got[r]; ok {
				want = StatusApproved
			}
			if h := stored[r]; want != h.status {
				differ = append(differ, Record{Recipient: r, Type: typ, RecipientType: recipientType, Status: want,
					Source: "IYS_REVERIFY", ConsentDate: h.date.Add(time.Millisecond)})
			}
		}
		if err := datePendingRefusals(ctx, db, brand, typ, recipientType, differ); err != nil {
			return rep, err
		}
		if len(differ) > 0 {
			err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
				n, err := ApplyChanges(ctx, tx, brand, differ, OriginReverify)
				rep.Corrected += n
				return err
			})
			if err != nil {
				return rep, err
			}
		}
	}
	if err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		return MarkSynced(ctx, tx, brand, SourceReverify, time.Since(began))
	}); err != nil {
		return rep, err
	}
	rep.UpToDateAt = began
	return rep, nil
}

// HistEntry is one change in a consent's history.
type HistEntry struct {
	Status        string    `json:"status"`
	Source        string    `json:"source"`
	ConsentDate   time.Time `json:"consent_date"`
	TransactionID string    `json:"transaction_id,omitempty"`
	Origin        string    `json:"origin"`
	RecordedAt    time.Time `json:"recorded_at"`
}

// History returns up to limit of the latest changes of one consent of brand, newest first.
func History(ctx context.Context, db *pgxpool.Pool, brand, recipient, typ, recipientType string, limit int) ([]HistEntry, error) {
	rows, err := db.Query(ctx, `SELECT status, source, consent_date, coalesce(transaction_id, ''), origin, recorded_at
		FROM iys_consent_history WHERE recipient = $1 AND type = $2 AND recipient_type = $3 AND brand_code = $5
		ORDER BY id DESC LIMIT $4`, recipient, typ, recipientType, limit, brand)
	if err != nil {
		return nil, fmt.Errorf("consent history: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (HistEntry, error) {
		var h HistEntry
		err := row.Scan(&h.Status, &h.Source, &h.ConsentDate, &h.TransactionID, &h.Origin, &h.RecordedAt)
		return h, err
	})
	if err != nil {
		return nil, fmt.Errorf("consent history: %w", err)
	}
	if out == nil {
		out = []HistEntry{}
	}
	return out, nil
}

// datePendingRefusals dates before its refusal an ONAY of differ (re-verification answers) for an address
// refused here whose RET İYS has not registered yet (no RET of that consent at least as new is accepted
// or known to İYS in the outbox): İYS still says ONAY because the refusal has not reached it, not because
// the person gave consent again, and the refusal stands (ApplyChanges stores it as the refusal's RET, and
// queues the RET if none is on its way). Once İYS holds the refusal's RET, an ONAY it reports is newer.
func datePendingRefusals(ctx context.Context, db *pgxpool.Pool, brand, typ, recipientType string, differ []Record) error {
	var onay []string
	at := map[string]int{}
	for i, r := range differ {
		if r.Status == StatusApproved {
			onay = append(onay, r.Recipient)
			at[r.Recipient] = i
		}
	}
	if len(onay) == 0 {
		return nil
	}
	rows, err := db.Query(ctx, `
		SELECT f.recipient, f.refused_at FROM (
			SELECT recipient, max(refused_at) AS refused_at FROM refusals WHERE type = $1 AND recipient = ANY($4) GROUP BY recipient) f
		WHERE NOT EXISTS (SELECT 1 FROM iys_outbox o WHERE o.recipient = f.recipient AND o.type = $1 AND o.recipient_type = $2
			AND o.brand_code IN ('', $3) AND o.state IN ('accepted', 'already') AND o.consent_date >= f.refused_at)`,
		typ, recipientType, brand, onay)
	if err != nil {
		return fmt.Errorf("re-verify: refusals not in İYS yet: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var r string
		var refused time.Time
		if err := rows.Scan(&r, &refused); err != nil {
			return fmt.Errorf("re-verify: refusals not in İYS yet: %w", err)
		}
		differ[at[r]].ConsentDate = refused.Add(-time.Millisecond)
	}
	return rows.Err()
}
