package campaign

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/campaignctl/campaignctl/iys"
)

// consentGate refuses a commercial launch on an İYS channel whose consents were last brought up to date
// longer ago than spec.MaxConsentAge, unless spec.AllowStaleConsent (then the report and the campaign
// record it).
func (p *Planner) consentGate(ctx context.Context, tx pgx.Tx, spec Spec, rep *Report) error {
	if !spec.consentRule().checksIYS() || spec.MaxConsentAge == 0 {
		return nil
	}
	var last *time.Time
	if err := tx.QueryRow(ctx, `SELECT `+consentSyncedAtSQL("$1"), spec.BrandCode).Scan(&last); err != nil {
		return fmt.Errorf("plan: consent sync state: %w", err)
	}
	rep.ConsentSyncedAt = last
	if last != nil && time.Since(*last) <= spec.MaxConsentAge {
		if !spec.StartAt.IsZero() && spec.StartAt.Sub(*last) > spec.MaxConsentAge && !spec.AllowStaleConsent {
			// Fresh now, too old by the start: the batches would go to the DLQ at the start, unless a sync
			// comes before it.
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("the İYS consents will be older than --max-consent-age %v at the start (%s): unless `campaignctl iys sync` runs before it (cron), the campaign's batches stop at the start and wait in the DLQ for a sync",
				spec.MaxConsentAge, spec.StartAt.UTC().Format(time.RFC3339)))
		}
		return nil
	}
	if spec.AllowStaleConsent {
		rep.StaleConsentAllowed = true
		return nil
	}
	var age time.Duration
	if last != nil {
		age = time.Since(*last)
	}
	when := syncedWhen(last, age)
	if spec.BrandCode != "" && last == nil {
		var unbranded bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM iys_sync_state WHERE brand_code = '')`).Scan(&unbranded); err == nil && unbranded {
			when += fmt.Sprintf(" for brand %s (IYS_BRAND_CODE; the consents here were imported without a brand: import them again with IYS_BRAND_CODE set)", spec.BrandCode)
		}
	}
	return fmt.Errorf("%w: the İYS consents were brought up to date %s, longer ago than --max-consent-age %v; a RET given since then would be missed. Run `campaignctl iys sync` (or import a fresh complete İYS export; a sync is up to date with İYS as of an hour before it: under an hour, `iys sync --reverify`), or launch with --allow-stale-consent to go ahead anyway (it is recorded on the campaign)",
		ErrInvalid, when, spec.MaxConsentAge)
}

// consentSyncedAtSQL is the SQL expression of when the consents of the brand given by the SQL expression
// brand were last brought up to date: the latest import or re-verification, or the older of the two pulls
// (a pull of the brand's changes alone says nothing of the RETs citizens gave in İYS); NULL when never.
func consentSyncedAtSQL(brand string) string {
	return `greatest(
			(SELECT max(last_success_at) FROM iys_sync_state WHERE brand_code = ` + brand + ` AND source IN (` + quoteLiteral(iys.SourceImport) + `, ` + quoteLiteral(iys.SourceReverify) + `)),
			(SELECT CASE WHEN count(last_success_at) = 2 THEN min(last_success_at) END
			 FROM iys_sync_state WHERE brand_code = ` + brand + ` AND source IN (` + quoteLiteral(iys.SourcePullHS) + `, ` + quoteLiteral(iys.SourcePullIYS) + `)))`
}

// ConsentStale says why campaign c must not send now: it was launched with a maximum age of its consents
// (not allowing stale ones), and they were last brought up to date longer ago than that, as of the
// campaign's reading (Get, by Postgres's clock). "" when it may send.
func (c *Campaign) ConsentStale() string {
	return c.ConsentStaleThen(fmt.Sprintf("`campaignctl dlq retry --campaign %d`", c.ID))
}

// ConsentFreshFor is how long after the campaign's reading (Get) its consents stay young enough for it to
// send (ConsentStale): 0 when they are too old already; ok is false when no age is kept (none given, or
// stale consents allowed). A batch run long enough to outlive it reads the campaign again then.
func (c *Campaign) ConsentFreshFor() (d time.Duration, ok bool) {
	if c.MaxConsentAge <= 0 {
		return 0, false
	}
	if c.ConsentSyncedAt == nil {
		return 0, true
	}
	return max(0, c.MaxConsentAge-c.consentAge), true
}

// ConsentStaleThen is ConsentStale with next as the command to run once the consents are up to date.
func (c *Campaign) ConsentStaleThen(next string) string {
	if c.MaxConsentAge <= 0 {
		return ""
	}
	if c.ConsentSyncedAt != nil && c.consentAge <= c.MaxConsentAge {
		return ""
	}
	return fmt.Sprintf("the İYS consents of campaign %d were brought up to date %s, longer ago than the --max-consent-age %v it was launched with: a RET given since then would be missed. Run `campaignctl iys sync` (or import a fresh complete İYS export), then %s",
		c.ID, syncedWhen(c.ConsentSyncedAt, c.consentAge), c.MaxConsentAge, next)
}

// syncedWhen says when the consents were last brought up to date (at, age ago), or "never" (at nil).
func syncedWhen(at *time.Time, age time.Duration) string {
	if at == nil {
		return "never"
	}
	step := time.Minute
	if age < time.Hour {
		step = time.Second
	}
	return fmt.Sprintf("last at %s (%s ago)", at.UTC().Format(time.RFC3339), age.Round(step))
}

// brandGate refuses a launch under an İYS brand code whose audience has consents recorded only without a
// brand (imported before IYS_BRAND_CODE was set): they would all be excluded as no_consent, silently.
//
// And it refuses a launch without a brand code (reading the consents recorded without one) whose eligible
// recipients have a refusal recorded under a brand: `iys sync` records its brand, and a RET pulled from
// İYS would not be seen by this launch (an outside run pulled one for a number imported without a brand,
// and the launch counted the number eligible, with no word).
func (p *Planner) brandGate(ctx context.Context, tx pgx.Tx, spec Spec, rep *Report) error {
	rule := spec.consentRule()
	if spec.BrandCode == "" && rule.checksIYS() && rep.Eligible > 0 {
		var n int64
		var brand string
		args := params{}
		sql := `SELECT count(DISTINCT a.ord), coalesce(min(c.brand_code), '') FROM audience_classified a
			JOIN iys_consents c ON ` + rule.addressSQL("c", "a.address", args.bind) + `
				AND c.brand_code <> '' AND c.status <> ` + quoteLiteral(iys.StatusApproved) + `
			WHERE a.reason IS NULL`
		if err := tx.QueryRow(ctx, sql, args...).Scan(&n, &brand); err != nil {
			return fmt.Errorf("plan: brand check: %w", err)
		}
		if n > 0 {
			return fmt.Errorf("%w: IYS_BRAND_CODE is not set, so this launch reads the consents recorded without a brand, but %d of its eligible recipients have a RET recorded under brand %s (iys sync records its brand), which it would not see. Set IYS_BRAND_CODE=%s for launches as for iys sync, and import consent files with it set",
				ErrInvalid, n, brand, brand)
		}
		return nil
	}
	if spec.BrandCode == "" || !rule.checksIYS() || rep.Excluded[ReasonNoConsent] == 0 {
		return nil
	}
	var n int64
	args := params{ReasonNoConsent}
	// The consents the rule would read if they had been recorded without a brand (the statement is built
	// before it is run: its parameters are added as it is).
	sql := `SELECT count(*) FROM audience_classified a WHERE a.reason = $1 AND EXISTS (
			SELECT 1 FROM iys_consents c WHERE ` + rule.withBrand("").joinSQL("c", "a.address", args.bind) + `)`
	if err := tx.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		return fmt.Errorf("plan: brand check: %w", err)
	}
	if n == 0 {
		return nil
	}
	return fmt.Errorf("%w: IYS_BRAND_CODE is %q, but %d recipients of this audience have consents recorded without a brand (imported before IYS_BRAND_CODE was set), so they would be excluded as no_consent. Import the consent file again with IYS_BRAND_CODE=%s set (or run `campaignctl iys sync`, which records the brand), or launch without IYS_BRAND_CODE",
		ErrInvalid, spec.BrandCode, n, spec.BrandCode)
}

// keptConsentAge is the maximum age of its consents, in seconds, that a campaign planned from s keeps for
// its batches (Campaign.MaxConsentAge): the launch's, when the launch checked it and did not go ahead on
// stale consents; 0 otherwise.
func (s Spec) keptConsentAge(rep *Report) int64 {
	if !s.consentRule().checksIYS() || s.MaxConsentAge <= 0 || rep.StaleConsentAllowed || s.AllowStaleConsent {
		return 0
	}
	return int64(max(time.Second, s.MaxConsentAge) / time.Second)
}
