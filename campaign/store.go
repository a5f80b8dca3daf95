package campaign

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/internal/pgtext"
)

// Store reads and writes campaigns and their recipients. It is safe for concurrent use.
type Store struct {
	pool *pgxpool.Pool
}

// NewStore returns a Store on pool.
func NewStore(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

var campaignColumns = `id, name, channel, state, message, subject, coalesce(code_pool, ''), rate, audience_sql,
	audience, eligible, excluded, batch_size, batches, created_at, started_at, finished_at,
	start_at, send_window, window_zone, frequency_cap_seconds, html, template_id, recipient_type, transactional,
	allow_stale_consent, brand_code, max_segments, state_since, coalesce(max_consent_age_seconds, 0), privileged_audience, coalesce(audience_database, ''),
	(SELECT CASE WHEN max_consent_age_seconds > 0 THEN array[extract(epoch FROM a.at), extract(epoch FROM now() - a.at)] END
	 FROM (SELECT ` + consentSyncedAtSQL("campaigns.brand_code") + ` AS at) a),
	(SELECT coalesce(max(frequency_cap_seconds), 0) FROM campaigns l WHERE l.state IN (` + sqlStatePlanning + `, ` + sqlStateScheduled + `, ` + sqlStateRunning + `, '` + string(StatePaused) + `'))`

func scanCampaign(row pgx.Row) (*Campaign, error) {
	var c Campaign
	var excluded []byte
	var window, zone string
	var capSeconds, keptSeconds, ageSeconds int64
	var synced []*float64
	err := row.Scan(&c.ID, &c.Name, &c.Channel, &c.State, &c.Message, &c.Subject, &c.CodePool, &c.Rate, &c.AudienceSQL,
		&c.Audience, &c.Eligible, &excluded, &c.BatchSize, &c.Batches, &c.CreatedAt, &c.StartedAt, &c.FinishedAt,
		&c.StartAt, &window, &zone, &capSeconds, &c.HTML, &c.TemplateID, &c.RecipientType, &c.Transactional,
		&c.AllowStaleConsent, &c.BrandCode, &c.MaxSegments, &c.StateSince, &ageSeconds, &c.PrivilegedAudience, &c.AudienceDatabase, &synced, &keptSeconds)
	if err != nil {
		return nil, err
	}
	c.FrequencyCap = time.Duration(capSeconds) * time.Second
	c.MarksJudgedFor = time.Duration(keptSeconds) * time.Second
	c.MaxConsentAge = time.Duration(ageSeconds) * time.Second
	if len(synced) == 2 && synced[0] != nil && synced[1] != nil {
		at := time.UnixMicro(int64(*synced[0] * 1e6))
		c.ConsentSyncedAt, c.consentAge = &at, time.Duration(*synced[1]*float64(time.Second))
	}
	loc, err := time.LoadLocation(zone)
	if err != nil {
		return nil, fmt.Errorf("campaign %d: window zone %q: %w", c.ID, zone, err)
	}
	if c.Window, err = ParseWindow(window, loc); err != nil {
		return nil, fmt.Errorf("campaign %d: %w", c.ID, err)
	}
	c.Excluded = map[string]int64{}
	if err := json.Unmarshal(excluded, &c.Excluded); err != nil {
		return nil, fmt.Errorf("campaign %d: excluded: %w", c.ID, err)
	}
	return &c, nil
}

// Get returns the campaign with id, or ErrNotFound.
func (s *Store) Get(ctx context.Context, id int64) (*Campaign, error) {
	c, err := scanCampaign(s.pool.QueryRow(ctx, `SELECT `+campaignColumns+` FROM campaigns WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: no campaign has id %d (campaignctl status lists them)", ErrNotFound, id)
	}
	if err != nil {
		return nil, fmt.Errorf("get campaign %d: %w", id, err)
	}
	return c, nil
}

// List returns every campaign, newest first.
func (s *Store) List(ctx context.Context) ([]*Campaign, error) {
	return s.list(ctx, `SELECT `+campaignColumns+` FROM campaigns ORDER BY id DESC`)
}

// ListIn returns the campaigns in one of states, newest first.
func (s *Store) ListIn(ctx context.Context, states ...State) ([]*Campaign, error) {
	return s.list(ctx, `SELECT `+campaignColumns+` FROM campaigns WHERE state = ANY($1) ORDER BY id DESC`, states)
}

func (s *Store) list(ctx context.Context, sql string, args ...any) ([]*Campaign, error) {
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("list campaigns: %w", err)
	}
	defer rows.Close()
	var out []*Campaign
	for rows.Next() {
		c, err := scanCampaign(rows)
		if err != nil {
			return nil, fmt.Errorf("list campaigns: %w", err)
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// Counts returns how many of the campaign's recipients are in each status.
func (s *Store) Counts(ctx context.Context, id int64) (Counts, error) {
	var c Counts
	rows, err := s.pool.Query(ctx, `SELECT status, count(*), coalesce(sum(segments), 0) FROM campaign_recipients WHERE campaign_id = $1 GROUP BY status`, id)
	if err != nil {
		return c, fmt.Errorf("count recipients: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var st string
		var n, segments int64
		if err := rows.Scan(&st, &n, &segments); err != nil {
			return c, fmt.Errorf("count recipients: %w", err)
		}
		c.Planned += n
		switch st {
		case StatusPending:
			c.Pending = n
		case StatusSent:
			c.Sent, c.Segments = n, segments
		case StatusFailed:
			c.Failed = n
		case StatusSkipped:
			c.Skipped = n
		case StatusUnknown:
			c.Unknown = n
		}
	}
	return c, rows.Err()
}

// PendingBatches returns the batches of campaign id that still have pending recipients; with
// onlyNotEnqueued, only the batches never enqueued (right after a launch: all of them). Only the batches
// not yet settled are looked at, each through the (campaign, batch) index up to its first pending row
// (a subquery per batch, which the planner cannot turn into a join over the campaign's million rows).
func (s *Store) PendingBatches(ctx context.Context, id int64, onlyNotEnqueued bool) ([]int, error) {
	query := `SELECT b.batch FROM campaign_batches b WHERE b.campaign_id = $1 AND NOT b.settled AND ` + batchHasPending("b") + ` ORDER BY b.batch`
	if onlyNotEnqueued {
		query = `SELECT batch FROM campaign_batches WHERE campaign_id = $1 AND enqueued_at IS NULL ORDER BY batch`
	}
	rows, err := s.pool.Query(ctx, query, id)
	if err != nil {
		return nil, fmt.Errorf("pending batches: %w", err)
	}
	batches, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, fmt.Errorf("pending batches: %w", err)
	}
	return batches, nil
}

// MarkEnqueued records that batches were handed to the queue.
func (s *Store) MarkEnqueued(ctx context.Context, id int64, batches []int) error {
	_, err := s.pool.Exec(ctx, `UPDATE campaign_batches SET enqueued_at = now()
		WHERE campaign_id = $1 AND batch = ANY($2) AND enqueued_at IS NULL`, id, batches)
	if err != nil {
		return fmt.Errorf("mark enqueued: %w", err)
	}
	return nil
}

// LoadBatch returns the still-pending recipients of one batch.
func (s *Store) LoadBatch(ctx context.Context, campaignID int64, batch int) ([]Recipient, error) {
	rows, err := s.pool.Query(ctx, `SELECT user_id, address, vars, coalesce(code, ''), attempts
		FROM campaign_recipients WHERE campaign_id = $1 AND batch = $2 AND status = `+sqlPending+`
		ORDER BY user_id`, campaignID, batch)
	if err != nil {
		return nil, fmt.Errorf("load batch %d: %w", batch, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Recipient, error) {
		var r Recipient
		err := row.Scan(&r.UserID, &r.Address, &r.Vars, &r.Code, &r.Attempts)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("load batch %d: %w", batch, err)
	}
	return out, nil
}

// Record writes outcomes of recipients of the lease's batch (lease.Batch) in one statement; an outcome of a
// user of another batch changes nothing. Only recipients still pending change, so recording the same
// outcome twice (a redelivered batch) is harmless; codes of recipients that were never sent (failed,
// skipped) go back to the pool; every transition is appended to send_log. An outcome with status pending
// records a transient failure (attempts and last error) and leaves the recipient pending. A recipient
// whose receipt arrived before its outcome is recorded sent, whatever the outcome says (see
// RecordDeliveries). With a lease (Token not empty), the run's chunk in hand becomes inHand in the same
// statement: the users whose fate the run could not settle (it stopped before reading their claims), which
// stay leased until the sweeper reads their claims; nil when the run has nothing in flight. It returns how
// many recipients actually moved to each status, so counters can be advanced exactly once.
func (s *Store) Record(ctx context.Context, campaignID int64, outcomes []Outcome, lease Lease, inHand []string) (map[string]int64, error) {
	moved := map[string]int64{}
	if len(outcomes) == 0 && lease.Token == "" {
		return moved, nil
	}
	if inHand == nil {
		inHand = []string{}
	}
	n := len(outcomes)
	users, statuses, reasons, ids, provs := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	segs := make([]int32, n)
	keyed, bad := make([]bool, n), make([]bool, n)
	cStatus, cSource, cTxn := make([]string, n), make([]string, n), make([]string, n)
	cDate, cSynced, sentAt := make([]pgtype.Timestamptz, n), make([]pgtype.Timestamptz, n), make([]pgtype.Timestamptz, n)
	for i, o := range outcomes {
		sentAt[i] = pgtype.Timestamptz{Time: o.SentAt, Valid: !o.SentAt.IsZero()}
		users[i], statuses[i], reasons[i], ids[i], segs[i], keyed[i] = o.UserID, o.Status, o.Reason, o.MessageID, int32(o.Segments), o.ReceiptKeyed
		bad[i] = o.BadAddress && o.Status == StatusFailed
		// The reason and the message ID come from the provider's answer: a NUL or invalid UTF-8 in one of
		// them would fail the statement, the chunk's other outcomes with it, on every retry.
		reasons[i], ids[i], provs[i] = pgtext.Clean(o.Reason), pgtext.Clean(o.MessageID), o.Provider
		if c := o.Snapshot; c.Status != "" {
			cStatus[i], cSource[i], cTxn[i] = c.Status, c.Source, c.TransactionID
			cDate[i] = pgtype.Timestamptz{Time: c.Date, Valid: !c.Date.IsZero()}
			cSynced[i] = pgtype.Timestamptz{Time: c.SyncedAt, Valid: !c.SyncedAt.IsZero()}
		}
	}
	// The outcomes' commit does not wait for its WAL to reach the disk (synchronous_commit off for this
	// transaction only): on this path a flush costs more CPU than the statement's hundred rows. What a
	// Postgres crash could take back is the last fraction of a second of outcomes, and nothing is lost with
	// them: each is in its recipient's claim in Redis, which the next run of the batch reads (the rows are
	// still pending, and their users still in the batch's chunk in hand, whose lease was committed
	// durably); the next durable commit of any session (the next lease) writes them to disk anyway. An
	// outcome that is in no claim (Durable) is committed durably, with the others of its statement. See
	// docs/operations.md, "Durability of outcomes".
	async := true
	for i := range outcomes {
		async = async && !outcomes[i].Durable
	}
	b := &pgx.Batch{}
	if async {
		b.Queue(`SELECT set_config('synchronous_commit', 'off', true)`)
	}
	b.Queue(`
		WITH o AS (
			SELECT * FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::int[],
					$9::text[], $10::text[], $11::timestamptz[], $12::text[], $13::timestamptz[], $15::bool[], $16::text[], $17::bool[], $18::timestamptz[])
				AS o(user_id, status, reason, msgid, segments, c_status, c_source, c_date, c_txn, c_synced, keyed, provider, bad, sent_at)
		), upd AS (
			-- Only rows of the lease's batch: the (campaign, batch) index finds them whatever the
			-- planner believes about the campaign's size.
			-- A receipt that came in while the row was pending (r.delivery set) proves the provider accepted
			-- the message, whatever the worker could tell: such a row becomes sent, keeps the receipt's
			-- message ID and its code, and what the worker saw stays in last_error.
			-- A row recorded unknown meanwhile (its run's lease ran out while the run was stopped or cut
			-- off, and Redis lost the claims that held its answers) whose run comes back with the provider's
			-- acceptance is sent: that answer proves it, as a receipt does (RecordDeliveries), and resume
			-- --resend-unknown must not send it again. Its attempt was counted when it was recorded unknown.
			UPDATE campaign_recipients r SET
				-- A recipient once unknown (pending again for a resend) whose resend does not go (a cancel, the
				-- frequency cap, a refusal since, a permanent failure) stays unknown: its first message may
				-- have gone out, and skipped or failed would say it was never sent.
				status = CASE WHEN r.delivery IS NOT NULL THEN `+sqlSent+`
					WHEN o.status IN (`+sqlSkipped+`, `+sqlFailed+`) AND `+everUnknown+` THEN `+sqlUnknown+`
					ELSE o.status END,
				reason = CASE WHEN r.status = `+sqlUnknown+` THEN `+sqlLateAnswer+`
					WHEN r.delivery IS NULL AND o.status = `+sqlSkipped+` AND o.reason = `+sqlReasonCancelled+` AND `+everUnknown+` THEN `+sqlCancelledUnsure+`
					WHEN r.delivery IS NULL AND o.status IN (`+sqlSkipped+`, `+sqlFailed+`) AND `+everUnknown+`
					THEN 'not sent again (' || coalesce(NULLIF(o.reason, ''), o.status) || ')' || `+sqlResendNotSentTail+`
					WHEN r.delivery IS NOT NULL AND o.status <> `+sqlSent+`
					THEN `+acceptedBecause("r.delivery_via", "r.delivery")+` ELSE NULLIF(o.reason, '') END,
				last_error = CASE WHEN r.status = `+sqlUnknown+` THEN coalesce(r.last_error, r.reason)
					WHEN o.status IN (`+sqlFailed+`, `+sqlUnknown+`) OR (r.delivery IS NOT NULL AND o.status <> `+sqlSent+`)
						OR (o.status = `+sqlSkipped+` AND `+everUnknown+`)
					THEN NULLIF(o.reason, '') END,
				provider_message_id = coalesce(NULLIF(o.msgid, ''), r.provider_message_id),
				provider = coalesce(NULLIF(o.provider, ''), r.provider),
				segments = NULLIF(o.segments, 0),
				attempts = r.attempts + CASE WHEN r.status = `+sqlPending+` AND o.status IN (`+sqlSent+`, `+sqlFailed+`, `+sqlUnknown+`, `+sqlPending+`) THEN 1 ELSE 0 END,
				-- A recipient that was ever unknown (resent since) may hold a code that reached them: it keeps it.
				code = CASE WHEN o.status IN (`+sqlFailed+`, `+sqlSkipped+`) AND r.delivery IS NULL AND NOT `+everUnknown+` THEN NULL ELSE r.code END,
				code_id = CASE WHEN o.status IN (`+sqlFailed+`, `+sqlSkipped+`) AND r.delivery IS NULL AND NOT `+everUnknown+` THEN NULL ELSE r.code_id END,
				-- When its request went out (a receipt cannot come before it), or, not known, now.
				sent_at = CASE WHEN o.status = `+sqlSent+` OR r.delivery IS NOT NULL THEN coalesce(o.sent_at, now()) END,
				-- Set here rather than by the trigger of migration 0013 (a second update of the row).
				ever_unknown = r.ever_unknown OR (o.status = `+sqlUnknown+` AND r.delivery IS NULL),
				updated_at = now()
			FROM o
			WHERE r.campaign_id = $1 AND r.batch = $7 AND r.user_id = o.user_id
			  AND (r.status = `+sqlPending+` OR r.status = `+sqlUnknown+` AND o.status = `+sqlSent+`)
			  AND (o.status <> `+sqlPending+` OR EXISTS (SELECT 1 FROM campaign_batches b
				WHERE b.campaign_id = $1 AND b.batch = $7 AND b.lease_token = $8))
			RETURNING r.user_id, r.status, r.reason, r.provider_message_id, r.code_id AS kept,
				o.c_status, o.c_source, o.c_date, o.c_txn, o.c_synced,
				-- The message ID the row keeps is the outcome's (not a receipt's that came first).
				o.keyed AND r.provider_message_id = o.msgid AS keyed,
				r.address, o.bad, r.reason = `+sqlLateAnswer+` AS late
		), freed AS (
			-- One update of the batch row (two in one statement would see only one): the run's chunk in
			-- hand, and the suspects (LeaseChunk) that are settled now.
			UPDATE campaign_batches SET
				lease_users = CASE WHEN lease_token = $8 THEN $14::text[] ELSE lease_users END,
				suspect_users = CASE WHEN suspect_users = '{}' THEN suspect_users
					ELSE array(SELECT u FROM unnest(suspect_users) AS u
						WHERE u NOT IN (SELECT user_id FROM upd WHERE status <> `+sqlPending+`)) END
			WHERE campaign_id = $1 AND batch = $7
			  AND (lease_token = $8 AND lease_users <> $14::text[] OR suspect_users <> '{}')
		), log AS (
			INSERT INTO send_log (campaign_id, user_id, status, reason, provider_message_id, channel, template_hash,
				consent_status, consent_source, consent_date, consent_txn, consent_synced_at, receipt_keyed)
			-- The campaign's columns as two subqueries, each read once for the chunk (a join read the row
			-- again for every recipient).
			SELECT $1, upd.user_id, upd.status, upd.reason, upd.provider_message_id,
				(SELECT channel FROM campaigns WHERE id = $1), (SELECT template_hash FROM campaigns WHERE id = $1),
				NULLIF(upd.c_status, ''), NULLIF(upd.c_source, ''), upd.c_date, NULLIF(upd.c_txn, ''), upd.c_synced,
				coalesce(upd.keyed, false)
			FROM upd
		), invalid AS (
			-- Addresses the provider condemned (an unregistered push token), with the failures that say so:
			-- later launches exclude them. Also when the row stays unknown (a resend of a recipient once
			-- unknown, refused for its address): the address is condemned all the same.
			INSERT INTO invalid_addresses (channel, address, reason)
			SELECT (SELECT channel FROM campaigns WHERE id = $1), upd.address, upd.reason
			FROM upd WHERE upd.bad AND upd.status IN (`+sqlFailed+`, `+sqlUnknown+`)
			ON CONFLICT (channel, address) DO UPDATE SET reason = EXCLUDED.reason, at = now()
		), released AS (
			-- The statement's snapshot still shows the rows as they were: their codes before the update.
			INSERT INTO released_codes (code_id, pool)
			SELECT was.code_id, p.pool
			FROM upd
			JOIN campaign_recipients was ON was.campaign_id = $1 AND was.user_id = upd.user_id
			JOIN promo_codes p ON p.id = was.code_id
			WHERE upd.status IN (`+sqlFailed+`, `+sqlSkipped+`) AND upd.kept IS NULL
			ON CONFLICT (code_id) DO NOTHING
		)
		SELECT status, count(*) FROM upd GROUP BY status
		UNION ALL
		-- A late answer moves its recipient from unknown.
		SELECT `+sqlUnknown+`, -count(*) FROM upd WHERE late HAVING count(*) > 0`, campaignID, users, statuses, reasons, ids, segs, lease.Batch, lease.Token,
		cStatus, cSource, cDate, cTxn, cSynced, inHand, keyed, provs, bad, sentAt)
	br := s.pool.SendBatch(ctx, b)
	err := readMoved(br, async, moved)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("record outcomes: %w", err)
	}
	return moved, nil
}

// SecondSend is the audit reason of a message the provider accepted for a recipient already sent under
// another message ID (AuditSecondSends).
const SecondSend = "a second message: the provider accepted it for a recipient already sent (a late answer of a stopped run, after a resend)"

// AuditSecondSends appends to the audit the sent outcomes of outs (those with a message ID) whose
// recipient Record found already sent under another message ID, and not audited under theirs yet: a
// second message the provider accepted, which the recipient's row, keeping the first, does not show. It
// returns how many it audited. It is for the outcomes Record did not apply (it reads each one's row).
func (s *Store) AuditSecondSends(ctx context.Context, campaignID int64, outs []Outcome) (int64, error) {
	var users, ids, provs []string
	for _, o := range outs {
		if o.Status == StatusSent && o.MessageID != "" {
			users, ids, provs = append(users, o.UserID), append(ids, pgtext.Clean(o.MessageID)), append(provs, o.Provider)
		}
	}
	if len(users) == 0 {
		return 0, nil
	}
	tag, err := s.pool.Exec(ctx, `
		WITH other AS MATERIALIZED (
			SELECT o.user_id, o.msgid, o.provider
			FROM unnest($2::text[], $3::text[], $4::text[]) AS o(user_id, msgid, provider)
			JOIN campaign_recipients r ON r.campaign_id = $1 AND r.user_id = o.user_id
			WHERE r.status = `+sqlSent+` AND r.provider_message_id IS DISTINCT FROM o.msgid
		)
		INSERT INTO send_log (campaign_id, user_id, status, reason, provider_message_id, channel, template_hash)
		SELECT $1, other.user_id, `+sqlSent+`, `+quoteLiteral(SecondSend)+`, other.msgid,
			(SELECT channel FROM campaigns WHERE id = $1), (SELECT template_hash FROM campaigns WHERE id = $1)
		FROM other
		WHERE NOT EXISTS (SELECT 1 FROM send_log l WHERE l.campaign_id = $1 AND l.user_id = other.user_id
			AND l.provider_message_id = other.msgid)`, campaignID, users, ids, provs)
	if err != nil {
		return 0, fmt.Errorf("audit second messages: %w", err)
	}
	return tag.RowsAffected(), nil
}

// readMoved reads Record's batch: the setting (when async), then how many recipients moved to each status.
func readMoved(br pgx.BatchResults, async bool, moved map[string]int64) error {
	if async {
		if _, err := br.Exec(); err != nil {
			return err
		}
	}
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var st string
		var n int64
		if err := rows.Scan(&st, &n); err != nil {
			return err
		}
		moved[st] += n
	}
	return rows.Err()
}

// Unverifiable is the reason of a recipient a run that took its chunk over recorded unknown because Redis
// lost the claim that said what became of its message: the run that held the chunk (under the epoch Redis
// lost) may have sent it, and may still be waiting for its answer.
const Unverifiable = "Redis lost its data while a worker that has since stopped was sending this chunk; the message may have been sent"

// LateAnswer is the reason of a recipient recorded unknown that its own run's answer, come later, proved
// sent (see Record).
const LateAnswer = "accepted by the provider: the answer came after the recipient was recorded unknown"

const sqlLateAnswer = "'" + LateAnswer + "'"

// everUnknown is the SQL condition that recipient r was once recorded unknown: its message may have gone
// out with its code, so the code never goes back to the pool, whatever happens to a resend (see `resume
// --resend-unknown`). The row keeps the mark (migration 0013).
const everUnknown = `r.ever_unknown`

// StartIfDue moves a scheduled campaign whose start time has come to running, and reports its state. A
// running campaign that has not started yet (launched without --at: started_at is when a worker first
// runs a batch of it, inside its window) starts now.
func (s *Store) StartIfDue(ctx context.Context, id int64) (State, error) {
	var st State
	err := s.pool.QueryRow(ctx, `WITH u AS (
			UPDATE campaigns SET state = `+sqlStateRunning+`, started_at = coalesce(started_at, now())
			WHERE id = $1 AND (state = `+sqlStateScheduled+` AND (start_at IS NULL OR start_at <= now())
				OR state = `+sqlStateRunning+` AND started_at IS NULL)
			RETURNING state)
		SELECT coalesce((SELECT state FROM u), (SELECT state FROM campaigns WHERE id = $1))`, id).Scan(&st)
	if err != nil {
		return "", fmt.Errorf("start campaign %d: %w", id, err)
	}
	return st, nil
}

// ErrWrongState: the campaign is not in a state the operation applies to.
var ErrWrongState = errors.New("campaign is not in a state for that")

// ErrConsentStale: the campaign was launched with a maximum age of its consents, and they were brought up
// to date longer ago than that: nothing of it may be sent until they are (`iys sync`).
var ErrConsentStale = errors.New("the campaign's consents are older than its --max-consent-age")

// ConsentStaleError is ErrConsentStale said in full: which campaign, since when, and what to run.
type ConsentStaleError struct{ Msg string }

func (e *ConsentStaleError) Error() string { return e.Msg }
func (e *ConsentStaleError) Unwrap() error { return ErrConsentStale }

// Transition moves campaign id from one of the states from to state to, and returns the state it was in.
// A campaign in any other state is left alone and the error (ErrWrongState, or ErrNotFound) says which
// state it is in.
func (s *Store) Transition(ctx context.Context, id int64, from []State, to State) (State, error) {
	was, _, err := s.transition(ctx, id, from, `$3::text`, to)
	return was, err
}

// Start moves the campaign from one of the states from to scheduled if its start (launch --at) is still
// ahead by Postgres's clock, else to running, and returns the state it was in and the one it is in now
// (see Transition). Postgres's clock, which the workers' StartIfDue reads too: a machine whose clock runs
// ahead must not start a campaign early.
func (s *Store) Start(ctx context.Context, id int64, from []State) (was, to State, err error) {
	return s.transition(ctx, id, from, `CASE WHEN start_at > now() THEN `+sqlStateScheduled+` ELSE `+sqlStateRunning+` END`)
}

// transition moves the campaign to the state the SQL expression toSQL gives (over $3 when args holds it).
func (s *Store) transition(ctx context.Context, id int64, from []State, toSQL string, args ...any) (State, State, error) {
	var was, to State
	var moved bool
	err := s.pool.QueryRow(ctx, `WITH cur AS (SELECT state FROM campaigns WHERE id = $1 FOR UPDATE),
			u AS (UPDATE campaigns SET state = `+toSQL+`, state_since = now(),
				-- started_at is left to the worker that first runs a batch (StartIfDue, which starts a running
				-- campaign not started yet): a campaign resumed before any batch of it ran has not started.
				finished_at = CASE WHEN `+toSQL+` IN (`+sqlStateCompleted+`, `+sqlStateCancelled+`, `+sqlStateFailed+`) THEN now() END
				WHERE id = $1 AND state = ANY($2) RETURNING state)
		SELECT coalesce((SELECT state FROM cur), ''), coalesce((SELECT state FROM u), ''), EXISTS (SELECT 1 FROM u)`,
		append([]any{id, from}, args...)...).Scan(&was, &to, &moved)
	switch {
	case err != nil:
		return "", "", fmt.Errorf("campaign %d: %w", id, err)
	case was == "":
		return "", "", fmt.Errorf("%w: no campaign has id %d (campaignctl status lists them)", ErrNotFound, id)
	case !moved:
		return was, "", fmt.Errorf("%w: campaign %d is %s", ErrWrongState, id, was)
	}
	return was, to, nil
}

// CompleteIfDone moves a running campaign to completed when none of its recipients is pending, and
// reports whether it did. It first settles (campaign_batches.settled) every batch of the campaign not yet
// settled that has no pending recipient left. A settled batch is not looked at again until one of its
// recipients becomes pending again (the trigger of migration 0012 takes its mark away).
func (s *Store) CompleteIfDone(ctx context.Context, id int64) (bool, error) {
	done, _, err := s.complete(ctx, id, everyBatch)
	return done, err
}

// CloseBatch is CompleteIfDone at the end of a run of batch: only that batch is settled, if it has no
// pending recipient left, so the check costs about one batch, not the campaign. open reports that the
// batch still has a pending recipient: one made pending again while the run was sending (`resume
// --resend-unknown`), which the run never loaded, and which its task must come back for.
func (s *Store) CloseBatch(ctx context.Context, id int64, batch int) (done, open bool, err error) {
	return s.complete(ctx, id, batch)
}

// everyBatch, as complete's batch, settles every batch of the campaign it can.
const everyBatch = -1

// complete settles batch (every batch: everyBatch) if it has no pending recipient, completes the campaign
// if no batch has one, and reports whether batch still has one.
func (s *Store) complete(ctx context.Context, id int64, batch int) (done, open bool, err error) {
	err = s.underCampaignLock(ctx, id, `
		WITH settled AS (
			UPDATE campaign_batches b SET settled = true
			WHERE b.campaign_id = $1 AND NOT b.settled AND ($2 = `+strconv.Itoa(everyBatch)+` OR b.batch = $2)
			  AND NOT `+batchHasPending("b")+`
			RETURNING b.batch
		), done AS (
			UPDATE campaigns SET state = `+sqlStateCompleted+`, finished_at = now()
			WHERE id = $1 AND state = `+sqlStateRunning+`
			  AND NOT EXISTS (SELECT 1 FROM campaign_batches b
				WHERE b.campaign_id = $1 AND NOT b.settled AND b.batch NOT IN (SELECT batch FROM settled)
				  AND `+batchHasPending("b")+`)
			RETURNING 1
		)
		SELECT EXISTS (SELECT 1 FROM done),
			EXISTS (SELECT 1 FROM campaign_batches b WHERE b.campaign_id = $1 AND b.batch = $2
				AND NOT b.settled AND b.batch NOT IN (SELECT batch FROM settled))`,
		[]any{id, batch}, &done, &open)
	if err != nil {
		return false, false, fmt.Errorf("complete campaign %d: %w", id, err)
	}
	return done, open, nil
}

// underCampaignLock runs sql (one row into dest) in a transaction that first locks campaign id's row. The
// statement reads what was committed by the time the lock was granted (each statement of a batch takes
// its own snapshot): the completion check and Resend, which both run so, never interleave.
func (s *Store) underCampaignLock(ctx context.Context, id int64, sql string, args []any, dest ...any) error {
	b := &pgx.Batch{}
	b.Queue(`SELECT count(*) FROM (SELECT 1 FROM campaigns WHERE id = $1 FOR UPDATE) x`, id)
	b.Queue(sql, args...)
	br := s.pool.SendBatch(ctx, b)
	var one int
	err := br.QueryRow().Scan(&one)
	if err == nil {
		err = br.QueryRow().Scan(dest...)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// batchHasPending is the SQL condition that batch row b has a pending recipient: a subquery, evaluated
// per batch through the (campaign, batch) index and stopped at the first pending row.
func batchHasPending(b string) string {
	return `coalesce((SELECT true FROM campaign_recipients r WHERE r.campaign_id = ` + b + `.campaign_id AND r.batch = ` + b + `.batch
		AND r.status = ` + sqlPending + ` LIMIT 1), false)`
}
