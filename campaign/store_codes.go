package campaign

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/campaignctl/campaignctl/codes"
)

// insertRecipients writes the eligible rows of audience_classified as the campaign's recipients, each with
// its batch number and, when the campaign has a code pool, one code reserved from it.
func (p *Planner) insertRecipients(ctx context.Context, tx pgx.Tx, idp *int64, spec Spec, rep *Report) (err error) {
	t0 := time.Now()
	var inserted, cursor int64
	unlock := func() {}
	if spec.CodePool != "" {
		cursor, unlock, err = p.lockPool(ctx, tx, spec, rep)
		defer unlock()
		if err != nil {
			return err
		}
	}
	// Nothing but a fault can refuse the plan from here on: the campaign takes its ID.
	if err := ownID(ctx, tx, idp, spec); err != nil {
		return err
	}
	id := *idp
	if spec.CodePool != "" {
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
	return nil
}

// ownID gives the campaign row planned under the provisional ID *id its ID from the sequence, once nothing
// but a fault can refuse the plan any more; nothing refers to the row yet. A dry run keeps the provisional
// one: it writes nothing.
func ownID(ctx context.Context, tx pgx.Tx, id *int64, spec Spec) error {
	if spec.DryRun {
		return nil
	}
	if err := tx.QueryRow(ctx, `UPDATE campaigns SET id = DEFAULT WHERE id = $1 RETURNING id`, *id).Scan(id); err != nil {
		return fmt.Errorf("plan: the campaign's ID: %w", err)
	}
	return nil
}

// lockPool takes the code writers' lock (see code_pools) and the pool's row for the reservation of the
// plan's codes, and counts the pool's free codes into rep: a pool too short refuses the plan
// (PoolShortError). It returns the pool's cursor and unlock, which lets the code writers go on (at once
// once the codes are taken, or when the plan ends: it may be called more than once); unlock is set even
// when err is not nil.
func (p *Planner) lockPool(ctx context.Context, tx pgx.Tx, spec Spec, rep *Report) (cursor int64, unlock func(), err error) {
	rep.CodesNeeded = rep.Eligible
	unlock = func() {}
	// Serialise with code writers (see code_pools) while the cursor is read and the codes are taken: a
	// writer still running could commit ids below the cursor. Once taken, any later writer gets higher
	// ids, so the lock is a session lock released right after the reservation, not held through the
	// rest of the plan (a dry run renders every message). Other launches on the pool wait on the pool
	// row, locked until commit.
	var got bool
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, codes.WriteLockKey).Scan(&got); err != nil {
		return 0, unlock, fmt.Errorf("plan: %w", err)
	}
	if !got {
		// A code import or generate holds it (a million codes take some 20 s): the launch says what it
		// waits for instead of waiting without a word.
		if p.Log != nil {
			p.Log.Warn("waiting for another writer of codes to finish (a codes import or generate, or another launch reserving its codes: codes of every pool are taken one writer at a time)", "pool", spec.CodePool)
		}
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_lock($1)`, codes.WriteLockKey); err != nil {
			return 0, unlock, fmt.Errorf("plan: %w", err)
		}
	}
	unlocked := false
	unlock = func() {
		if !unlocked {
			unlocked = true
			if _, err := tx.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, codes.WriteLockKey); err != nil {
				// An aborted transaction cannot unlock; closing the connection releases the lock and
				// keeps the pool from handing out a connection that still holds it.
				tx.Conn().Close(context.WithoutCancel(ctx)) //nolint:errcheck
			}
		}
	}
	if err := tx.QueryRow(ctx, `SELECT next_id FROM code_pools WHERE name = $1 FOR UPDATE`, spec.CodePool).Scan(&cursor); err != nil {
		return 0, unlock, fmt.Errorf("plan: %w", err)
	}
	// A released code that a recipient still holds is not free: only a faulty release leaves one (a
	// recipient that keeps its code, filed as released all the same), and giving it out would fail
	// this launch on the unique index of held codes. It leaves the free codes here, under the pool's
	// lock, and the operator hears of it.
	dropped, err := tx.Exec(ctx, `DELETE FROM released_codes rc WHERE rc.pool = $1
		AND EXISTS (SELECT 1 FROM campaign_recipients r WHERE r.code_id = rc.code_id)`, spec.CodePool)
	if err != nil {
		return 0, unlock, fmt.Errorf("plan: %w", err)
	}
	if n := dropped.RowsAffected(); n > 0 && p.Log != nil {
		p.Log.Warn("codes listed as released were still held by recipients; they are no longer counted free", "pool", spec.CodePool, "codes", n)
	}
	if err := tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM promo_codes WHERE pool = $1 AND id > $2)
		+ (SELECT count(*) FROM released_codes WHERE pool = $1)`, spec.CodePool, cursor).Scan(&rep.CodesFree); err != nil {
		return 0, unlock, fmt.Errorf("plan: %w", err)
	}
	rep.CodesCounted = true
	if rep.CodesFree < rep.CodesNeeded {
		return 0, unlock, &PoolShortError{Pool: spec.CodePool, Needed: rep.CodesNeeded, Free: rep.CodesFree}
	}
	return cursor, unlock, nil
}
