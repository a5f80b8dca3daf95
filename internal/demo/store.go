package demo

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/codes"
	"github.com/campaignctl/campaignctl/iys"
)

// chunk is how many customers one INSERT writes, so that Progress moves while a large seed runs.
const chunk = 100_000

// usersSQL derives everything about users $1..$2 (0-based k) from k alone; see the package comment.
// $3/$4 are the first names and their ASCII spellings, $5/$6 the last names likewise, $7 the cities. The
// phone's national number is 53X (X = owner % 30) followed by 7 digits that are a bijection of owner / 30
// (7919 is prime to 10^7), so phones are unique for up to 3·10^8 users; the owner is the user before for
// k%1000 == 501, which is how some phones come to be shared.
const usersSQL = `
	SELECT k, user_id, first_name, last_name, city, nat,
	       first_ascii || coalesce('.' || last_ascii, '') || '.' || (k + 1) || '@example.com' AS email
	FROM (
		SELECT k,
		       'u' || lpad((k + 1)::text, greatest(7, length((k + 1)::text)), '0') AS user_id,
		       ($3::text[])[1 + (k * 7) % cardinality($3::text[])] AS first_name,
		       ($4::text[])[1 + (k * 7) % cardinality($4::text[])] AS first_ascii,
		       CASE WHEN k % 50 <> 49 THEN ($5::text[])[1 + (k * 11 + k / 97) % cardinality($5::text[])] END AS last_name,
		       CASE WHEN k % 50 <> 49 THEN ($6::text[])[1 + (k * 11 + k / 97) % cardinality($6::text[])] END AS last_ascii,
		       ($7::text[])[1 + (k * 3 + k / 13) % cardinality($7::text[])] AS city,
		       (530 + owner % 30)::text || lpad((((owner / 30) * 7919 + 1234567) % 10000000)::text, 7, '0') AS nat
		FROM (SELECT k, CASE WHEN k % 1000 = 501 THEN k - 1 ELSE k END AS owner
		      FROM generate_series($1::bigint, $2::bigint) AS k) g
	) x`

// consentDateSQL is the consent_date of user k's consents: spread over 2024, the same on every seed.
const consentDateSQL = `timestamptz '2024-01-01 10:00:00+03' + make_interval(days => (k % 365)::int, secs => (k % 3600)::int)`

// Seed creates (or empties and refills) the table customers with opts.Users synthetic customers, writes
// their İYS consents, and tops the code pool opts.Pool up to at least Users free codes; see the package
// comment for exactly what each user gets.
//
// The three parts are independent and run at once, on their own connections: customers in one
// transaction, consents in another, codes through codes.Generate. Each part is all or nothing, but if one
// fails the others may still have committed; running Seed again repairs that, since it is idempotent: the
// consents of the seeded addresses are overwritten (and removed for the users meant to have none), and
// only missing codes are generated. A million users take about 30 s on a 2-core machine (20 s to seed
// them again).
func Seed(ctx context.Context, pool *pgxpool.Pool, opts SeedOptions) (SeedReport, error) {
	if err := opts.validate(); err != nil {
		return SeedReport{}, err
	}
	rep := SeedReport{Pool: opts.Pool}
	n := int64(opts.Users)
	rep.InvalidPhones = countMod(n, 100, 99)
	rep.SharedPhones = 2 * countMod(n, 1000, 501)

	free, err := codes.Free(ctx, pool, opts.Pool)
	if err != nil && !errors.Is(err, codes.ErrPoolNotFound) {
		return rep, fmt.Errorf("seed: %w", err)
	}
	need := max(0, opts.Users-int(free))
	prog := &progress{fn: opts.Progress, total: 2*opts.Users + need}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	parts := []func() error{
		func() error {
			c, err := inTx(ctx, pool, func(tx pgx.Tx) (int64, error) {
				return writeCustomers(ctx, tx, n, userArgs(), func(d int) { prog.set(0, d) })
			})
			rep.Customers = c
			if err != nil {
				return fmt.Errorf("customers: %w", err)
			}
			return nil
		},
		func() error {
			_, err := inTx(ctx, pool, func(tx pgx.Tx) (int64, error) {
				if err := writeConsents(ctx, tx, n, userArgs(), &rep); err != nil {
					return 0, err
				}
				// The demo's consents stand for a fresh export from İYS.
				return 0, iys.MarkSynced(ctx, tx, "", iys.SourceImport, 0)
			})
			if err != nil {
				return fmt.Errorf("consents: %w", err)
			}
			prog.set(1, opts.Users)
			return nil
		},
		func() error {
			if need == 0 {
				return nil
			}
			gen, err := codes.Generate(ctx, pool, codes.GenerateOptions{Pool: opts.Pool, Count: need,
				Progress: func(done int) { prog.set(2, done) }})
			rep.CodesGenerated = gen.Generated
			return err
		},
	}
	errs := make(chan error, len(parts))
	for _, part := range parts {
		go func() {
			err := part()
			if err != nil {
				cancel()
			}
			errs <- err
		}()
	}
	var firstErr error
	for range parts {
		if err := <-errs; err != nil && (firstErr == nil || errors.Is(firstErr, context.Canceled)) {
			firstErr = err
		}
	}
	if firstErr != nil {
		return rep, fmt.Errorf("seed: %w", firstErr)
	}
	if rep.CodesFree, err = codes.Free(ctx, pool, opts.Pool); err != nil {
		return rep, fmt.Errorf("seed: %w", err)
	}
	prog.finish()
	return rep, nil
}

// inTx runs f in a transaction and commits it if f succeeds.
func inTx(ctx context.Context, pool *pgxpool.Pool, f func(pgx.Tx) (int64, error)) (int64, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	n, err := f(tx)
	if err != nil {
		return n, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("commit: %w", err)
	}
	return n, nil
}

// userArgs are the query arguments of usersSQL; the first two, the range of k, are filled in per query.
func userArgs() []any {
	return []any{nil, nil, displays(firstNames), asciis(firstNames), displays(lastNames), asciis(lastNames), cities}
}

// progress adds up the parts' progress for SeedOptions.Progress, which must not be called concurrently.
type progress struct {
	mu    sync.Mutex
	fn    func(done, total int)
	total int
	parts [3]int
}

func (p *progress) set(part, done int) {
	if p.fn == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.parts[part] = done
	p.fn(min(p.parts[0]+p.parts[1]+p.parts[2], p.total), p.total)
}

func (p *progress) finish() {
	if p.fn != nil {
		p.fn(p.total, p.total)
	}
}

// countMod returns how many k in [0, n) have k % m == r.
func countMod(n, m, r int64) int64 {
	c := n / m
	if n%m > r {
		c++
	}
	return c
}

func writeCustomers(ctx context.Context, tx pgx.Tx, n int64, args []any, progress func(int)) (int64, error) {
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS customers (
		user_id        text PRIMARY KEY,
		first_name     text NOT NULL,
		last_name      text,
		phone          text,
		email          text,
		city           text,
		push_token     text,
		opted_in_push  boolean
	)`); err != nil {
		return 0, err
	}
	// Audience queries run as the audience role, which reads only what it is granted (migration 0008).
	if _, err := tx.Exec(ctx, `GRANT SELECT ON customers TO `+campaign.AudienceRole); err != nil {
		return 0, err
	}
	if _, err := tx.Exec(ctx, `TRUNCATE customers`); err != nil {
		return 0, err
	}
	var written int64
	for lo := int64(0); lo < n; lo += chunk {
		args[0], args[1] = lo, min(lo+chunk, n)-1
		// The phone's spelling rotates with k%4; the 1% invalid ones rotate with (k/100)%3.
		tag, err := tx.Exec(ctx, `
			INSERT INTO customers (user_id, first_name, last_name, phone, email, city, push_token, opted_in_push)
			SELECT user_id, first_name, last_name,
			       CASE WHEN k % 100 = 99 THEN
			              CASE (k / 100) % 3 WHEN 0 THEN '12345' WHEN 1 THEN '+900' || nat ELSE left(nat, 9) END
			            ELSE CASE k % 4
			              WHEN 0 THEN '0' || substr(nat, 1, 3) || ' ' || substr(nat, 4, 3) || ' ' || substr(nat, 7, 2) || ' ' || substr(nat, 9, 2)
			              WHEN 1 THEN '+90' || nat
			              WHEN 2 THEN nat
			              ELSE '+90 ' || substr(nat, 1, 3) || ' ' || substr(nat, 4, 3) || ' ' || substr(nat, 7, 2) || ' ' || substr(nat, 9, 2)
			            END
			       END,
			       email, city,
			       CASE WHEN k % 10 <> 9 THEN 'demo-fcm-' || md5('demo-push-' || k) END,
			       k % 10 < 6
			FROM (`+usersSQL+`) u`, args...)
		if err != nil {
			return written, err
		}
		written += tag.RowsAffected()
		progress(int(written))
	}
	return written, nil
}

// writeConsents stages the consents the seeded users should have and makes iys_consents agree, under a
// lock that keeps other consent writers out meanwhile (readers carry on): a delete for the users meant to
// have none, an update where a stored consent differs, and a plain insert of the missing ones, in key
// order. On a fresh database that is one bulk insert; on a second seed it writes nothing.
func writeConsents(ctx context.Context, tx pgx.Tx, n int64, args []any, rep *SeedReport) error {
	if _, err := tx.Exec(ctx, `SET LOCAL work_mem = '128MB'`); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `CREATE TEMP TABLE demo_consents (
		recipient     text NOT NULL,
		type          text NOT NULL,
		status        text,
		consent_date  timestamptz NOT NULL
	) ON COMMIT DROP`); err != nil {
		return err
	}
	args[0], args[1] = int64(0), n-1
	if _, err := tx.Exec(ctx, `
		INSERT INTO demo_consents (recipient, type, status, consent_date)
		WITH u AS (`+usersSQL+`)
		SELECT '+90' || nat, 'MESAJ',
		       CASE WHEN k % 100 < 85 THEN 'ONAY' WHEN k % 100 < 90 THEN 'RET' END,
		       `+consentDateSQL+`
		FROM u WHERE k % 100 <> 99 AND k % 1000 <> 501
		UNION ALL
		SELECT email, 'EPOSTA',
		       CASE WHEN (k + 50) % 100 < 85 THEN 'ONAY' WHEN (k + 50) % 100 < 90 THEN 'RET' END,
		       `+consentDateSQL+`
		FROM u`, args...); err != nil {
		return fmt.Errorf("stage: %w", err)
	}
	if _, err := tx.Exec(ctx, `ANALYZE demo_consents`); err != nil {
		return err
	}
	// Every writer of consents takes the version row first (iys.RecordRefusals), then the table.
	if _, err := tx.Exec(ctx, `SELECT 1 FROM iys_consents_version FOR UPDATE`); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE iys_consents IN SHARE ROW EXCLUSIVE MODE`); err != nil {
		return err
	}
	// A seed run again leaves alone the consents of an address that refused (a STOP, an unsubscribe):
	// a refusal is never undone by demo data.
	if _, err := tx.Exec(ctx, `DELETE FROM demo_consents d WHERE EXISTS (SELECT 1 FROM refusals f WHERE f.recipient = d.recipient AND f.type = d.type)`); err != nil {
		return fmt.Errorf("keep refusals: %w", err)
	}
	if _, err := tx.Exec(ctx, `
		DELETE FROM iys_consents c USING demo_consents d
		WHERE d.status IS NULL
		  AND c.recipient = d.recipient AND c.type = d.type AND c.recipient_type = 'BIREYSEL'`); err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	// Each consent written is in the history as from an import (the seed stands for a complete export, and
	// marks the consents up to date as one): a later partial import, which does not list them, is then
	// not taken for a complete one. Without it, a one-row import after a seed made every consent look
	// fresh to the launches' --max-consent-age.
	if _, err := tx.Exec(ctx, `
		WITH upd AS (
			UPDATE iys_consents c
			SET status = d.status, source = 'HS_WEB', consent_date = d.consent_date, updated_at = now()
			FROM demo_consents d
			WHERE d.status IS NOT NULL
			  AND c.recipient = d.recipient AND c.type = d.type AND c.recipient_type = 'BIREYSEL'
			  AND (c.status, c.source, c.consent_date) IS DISTINCT FROM (d.status, 'HS_WEB', d.consent_date)
			RETURNING c.recipient, c.type, c.recipient_type, c.brand_code, c.status, c.source, c.consent_date
		), ins AS (
			-- The rows the update takes are stored already: the statement's snapshot tells them apart.
			INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date)
			SELECT d.recipient, d.type, 'BIREYSEL', d.status, 'HS_WEB', d.consent_date
			FROM demo_consents d
			WHERE d.status IS NOT NULL
			  AND NOT EXISTS (SELECT 1 FROM iys_consents c
			                  WHERE c.recipient = d.recipient AND c.type = d.type AND c.recipient_type = 'BIREYSEL')
			ORDER BY d.recipient, d.type
			RETURNING recipient, type, recipient_type, brand_code, status, source, consent_date
		)
		INSERT INTO iys_consent_history (recipient, type, recipient_type, brand_code, status, source, consent_date, origin)
		SELECT recipient, type, recipient_type, brand_code, status, source, consent_date, 'import' FROM upd
		UNION ALL
		SELECT recipient, type, recipient_type, brand_code, status, source, consent_date, 'import' FROM ins`); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	err := tx.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE type = 'MESAJ' AND status = 'ONAY'),
		       count(*) FILTER (WHERE type = 'MESAJ' AND status = 'RET'),
		       count(*) FILTER (WHERE type = 'EPOSTA' AND status = 'ONAY'),
		       count(*) FILTER (WHERE type = 'EPOSTA' AND status = 'RET')
		FROM demo_consents`).Scan(&rep.SMSApproved, &rep.SMSRejected, &rep.EmailApproved, &rep.EmailRejected)
	if err != nil {
		return fmt.Errorf("count: %w", err)
	}
	return nil
}
