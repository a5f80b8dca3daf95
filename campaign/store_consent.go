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
	// Up to date as of the latest import or re-verification, or of the older of the two pulls: a pull of
	// the brand's changes alone says nothing of the RETs citizens gave in İYS.
	if err := tx.QueryRow(ctx, `SELECT greatest(
			(SELECT max(last_success_at) FROM iys_sync_state WHERE brand_code = $1 AND source IN (`+quoteLiteral(iys.SourceImport)+`, `+quoteLiteral(iys.SourceReverify)+`)),
			(SELECT CASE WHEN count(last_success_at) = 2 THEN min(last_success_at) END
			 FROM iys_sync_state WHERE brand_code = $1 AND source IN (`+quoteLiteral(iys.SourcePullHS)+`, `+quoteLiteral(iys.SourcePullIYS)+`)))`, spec.BrandCode).Scan(&last); err != nil {
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

// brandGate refuses a launch under an İYS brand code whose audience has consents recorded only without a
// brand (imported before IYS_BRAND_CODE was set): they would all be excluded as no_consent, silently.
func (p *Planner) brandGate(ctx context.Context, tx pgx.Tx, spec Spec, rep *Report) error {
	rule := spec.consentRule()
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
