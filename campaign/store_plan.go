package campaign

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/campaignctl/campaignctl/codes"
	"github.com/campaignctl/campaignctl/iys"
	"github.com/campaignctl/campaignctl/providers"
)

// plan runs the whole plan inside one engine transaction. The audience query runs in a second, read-only
// transaction on the audience database; its rows are streamed straight into a temporary staging table with
// COPY, so no audience is ever held in memory, and everything after that is set-based SQL.
func (p *Planner) plan(ctx context.Context, spec Spec, tmpl *Template, rep *Report) (err error) {
	tx, err := p.Engine.Begin(ctx)
	if err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	defer func() {
		if err != nil || spec.DryRun {
			tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
		}
	}()

	// Sorts and hashes over a million audience rows stay in memory instead of spilling to disk.
	if _, err := tx.Exec(ctx, `SET LOCAL work_mem = '256MB'`); err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	var poolExists bool
	if spec.CodePool != "" {
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM code_pools WHERE name = $1)`, spec.CodePool).Scan(&poolExists); err != nil {
			return fmt.Errorf("plan: %w", err)
		}
		if !poolExists {
			return fmt.Errorf("%w: code pool %q does not exist; create it with `campaignctl codes generate --pool %s --count N`", ErrInvalid, spec.CodePool, spec.CodePool)
		}
	}

	var id int64
	var startAt *time.Time
	if !spec.StartAt.IsZero() {
		startAt = &spec.StartAt
	}
	zone := DefaultZone
	if spec.Window.Zone != nil {
		zone = spec.Window.Zone.String()
	}
	if err := p.consentGate(ctx, tx, spec, rep); err != nil {
		return err
	}
	err = tx.QueryRow(ctx, `INSERT INTO campaigns (name, channel, state, message, subject, code_pool, rate, audience_sql, batch_size,
			start_at, send_window, window_zone, frequency_cap_seconds, html, template_id, recipient_type, transactional,
			allow_stale_consent, template_hash, brand_code, privileged_audience, max_segments)
		VALUES ($1, $2, 'planning', $3, $4, NULLIF($5, ''), $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21) RETURNING id`,
		spec.Name, spec.Channel, spec.Message, spec.Subject, spec.CodePool, spec.Rate, spec.AudienceSQL, spec.BatchSize,
		startAt, spec.Window.String(), zone, int64(spec.FrequencyCap/time.Second), spec.HTML, spec.TemplateID,
		spec.recipientType(), spec.Transactional, rep.StaleConsentAllowed, spec.Content().Hash(), spec.BrandCode,
		spec.AllowPrivilegedAudience, spec.MaxSegments).Scan(&id)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" {
			var other int64
			var st State
			p.Engine.QueryRow(context.WithoutCancel(ctx), `SELECT id, state FROM campaigns WHERE name = $1`, spec.Name).Scan(&other, &st) //nolint:errcheck // only for the message
			return fmt.Errorf("%w: a campaign named %q exists already (id %d, %s); choose another --name, or run `campaignctl resume %d` if that launch was interrupted",
				ErrNameTaken, spec.Name, other, st, other)
		}
		return fmt.Errorf("plan: %w", err)
	}

	if _, err := tx.Exec(ctx, `CREATE TEMP TABLE audience_stage (ord bigint, user_id text, address text, vars jsonb) ON COMMIT DROP`); err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	t0 := time.Now()
	if err := p.stageAudience(ctx, tx, spec, tmpl); err != nil {
		return err
	}
	p.step("stage audience", t0)
	t0 = time.Now()

	// Who got a message on this channel within the frequency cap, across campaigns (the partial index on
	// sent_at finds them without touching the rest).
	if _, err := tx.Exec(ctx, fmt.Sprintf(`CREATE TEMP TABLE recent_sends ON COMMIT DROP AS
		SELECT DISTINCT s.address FROM campaign_recipients s JOIN campaigns c ON c.id = s.campaign_id
		WHERE s.status = 'sent' AND s.sent_at > now() - interval '%d seconds' AND c.channel = '%s'`,
		int64(spec.FrequencyCap/time.Second), spec.Channel)); err != nil {
		return fmt.Errorf("plan: recent sends: %w", err)
	}

	// The consents' version, read before the consents themselves: a change committed after this read
	// moves the version past what the campaign keeps, so the leases read every consent again; one
	// committed before it is seen by the classification below (see migration 0007).
	var consentVersion *int64
	if consentTest(spec) != "" && spec.Channel.IYSType() != "" {
		var v int64
		if err := tx.QueryRow(ctx, `SELECT version FROM iys_consents_version`).Scan(&v); err != nil {
			return fmt.Errorf("plan: consent version: %w", err)
		}
		consentVersion = &v
	}

	// Each row gets one reason, checked in this order; the first row (in query order) of a user, and the
	// first valid user of a number, is the one kept.
	// Addresses providers condemned (unregistered push tokens): joined only when the channel has any, so
	// that a million-row audience does not probe an empty table a million times.
	var invalidJoin, invalidTest string
	var anyInvalid bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM invalid_addresses WHERE channel = $1)`, spec.Channel).Scan(&anyInvalid); err != nil {
		return fmt.Errorf("plan: invalid addresses: %w", err)
	}
	if anyInvalid {
		invalidJoin = `LEFT JOIN invalid_addresses ia ON ia.channel = ` + quoteLiteral(string(spec.Channel)) + ` AND ia.address = a.address`
		invalidTest = ` OR ia.address IS NOT NULL`
	}
	if _, err := tx.Exec(ctx, `CREATE TEMP TABLE audience_classified ON COMMIT DROP AS
		WITH u AS (
			SELECT s.*, row_number() OVER (PARTITION BY user_id ORDER BY ord) AS urn FROM audience_stage s
		), a AS (
			SELECT u.*, row_number() OVER (
				PARTITION BY (user_id IS NOT NULL AND urn = 1 AND address IS NOT NULL), address ORDER BY ord) AS arn
			FROM u
		)
		SELECT a.ord, a.user_id, a.address, a.vars,
			c.status AS c_status, c.source AS c_source, c.consent_date AS c_date, c.transaction_id AS c_txn,
			coalesce(c.synced_at, c.updated_at) AS c_synced,
			CASE WHEN a.user_id IS NULL THEN '`+ReasonMissingUser+`'
			     WHEN a.urn > 1 THEN '`+ReasonDuplicateUser+`'
			     WHEN a.address IS NULL`+invalidTest+` THEN '`+ReasonInvalidAddress+`'
			     WHEN a.arn > 1 THEN '`+ReasonDuplicateAddress+`'
			     WHEN `+missingValueTest(tmpl, spec.Channel)+` THEN '`+ReasonMissingValue+`'
			     WHEN `+headerValueTest(tmpl, spec.Channel)+` THEN '`+ReasonInvalidValue+`'
			     `+consentTest(spec)+`
			     WHEN r.address IS NOT NULL THEN '`+ReasonFrequencyCap+`'
			END AS reason
		FROM a LEFT JOIN iys_consents c
			ON c.recipient = a.address AND c.type = '`+spec.Channel.IYSType()+`' AND c.recipient_type = '`+spec.recipientType()+`'
			AND c.brand_code = `+quoteLiteral(spec.BrandCode)+`
		`+invalidJoin+`
		LEFT JOIN recent_sends r ON r.address = a.address`); err != nil {
		return fmt.Errorf("plan: classify audience: %w", err)
	}
	p.step("classify", t0)
	t0 = time.Now()

	rows, err := tx.Query(ctx, `SELECT reason, count(*) FROM audience_classified GROUP BY reason`)
	if err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	for rows.Next() {
		var reason *string
		var n int64
		if err := rows.Scan(&reason, &n); err != nil {
			rows.Close()
			return fmt.Errorf("plan: %w", err)
		}
		rep.Audience += n
		if reason == nil {
			rep.Eligible = n
		} else {
			rep.Excluded[*reason] = n
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	if err := p.brandGate(ctx, tx, spec, rep); err != nil {
		return err
	}
	if rep.Eligible == 0 {
		if spec.DryRun {
			rep.Warnings = append(rep.Warnings, "no recipient is eligible: a launch of this audience would be refused")
		} else if rep.Audience == 0 {
			return fmt.Errorf("%w: the audience query returned no rows; nothing was written. Check its WHERE clause (a dry run shows the report)", ErrInvalid)
		} else {
			return fmt.Errorf("%w: none of the audience's %d rows is eligible (%s); nothing was written. A dry run shows the report", ErrInvalid, rep.Audience, exclusions(rep.Excluded))
		}
	}

	var inserted int64
	if spec.CodePool != "" {
		rep.CodesNeeded = rep.Eligible
		// Serialise with code writers (see code_pools) while the cursor is read and the codes are taken: a
		// writer still running could commit ids below the cursor. Once taken, any later writer gets higher
		// ids, so the lock is a session lock released right after the reservation, not held through the
		// rest of the plan (a dry run renders every message). Other launches on the pool wait on the pool
		// row, locked until commit.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_lock($1)`, codes.WriteLockKey); err != nil {
			return fmt.Errorf("plan: %w", err)
		}
		unlocked := false
		unlock := func() {
			if !unlocked {
				unlocked = true
				if _, err := tx.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, codes.WriteLockKey); err != nil {
					// An aborted transaction cannot unlock; closing the connection releases the lock and
					// keeps the pool from handing out a connection that still holds it.
					tx.Conn().Close(context.WithoutCancel(ctx)) //nolint:errcheck
				}
			}
		}
		defer unlock()
		var cursor int64
		if err := tx.QueryRow(ctx, `SELECT next_id FROM code_pools WHERE name = $1 FOR UPDATE`, spec.CodePool).Scan(&cursor); err != nil {
			return fmt.Errorf("plan: %w", err)
		}
		// A released code that a recipient still holds is not free: only a faulty release leaves one (a
		// recipient that keeps its code, filed as released all the same), and giving it out would fail
		// this launch on the unique index of held codes. It leaves the free codes here, under the pool's
		// lock, and the operator hears of it.
		dropped, derr := tx.Exec(ctx, `DELETE FROM released_codes rc WHERE rc.pool = $1
			AND EXISTS (SELECT 1 FROM campaign_recipients r WHERE r.code_id = rc.code_id)`, spec.CodePool)
		if derr != nil {
			return fmt.Errorf("plan: %w", derr)
		}
		if n := dropped.RowsAffected(); n > 0 && p.Log != nil {
			p.Log.Warn("codes listed as released were still held by recipients; they are no longer counted free", "pool", spec.CodePool, "codes", n)
		}
		if err := tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM promo_codes WHERE pool = $1 AND id > $2)
			+ (SELECT count(*) FROM released_codes WHERE pool = $1)`, spec.CodePool, cursor).Scan(&rep.CodesFree); err != nil {
			return fmt.Errorf("plan: %w", err)
		}
		if rep.CodesFree < rep.CodesNeeded {
			return &PoolShortError{Pool: spec.CodePool, Needed: rep.CodesNeeded, Free: rep.CodesFree}
		}
		p.step("count", t0)
		t0 = time.Now()
		// Codes are matched to recipients by rank: released codes first, then fresh ones in id order; the
		// cursor moves to the highest fresh code given out.
		var maxID int64
		err = tx.QueryRow(ctx, `
			WITH rel AS (
				DELETE FROM released_codes WHERE code_id IN (
					SELECT code_id FROM released_codes WHERE pool = $2 ORDER BY code_id LIMIT $3)
				RETURNING code_id
			), fresh AS (
				SELECT id, code FROM promo_codes WHERE pool = $2 AND id > $5 ORDER BY id LIMIT $3
			), c AS (
				SELECT id, code, row_number() OVER (ORDER BY src, id) AS rn
				FROM (SELECT p.id, p.code, 0 AS src FROM rel JOIN promo_codes p ON p.id = rel.code_id
				      UNION ALL SELECT id, code, 1 FROM fresh) u
			), e AS (
				SELECT user_id, address, vars, c_status, c_source, c_date, c_txn, c_synced, row_number() OVER (ORDER BY ord) AS rn
				FROM audience_classified WHERE reason IS NULL
			), ins AS (
				INSERT INTO campaign_recipients (campaign_id, user_id, address, vars, code, code_id, batch,
					consent_status, consent_source, consent_date, consent_txn, consent_synced_at)
				SELECT $1, e.user_id, e.address, e.vars, c.code, c.id, (e.rn - 1) / $4,
					e.c_status, e.c_source, e.c_date, e.c_txn, e.c_synced
				FROM e JOIN c USING (rn)
				RETURNING code_id
			)
			SELECT count(*), coalesce(max(code_id), 0) FROM ins`,
			id, spec.CodePool, rep.Eligible, spec.BatchSize, cursor).Scan(&inserted, &maxID)
		if err == nil && maxID > cursor {
			_, err = tx.Exec(ctx, `UPDATE code_pools SET next_id = $2 WHERE name = $1`, spec.CodePool, maxID)
		}
		unlock()
	} else {
		p.step("count", t0)
		t0 = time.Now()
		var tag pgconn.CommandTag
		tag, err = tx.Exec(ctx, `
			INSERT INTO campaign_recipients (campaign_id, user_id, address, vars, batch,
				consent_status, consent_source, consent_date, consent_txn, consent_synced_at)
			SELECT $1, user_id, address, vars, (row_number() OVER (ORDER BY ord) - 1) / $2,
				c_status, c_source, c_date, c_txn, c_synced
			FROM audience_classified WHERE reason IS NULL`, id, spec.BatchSize)
		inserted = tag.RowsAffected()
	}
	if err != nil {
		return fmt.Errorf("plan: insert recipients: %w", err)
	}
	if inserted != rep.Eligible {
		// Cannot happen under the pool lock; checked so that no recipient is ever planned without a code.
		return &PoolShortError{Pool: spec.CodePool, Needed: rep.Eligible, Free: inserted}
	}

	p.step("insert recipients and reserve codes", t0)
	t0 = time.Now()
	if _, err := tx.Exec(ctx, `INSERT INTO campaign_batches (campaign_id, batch, size)
		SELECT campaign_id, batch, count(*) FROM campaign_recipients WHERE campaign_id = $1 GROUP BY campaign_id, batch`, id); err != nil {
		return fmt.Errorf("plan: batches: %w", err)
	}

	if err := p.sample(ctx, tx, id, spec, tmpl, rep); err != nil {
		return err
	}
	if spec.Channel == ChannelSMS && (spec.DryRun || spec.CountSegments) {
		if err := p.countSegments(ctx, tx, id, spec, tmpl, rep); err != nil {
			return err
		}
		p.step("render every message", t0)
		t0 = time.Now()
	}

	excluded, _ := json.Marshal(rep.Excluded)
	state := StateRunning
	if startAt != nil && startAt.After(time.Now()) {
		state = StateScheduled
		rep.StartAt = startAt
	}
	if rep.Eligible == 0 {
		state = StateCompleted
	}
	rep.Window = spec.Window.String()
	if _, err := tx.Exec(ctx, `UPDATE campaigns SET audience = $2, eligible = $3, excluded = $4, batches = $5, state = $6,
		started_at = CASE WHEN $6 = 'running' THEN now() END, finished_at = CASE WHEN $6 = 'completed' THEN now() END,
		consent_version = $7 WHERE id = $1`,
		id, rep.Audience, rep.Eligible, excluded, BatchCount(rep.Eligible, spec.BatchSize), state, consentVersion); err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	if spec.DryRun {
		return nil
	}
	p.step("batches and sample", t0)
	t0 = time.Now()
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("plan: commit: %w", err)
	}
	p.step("commit", t0)
	rep.ID = id
	rep.State = state
	// Fresh statistics, at once: the workers' per-chunk statements look recipients up by their primary
	// key, and a planner that still believes this campaign has no pending rows would scan the partial
	// index of pending rows instead, once per chunk. (A sample of 30,000 rows: well under a second.)
	t0 = time.Now()
	if _, err := p.Engine.Exec(context.WithoutCancel(ctx), `ANALYZE campaign_recipients`); err != nil && p.Log != nil {
		p.Log.Warn("could not refresh the planner statistics; autovacuum will", "err", err)
	}
	p.step("analyze", t0)
	return nil
}

// missingValueTest is the SQL condition that a row lacks (NULL) a column the template uses: such a row
// is excluded rather than sent "Merhaba <no value>". Field names come from the parsed template and are
// passed as quoted literals.
func missingValueTest(tmpl *Template, ch Channel) string {
	var conds []string
	for _, f := range tmpl.Fields() {
		switch f {
		case "code", "campaign", "user_id", ch.AddressColumn():
			continue
		}
		conds = append(conds, "(a.vars->>"+quoteLiteral(f)+") IS NULL")
	}
	if len(conds) == 0 {
		return "false"
	}
	return strings.Join(conds, " OR ")
}

// brandGate refuses a launch under an İYS brand code whose audience has consents recorded only without a
// brand (imported before IYS_BRAND_CODE was set): they would all be excluded as no_consent, silently.
func (p *Planner) brandGate(ctx context.Context, tx pgx.Tx, spec Spec, rep *Report) error {
	if spec.BrandCode == "" || spec.Transactional || spec.Channel.IYSType() == "" || rep.Excluded[ReasonNoConsent] == 0 {
		return nil
	}
	var n int64
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM audience_classified a WHERE a.reason = $1 AND EXISTS (
			SELECT 1 FROM iys_consents c WHERE c.recipient = a.address AND c.type = $2 AND c.recipient_type = $3 AND c.brand_code = '')`,
		ReasonNoConsent, spec.Channel.IYSType(), spec.recipientType()).Scan(&n); err != nil {
		return fmt.Errorf("plan: brand check: %w", err)
	}
	if n == 0 {
		return nil
	}
	return fmt.Errorf("%w: IYS_BRAND_CODE is %q, but %d recipients of this audience have consents recorded without a brand (imported before IYS_BRAND_CODE was set), so they would be excluded as no_consent. Import the consent file again with IYS_BRAND_CODE=%s set (or run `campaignctl iys sync`, which records the brand), or launch without IYS_BRAND_CODE",
		ErrInvalid, spec.BrandCode, n, spec.BrandCode)
}

// exclusions lists exclusion counts by reason, for a message.
func exclusions(ex map[string]int64) string {
	parts := make([]string, 0, len(ex))
	for _, r := range slices.Sorted(maps.Keys(ex)) {
		parts = append(parts, fmt.Sprintf("%s %d", r, ex[r]))
	}
	return strings.Join(parts, ", ")
}

// headerValueTest is the SQL condition that a value an e-mail puts in its subject holds a carriage return
// or a line feed: in a header that would start a header of its own (Bcc: ...).
func headerValueTest(tmpl *Template, ch Channel) string {
	if ch != ChannelEmail {
		return "false"
	}
	var conds []string
	for _, f := range tmpl.HeaderFields() {
		conds = append(conds, "(a.vars->>"+quoteLiteral(f)+") ~ '[\r\n]'")
	}
	if len(conds) == 0 {
		return "false"
	}
	return strings.Join(conds, " OR ")
}

// consentTest is the classification's consent branch: İYS ONAY for the channel's type, or for push (no
// İYS channel) the audience's own opt-in column.
func consentTest(spec Spec) string {
	ch := spec.Channel
	if spec.Transactional {
		return "" // not commercial: law 6563 asks no consent
	}
	if ch.IYSType() == "" {
		return `WHEN lower(coalesce(a.vars->>'` + ch.OptInColumn() + `', '')) NOT IN ('true', 't', '1', 'yes', 'y', 'on') THEN '` + ReasonNoOptIn + `'`
	}
	return `WHEN c.status IS NULL THEN '` + ReasonNoConsent + `'
			     WHEN c.status <> 'ONAY' THEN '` + ReasonConsentRET + `'`
}

// consentGate refuses a commercial launch on an İYS channel whose consents were last brought up to date
// longer ago than spec.MaxConsentAge, unless spec.AllowStaleConsent (then the report and the campaign
// record it).
func (p *Planner) consentGate(ctx context.Context, tx pgx.Tx, spec Spec, rep *Report) error {
	if spec.Transactional || spec.Channel.IYSType() == "" || spec.MaxConsentAge == 0 {
		return nil
	}
	var last *time.Time
	// Up to date as of the latest import or re-verification, or of the older of the two pulls: a pull of
	// the brand's changes alone says nothing of the RETs citizens gave in İYS.
	if err := tx.QueryRow(ctx, `SELECT greatest(
			(SELECT max(last_success_at) FROM iys_sync_state WHERE brand_code = $1 AND source IN ('import', 'reverify')),
			(SELECT CASE WHEN count(last_success_at) = 2 THEN min(last_success_at) END
			 FROM iys_sync_state WHERE brand_code = $1 AND source IN ('pull:HS', 'pull:IYS')))`, spec.BrandCode).Scan(&last); err != nil {
		return fmt.Errorf("plan: consent sync state: %w", err)
	}
	rep.ConsentSyncedAt = last
	if last != nil && time.Since(*last) <= spec.MaxConsentAge {
		return nil
	}
	if spec.AllowStaleConsent {
		rep.StaleConsentAllowed = true
		return nil
	}
	when := "never"
	if last != nil {
		when = fmt.Sprintf("last at %s (%s ago)", last.Format(time.RFC3339), time.Since(*last).Round(time.Minute))
	}
	if spec.BrandCode != "" && last == nil {
		var unbranded bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM iys_sync_state WHERE brand_code = '')`).Scan(&unbranded); err == nil && unbranded {
			when += fmt.Sprintf(" for brand %s (IYS_BRAND_CODE; the consents here were imported without a brand: import them again with IYS_BRAND_CODE set)", spec.BrandCode)
		}
	}
	return fmt.Errorf("%w: the İYS consents were brought up to date %s, longer ago than --max-consent-age %v; a RET given since then would be missed. Run `campaignctl iys sync` (or import a fresh consent file), or launch with --allow-stale-consent to go ahead anyway (it is recorded on the campaign)",
		ErrInvalid, when, spec.MaxConsentAge)
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

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
	msg, err := tmpl.Render(r.TemplateData(spec.Channel, spec.Name))
	if err != nil {
		return fmt.Errorf("%w: the message template fails for user %s: %v", ErrInvalid, r.UserID, err)
	}
	rep.SampleMessage = msg
	if spec.Channel == ChannelSMS {
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

// CheckSMSLength says why an SMS body cannot go out (nil when it can): more than maxSegments segments, or
// more characters than providers take.
func CheckSMSLength(body string, maxSegments int) error {
	if maxSegments <= 0 {
		maxSegments = DefaultMaxSegments
	}
	enc, n := providers.SMSSegments(body)
	if units := utf16Len(body); units > MaxSMSChars {
		return fmt.Errorf("is %d characters long, more than the %d an SMS provider takes; shorten it", units, MaxSMSChars)
	}
	if n > maxSegments {
		return fmt.Errorf("takes %d SMS segments (%s), more than --max-segments %d; shorten it (a single Turkish letter such as ı makes the whole message UCS-2, 67 characters a segment) or raise --max-segments", n, enc, maxSegments)
	}
	return nil
}

func utf16Len(s string) int {
	n := 0
	for _, r := range s {
		n++
		if r >= 0x10000 {
			n++
		}
	}
	return n
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

// stageAudience runs the audience query read-only and streams its rows into audience_stage.
func (p *Planner) stageAudience(ctx context.Context, engineTx pgx.Tx, spec Spec, tmpl *Template) error {
	atx, err := p.Audience.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("audience database: %w", err)
	}
	defer atx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	if _, err := atx.Exec(ctx, fmt.Sprintf(`SET LOCAL statement_timeout = %d`, spec.StatementTimeout.Milliseconds())); err != nil {
		return fmt.Errorf("audience database: %w", err)
	}
	rows, cols, err := runAudience(ctx, atx, spec)
	if err != nil {
		return err
	}
	defer rows.Close()

	src := &audienceSource{rows: rows, userIdx: -1, addrIdx: -1, channel: spec.Channel}
	for i, name := range cols {
		if name == "user_id" {
			src.userIdx = i
		}
		if name == spec.Channel.AddressColumn() {
			src.addrIdx = i // the same column as user_id for the webhook channel
		}
	}
	src.names = cols
	if len(cols) == 0 {
		// No row description: the statement failed before returning any column, or is not a SELECT.
		rows.Close()
		if err := rows.Err(); err != nil {
			return audienceError(err, spec.StatementTimeout, !spec.AllowPrivilegedAudience)
		}
		return fmt.Errorf("%w: the audience query returned no columns; it must be one SELECT returning user_id and %s", ErrInvalid, spec.Channel.AddressColumn())
	}
	if src.userIdx < 0 || src.addrIdx < 0 {
		missing := "user_id"
		if src.userIdx >= 0 {
			missing = spec.Channel.AddressColumn()
		}
		return fmt.Errorf("%w: the audience query returns no %s column (it returns: %v); select it, e.g. `SELECT id AS user_id, gsm AS phone, ...`",
			ErrInvalid, missing, cols)
	}
	if col := spec.Channel.OptInColumn(); col != "" && !slices.Contains(cols, col) {
		return fmt.Errorf("%w: a %s audience must return the %s column (true for recipients who opted in; %s has no İYS consent), e.g. `SELECT id AS user_id, %s, notify AS %s, ...`",
			ErrInvalid, spec.Channel, col, spec.Channel, spec.Channel.AddressColumn(), col)
	}
	keys := append(append([]string(nil), cols...), "campaign")
	if spec.CodePool != "" {
		keys = append(keys, "code")
	}
	if err := tmpl.Check(keys); err != nil {
		return err
	}
	if _, err := engineTx.CopyFrom(ctx, pgx.Identifier{"audience_stage"}, []string{"ord", "user_id", "address", "vars"}, src); err != nil {
		if src.err != nil {
			return src.err
		}
		if rerr := rows.Err(); rerr != nil {
			return audienceError(rerr, spec.StatementTimeout, !spec.AllowPrivilegedAudience)
		}
		return fmt.Errorf("plan: stage audience: %w", err)
	}
	return nil
}

// deniedTable finds the table in PostgreSQL's "permission denied for table x".
var deniedTable = regexp.MustCompile(`permission denied for (?:table|view|materialized view) (\S+)`)

func audienceError(err error, timeout time.Duration, restricted bool) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case restricted && pgErr.Code == "42501":
			table := "customers"
			if m := deniedTable.FindStringSubmatch(pgErr.Message); m != nil {
				table = m[1]
			}
			return fmt.Errorf("%w: the audience query was refused what it asked for (%s): it runs as a role that may read only what it is granted, never the engine's own tables or the server's files and sessions. If that table is part of the audience, grant it: GRANT SELECT ON %s TO %s",
				ErrInvalid, pgErr.Message, table, AudienceRole)
		case strings.Contains(pgErr.Message, "within security-definer function"):
			return fmt.Errorf("%w: the audience query tried to change its role (%s); it must be one plain SELECT", ErrInvalid, pgErr.Message)
		case pgErr.Code == "25006":
			return fmt.Errorf("%w: the audience query tried to write (%s); it must be a read-only SELECT", ErrInvalid, pgErr.Message)
		case pgErr.Code == "57014":
			return fmt.Errorf("%w: the audience query ran longer than %v and was cancelled; add an index or narrow the query", ErrInvalid, timeout)
		case pgErr.Code == "42601" && pgErr.Message == "cannot insert multiple commands into a prepared statement":
			return fmt.Errorf("%w: the audience file holds more than one statement; it must be exactly one SELECT", ErrInvalid)
		}
		return fmt.Errorf("%w: the audience query failed: %s (SQLSTATE %s); fix the SQL in the --audience file", ErrInvalid, pgErr.Message, pgErr.Code)
	}
	return fmt.Errorf("audience query: %w", err)
}

// audienceSource adapts the audience rows to CopyFrom: it canonicalises the address (an invalid one
// becomes NULL, to be excluded as invalid_address) and folds the other columns into the vars JSON.
type audienceSource struct {
	rows             pgx.Rows
	names            []string
	userIdx, addrIdx int
	channel          Channel
	ord              int64
	err              error
}

// canonicalAddress returns the address as campaigns store it: E.164 phones, lower-case e-mails, push
// tokens as given (trimmed; FCM tokens are printable ASCII without spaces).
func canonicalAddress(ch Channel, raw string) (string, error) {
	switch ch {
	case ChannelEmail:
		return iys.CanonicalEmail(raw)
	case ChannelWebhook:
		if t := strings.TrimSpace(raw); t != "" {
			return t, nil
		}
		return "", fmt.Errorf("empty user_id")
	case ChannelPush:
		t := strings.TrimSpace(raw)
		if t == "" || len(t) > 4096 || strings.ContainsFunc(t, func(r rune) bool { return r <= ' ' || r > '~' }) {
			return "", fmt.Errorf("invalid push token")
		}
		return t, nil
	}
	return iys.CanonicalPhone(raw)
}

func (s *audienceSource) Next() bool { return s.err == nil && s.rows.Next() }

func (s *audienceSource) Values() ([]any, error) {
	vals, err := s.rows.Values()
	if err != nil {
		s.err = fmt.Errorf("audience row %d: %w", s.ord+1, err)
		return nil, s.err
	}
	s.ord++
	for i, v := range vals {
		if n := valueSize(v); n > MaxValueBytes {
			user := "?"
			if u := vals[s.userIdx]; u != nil {
				user = toText(u)
			}
			s.err = fmt.Errorf("%w: audience row %d (user_id %.40s): the value of %s is %d KiB, more than %d KiB; select a shorter value (e.g. left(%s, 500))",
				ErrInvalid, s.ord, user, s.names[i], n>>10, MaxValueBytes>>10, s.names[i])
			return nil, s.err
		}
	}
	var user, addr any
	if u := vals[s.userIdx]; u != nil {
		user = toText(u)
	}
	if raw := vals[s.addrIdx]; raw != nil {
		if a, err := canonicalAddress(s.channel, toText(raw)); err == nil {
			addr = a
		}
	}
	vars := make(map[string]any, len(vals))
	for i, v := range vals {
		if i == s.userIdx || i == s.addrIdx {
			continue
		}
		vars[s.names[i]] = jsonValue(v)
	}
	b, err := json.Marshal(vars)
	if err != nil {
		s.err = fmt.Errorf("audience row %d: %w", s.ord, err)
		return nil, s.err
	}
	return []any{s.ord, user, addr, json.RawMessage(b)}, nil
}

func (s *audienceSource) Err() error {
	if s.err != nil {
		return s.err
	}
	return s.rows.Err()
}

// valueSize is the size of a text or binary audience value (0 for others, which are small).
func valueSize(v any) int {
	switch v := v.(type) {
	case string:
		return len(v)
	case []byte:
		return len(v)
	case map[string]any, []any:
		b, _ := json.Marshal(v)
		return len(b)
	}
	return 0
}

func toText(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case int64:
		return strconv.FormatInt(v, 10)
	case int32:
		return strconv.FormatInt(int64(v), 10)
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case float32:
		return strconv.FormatFloat(float64(v), 'f', -1, 32)
	case [16]byte:
		return fmt.Sprintf("%x-%x-%x-%x-%x", v[0:4], v[4:6], v[6:8], v[8:10], v[10:16])
	case pgtype.Numeric:
		if b, err := v.MarshalJSON(); err == nil {
			return string(b)
		}
	}
	return fmt.Sprint(v)
}

func jsonValue(v any) any {
	switch v := v.(type) {
	case [16]byte:
		return toText(v)
	case time.Time:
		return v.Format(time.RFC3339)
	}
	return v
}
