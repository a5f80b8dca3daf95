package campaign

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
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
			return errNoPool(spec.CodePool)
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
	// The row takes an ID of its own below zero until the plan can no longer be refused for its audience or
	// its code pool (insertRecipients gives it its ID then: ownID): an ID from the sequence would be used
	// up by a dry run or a refused launch although the transaction rolls back, and the next launch's ID
	// would skip it.
	args := []any{spec.Name, spec.Channel, spec.Message, spec.Subject, spec.CodePool, spec.Rate, spec.AudienceSQL, spec.BatchSize,
		startAt, spec.Window.String(), zone, int64(spec.FrequencyCap / time.Second), spec.HTML, spec.TemplateID,
		spec.recipientType(), spec.Transactional, rep.StaleConsentAllowed, spec.Content().Hash(), spec.BrandCode,
		spec.AllowPrivilegedAudience, spec.MaxSegments, spec.keptConsentAge(rep)}
	args = append(args, -1-rand.Int64N(1<<62))
	err = tx.QueryRow(ctx, `INSERT INTO campaigns (id, name, channel, state, message, subject, code_pool, rate, audience_sql, batch_size,
			start_at, send_window, window_zone, frequency_cap_seconds, html, template_id, recipient_type, transactional,
			allow_stale_consent, template_hash, brand_code, privileged_audience, max_segments, max_consent_age_seconds) OVERRIDING SYSTEM VALUE
		VALUES ($23, $1, $2, `+sqlStatePlanning+`, $3, $4, NULLIF($5, ''), $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, NULLIF($22, 0)) RETURNING id`,
		args...).Scan(&id)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == pgUniqueViolation {
			var other int64
			var st State
			p.Engine.QueryRow(context.WithoutCancel(ctx), `SELECT id, state FROM campaigns WHERE name = $1`, spec.Name).Scan(&other, &st) //nolint:errcheck // only for the message
			hint := fmt.Sprintf(", or run `campaignctl resume %d` if that launch was interrupted", other)
			switch st {
			case StateCompleted, StateCancelled, StateFailed:
				hint = "; a campaign's name stays its own after it ended (the report and the audit name it)" // nothing to resume
			case StatePaused:
				hint = fmt.Sprintf(", or run `campaignctl resume %d` to go on with it", other)
			}
			return fmt.Errorf("%w: a campaign named %q exists already (id %d, %s); choose another --name%s",
				ErrNameTaken, spec.Name, other, st, hint)
		}
		return fmt.Errorf("plan: %w", err)
	}

	if _, err := tx.Exec(ctx, `CREATE TEMP TABLE audience_stage (ord bigint, user_id text, address text, vars jsonb, raw_address text) ON COMMIT DROP`); err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	t0 := time.Now()
	audienceDB, err := p.stageAudience(ctx, tx, spec, tmpl)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `UPDATE campaigns SET audience_database = $2 WHERE id = $1`, id, audienceDB); err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	p.step("stage audience", t0)
	t0 = time.Now()

	consentVersion, err := p.classify(ctx, tx, spec, tmpl, rep)
	if err != nil {
		return err
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

	// The batches' size follows from the eligible count (Spec.batchSize); the row keeps it.
	spec.BatchSize = spec.batchSize(rep.Eligible)
	if err := p.insertRecipients(ctx, tx, &id, spec, rep); err != nil {
		return err
	}
	if !spec.DryRun {
		if err := p.insertExclusions(ctx, tx, id); err != nil {
			return err
		}
	}
	t0 = time.Now()
	// The recipients' batches follow from their count: insertRecipients numbers the rows from 0 and gives
	// row i batch i / batch size (no scan of the rows for them).
	if _, err := tx.Exec(ctx, `INSERT INTO campaign_batches (campaign_id, batch, size)
		SELECT $1, b, least($3::bigint, $2::bigint - b::bigint * $3)
		FROM generate_series(0, ($2::bigint - 1) / $3) b WHERE $2::bigint > 0`, id, rep.Eligible, int64(spec.BatchSize)); err != nil {
		return fmt.Errorf("plan: batches: %w", err)
	}

	if err := p.sample(ctx, tx, id, spec, tmpl, rep); err != nil {
		return err
	}
	if t1 := time.Now(); spec.Channel == ChannelEmail || spec.Channel == ChannelPush {
		// A launch (and its dry run) refuses what the provider would refuse of every message alike.
		if err := p.checkParts(ctx, tx, id, spec, tmpl); err != nil {
			return err
		}
		p.step("check every message's subject and size", t1)
		t0 = t0.Add(time.Since(t1))
	}
	if spec.Channel.Spec().Segmented && (spec.DryRun || spec.CountSegments) {
		if err := p.countSegments(ctx, tx, id, spec, tmpl, rep); err != nil {
			return err
		}
		p.step("render every message", t0)
		t0 = time.Now()
	} else if spec.Channel.Spec().Segmented {
		// A launch refuses what its dry run refuses: no message may be longer than --max-segments.
		t1 := time.Now()
		if err := p.checkLengths(ctx, tx, id, spec, tmpl); err != nil {
			return err
		}
		p.step("check every message's length", t1)
		t0 = t0.Add(time.Since(t1)) // "batches and sample" below leaves the check out
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
	if rep.Window != "" && spec.Window.Zone != nil {
		rep.WindowZone = spec.Window.Zone.String()
	}
	if _, err := tx.Exec(ctx, `UPDATE campaigns SET audience = $2, eligible = $3, excluded = $4, batches = $5, state = $6,
		-- started_at: when a worker first runs a batch of it (StartIfDue), inside its window, not now.
		started_at = NULL, finished_at = CASE WHEN $6 = `+sqlStateCompleted+` THEN now() END,
		consent_version = $7, batch_size = $8 WHERE id = $1`,
		id, rep.Audience, rep.Eligible, excluded, BatchCount(rep.Eligible, spec.BatchSize), state, consentVersion, spec.BatchSize); err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	if spec.DryRun {
		return nil
	}
	p.step("batches and sample", t0)
	t0 = time.Now()
	// The transaction's ID, for a commit whose answer never comes: the commit may have happened (a
	// cancel, a lost connection or a stop while Postgres waits for its WAL flush or a synchronous standby
	// cannot take it back), and only Postgres can tell.
	var xid string
	if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&xid); err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		switch p.commitOutcome(ctx, xid) {
		case "committed":
			// Written: the launch goes on to queue it (or says how to, when it was stopped).
		case "aborted":
			return fmt.Errorf("plan: commit: %w", err)
		default:
			return fmt.Errorf("%w: campaign %q (id %d) may have been written: its commit went unanswered (%v) and Postgres could not tell since; "+
				"`campaignctl status --json` lists it if it was: then `campaignctl resume %d` sends it or `campaignctl cancel %d` drops it",
				ErrCommitUnknown, spec.Name, id, err, id, id)
		}
	}
	p.step("commit", t0)
	rep.ID = id
	rep.State = state
	// Fresh statistics, at once: the workers' per-chunk statements look recipients up by their primary
	// key, and a planner that still believes this campaign has no pending rows would scan the partial
	// index of pending rows instead, once per chunk. (A sample of 30,000 rows: well under a second.)
	// Not when the launch was stopped (its commit went unanswered and was found written): it is to end
	// now, and a statement that cannot be cancelled could hold it (a commit waiting for a standby).
	t0 = time.Now()
	if ctx.Err() == nil {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if _, err := p.Engine.Exec(actx, `ANALYZE campaign_recipients`); err != nil && p.Log != nil {
			p.Log.Warn("could not refresh the planner statistics; autovacuum will", "err", err)
		}
	}
	p.step("analyze", t0)
	return nil
}

// ErrCommitUnknown is returned, wrapped, when a plan's commit went unanswered and Postgres could not say
// since whether it happened: the campaign may be written.
var ErrCommitUnknown = errors.New("the plan's outcome is unknown")

// commitOutcome asks Postgres, on a connection of its own, what became of transaction xid whose commit
// went unanswered: "committed", "aborted", or "" when it cannot tell within 15 s (unreachable, or still
// committing).
func (p *Planner) commitOutcome(ctx context.Context, xid string) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer cancel()
	for {
		var st *string
		err := p.Engine.QueryRow(ctx, `SELECT pg_xact_status($1::xid8)`, xid).Scan(&st)
		if err == nil && st != nil && *st != "in progress" {
			return *st
		}
		select {
		case <-ctx.Done():
			return ""
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// errNoPool refuses a campaign whose code pool does not exist.
func errNoPool(pool string) error {
	return fmt.Errorf("%w: code pool %q does not exist; create it with `campaignctl codes generate --pool %s --count N`", ErrInvalid, pool, pool)
}
