package iys

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/internal/pgtext"
)

// Where a refusal came from (Refusal.Via).
const (
	ViaOneClick      = "one_click"      // the signed unsubscribe link of an e-mail (List-Unsubscribe)
	ViaSendGrid      = "sendgrid"       // a SendGrid unsubscribe, group_unsubscribe or spamreport event
	ViaTwilioInbound = "twilio_inbound" // an SMS to the sender whose text is a refusal keyword
	// ViaTwilioOptOut: Twilio refused a message, when it was created or in its status callback, with error
	// 21610: the recipient had opted out with the brand's Twilio sender (replied STOP to it).
	ViaTwilioOptOut = "twilio_opt_out"
)

// The İYS sources of a RET the brand received through its own channels.
const (
	SourceEmail = "HS_EPOSTA"
	SourceSMS   = "HS_MESAJ"
)

// SourceRefusal names refusals in the consent history (iys_consent_history.origin).
const SourceRefusal = "refusal"

// Refusal is one refusal as it arrived: a person who said, through a message of the brand's, that they
// want no more.
type Refusal struct {
	// Via is where it came from (the Via constants), EventID what identifies it there, stable across a
	// provider's repeats (a SendGrid sg_event_id, a Twilio MessageSid, a link's campaign and user).
	Via, EventID string
	// Kind is the provider's name for it: unsubscribe, group_unsubscribe, spamreport, inbound, one_click.
	Kind string
	// Recipient is the address that refused, in any spelling; Type its İYS type (EPOSTA or MESAJ).
	Recipient, Type string
	// CampaignID and UserID name the campaign and audience row the refusal answered, when known.
	CampaignID int64
	UserID     string
	// Brand, when set, is the İYS brand whose messages the person refused, and only that brand's
	// consents turn RET (and wait for İYS): a one-click link or a SendGrid group_unsubscribe answers one
	// campaign's messages. Empty for a refusal of the sender itself (a SendGrid global unsubscribe or spam
	// report, an SMS "RET" to the number, which every brand sending through them shares): every brand's.
	Brand string
	// Evidence is a short text for the audit, without the address.
	Evidence string
	// At is when the person refused (the provider's event time).
	At time.Time
	// Suppressed marks a provider's word that it holds the address as refused (it dropped a message to
	// it), not the refusal itself: it is recorded only when no refusal of the address and type is recorded
	// already. A suppression outlives the refusal that made it, so one older than a consent given again
	// since must not refuse again; one that comes with no refusal recorded stands for a refusal whose
	// post was lost, dated when the drop was reported.
	Suppressed bool
}

// source is the İYS source a refusal of r's type is registered with (RefusalSource).
func (r Refusal) source() string { return RefusalSource(r.Type) }

// RefusalSource is the İYS source of a refusal of consent type typ received through the channel's own
// messages: HS_EPOSTA for EPOSTA, HS_MESAJ otherwise.
func RefusalSource(typ string) string {
	if typ == TypeEmail {
		return SourceEmail
	}
	return SourceSMS
}

// RefusalReport is what RecordRefusals did.
type RefusalReport struct {
	// Recorded is the number of refusals new to the engine; Repeats those recorded before (the same event
	// again, or a provider's suppression of an address whose refusal is recorded), which changed nothing.
	Recorded, Repeats int
	// Revoked is the number of stored consents turned from ONAY to RET; Outboxed the RETs queued for İYS.
	Revoked, Outboxed int
}

// ErrBadRefusal is returned, wrapped, for a refusal whose address is not one of its type.
var ErrBadRefusal = errors.New("unusable refusal")

// RecordRefusals makes each refusal a local RET at once, in one transaction: every stored consent of the
// address and type (every brand, or the refusal's Brand alone; both recipient types) that is ONAY and
// dated no later than the refusal becomes RET with the refusal's source and time (which moves
// iys_consents_version, so the next chunk of every running campaign skips the person as revoked, and the
// next launch excludes them as consent_ret); an address with no stored consent at all (of the refusal's
// Brand, when set) gets a RET of recipient type BIREYSEL under that Brand, or else under brand, so that it
// is excluded too. Each change is appended to the consent history (origin "refusal"), the refusal to the
// refusals audit, and each consent turned to RET to the İYS outbox (a consent already RET or never stored
// has nothing to register there). A refusal recorded before (same Via and EventID) changes nothing.
func RecordRefusals(ctx context.Context, pool *pgxpool.Pool, brand string, rs []Refusal) (RefusalReport, error) {
	var rep RefusalReport
	if len(rs) == 0 {
		return rep, nil
	}
	canon := make([]Refusal, len(rs))
	for i, r := range rs {
		if r.Type != "EPOSTA" && r.Type != "MESAJ" {
			return rep, fmt.Errorf("%w: type %q (want EPOSTA or MESAJ)", ErrBadRefusal, r.Type)
		}
		addr, err := CanonicalRecipient(r.Type, r.Recipient)
		if err != nil {
			return rep, fmt.Errorf("%w: %w", ErrBadRefusal, err)
		}
		if r.Via == "" || r.EventID == "" {
			return rep, fmt.Errorf("%w: no source or event ID", ErrBadRefusal)
		}
		// Text from a provider's post: one NUL would make Postgres refuse the whole transaction, the other
		// refusals with it, on every repeat of the post.
		r.Recipient, r.EventID, r.Kind, r.UserID = pgtext.Clean(addr), pgtext.Clean(r.EventID), pgtext.Clean(r.Kind), pgtext.Clean(r.UserID)
		if r.At.IsZero() {
			r.At = time.Now()
		}
		r.Evidence, r.Brand = pgtext.Clean(r.Evidence), pgtext.Clean(r.Brand)
		r.Evidence = pgtext.Cut(r.Evidence, 500)
		canon[i] = r
	}
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		rep = RefusalReport{}
		// Take turns with every writer of consents before any statement reads them (an import, a sync
		// page): a statement that waited for the version row in its trigger would go on with the snapshot
		// it took before waiting, and not see a consent the writer it waited for inserted, which would then
		// stand as ONAY, older than this refusal.
		if err := takeConsentsTurn(ctx, tx); err != nil {
			return fmt.Errorf("record refusal: %w", err)
		}
		for _, r := range canon {
			var id int64
			err := tx.QueryRow(ctx, `
				INSERT INTO refusals (via, event_id, kind, recipient, type, source, campaign_id, user_id, evidence, refused_at)
				SELECT $1, $2, $3, $4, $5, $6, NULLIF($7, 0), NULLIF($8, ''), $9, $10
				WHERE NOT ($11 AND EXISTS (SELECT 1 FROM refusals WHERE recipient = $4 AND type = $5))
				ON CONFLICT (via, event_id) DO NOTHING RETURNING id`,
				r.Via, r.EventID, r.Kind, r.Recipient, r.Type, r.source(), r.CampaignID, r.UserID, r.Evidence, r.At, r.Suppressed).Scan(&id)
			if errors.Is(err, pgx.ErrNoRows) {
				rep.Repeats++
				continue
			}
			if err != nil {
				return fmt.Errorf("record refusal: %w", err)
			}
			rep.Recorded++
			var revoked, outboxed int
			// One statement: the consents turned to RET, their history, and their outbox rows.
			err = tx.QueryRow(ctx, `
				WITH turned AS (
					UPDATE iys_consents SET status = 'RET', source = $3, transaction_id = NULL, updated_at = now(),
						-- A provider's RET here keeps its date when it is the later: an ONAY between the two must not win.
						consent_date = CASE WHEN status = 'RET' THEN greatest(consent_date, $4) ELSE $4 END
					WHERE recipient = $1 AND type = $2 AND ($7 = '' OR brand_code = $7)
						-- An ONAY stands when it was given after the refusal (a late event's): one dated later but
						-- stored here before the refusal happened was not (a clock ahead, a date in the future).
						AND (status = 'ONAY' AND least(consent_date, updated_at) <= $4 OR status = 'RET' AND starts_with(source, '`+ProviderSourcePrefix+`'))
					RETURNING recipient, type, recipient_type, brand_code
				), hist AS (
					INSERT INTO iys_consent_history (recipient, type, recipient_type, brand_code, status, source, consent_date, origin)
					SELECT recipient, type, recipient_type, brand_code, 'RET', $3, $4, 'refusal' FROM turned
				), queued AS (
					INSERT INTO iys_outbox (refusal_id, brand_code, recipient, type, recipient_type, source, consent_date, due_at)
					SELECT $5, brand_code, recipient, type, recipient_type, $3, $4, $6 FROM turned
					`+outboxOneWaitingSQL+`
					RETURNING 1
				)
				SELECT (SELECT count(*) FROM turned), (SELECT count(*) FROM queued)`,
				r.Recipient, r.Type, r.source(), r.At, id, AddBusinessDays(r.At, 2), r.Brand).Scan(&revoked, &outboxed)
			if err != nil {
				return fmt.Errorf("record refusal: revoke the consents: %w", err)
			}
			if revoked == 0 {
				// Nothing stored was ONAY: a RET is stored where no consent is (of the refused brand, when
				// the refusal names one), so the address is excluded from now on even where a campaign would
				// not read İYS's answer for it.
				under := brand
				if r.Brand != "" {
					under = r.Brand
				}
				if _, err := tx.Exec(ctx, `
					WITH ins AS (
						INSERT INTO iys_consents (recipient, type, recipient_type, brand_code, status, source, consent_date)
						SELECT $1, $2, 'BIREYSEL', $3, 'RET', $4, $5
						WHERE NOT EXISTS (SELECT 1 FROM iys_consents WHERE recipient = $1 AND type = $2 AND ($6 = '' OR brand_code = $6))
						RETURNING recipient, type, recipient_type, brand_code
					)
					INSERT INTO iys_consent_history (recipient, type, recipient_type, brand_code, status, source, consent_date, origin)
					SELECT recipient, type, recipient_type, brand_code, 'RET', $4, $5, 'refusal' FROM ins`,
					r.Recipient, r.Type, under, r.source(), r.At, r.Brand); err != nil {
					return fmt.Errorf("record refusal: store the RET: %w", err)
				}
			}
			if _, err := tx.Exec(ctx, `UPDATE refusals SET consents = $2 WHERE id = $1`, id, revoked); err != nil {
				return fmt.Errorf("record refusal: %w", err)
			}
			rep.Revoked += revoked
			rep.Outboxed += outboxed
		}
		return nil
	})
	if err != nil {
		return RefusalReport{}, err
	}
	return rep, nil
}

// turkishHolidays are the fixed-date public holidays (month, day) that are not business days: New Year,
// National Sovereignty and Children's Day, Labour Day, Youth Day, Democracy Day, Victory Day, Republic
// Day. The religious holidays move with the lunar calendar and are not counted: a deadline computed here
// is never later than the real one.
var turkishHolidays = map[[2]int]bool{{1, 1}: true, {4, 23}: true, {5, 1}: true, {5, 19}: true, {7, 15}: true, {8, 30}: true, {10, 29}: true}

// BusinessDay tells whether t's day in Istanbul is a business day (not a weekend or a fixed holiday).
func BusinessDay(t time.Time) bool {
	t = t.In(istanbul)
	if wd := t.Weekday(); wd == time.Saturday || wd == time.Sunday {
		return false
	}
	return !turkishHolidays[[2]int{int(t.Month()), t.Day()}]
}

// AddBusinessDays returns t moved n business days on (Istanbul days): the time of day is kept, weekends
// and fixed holidays are skipped.
func AddBusinessDays(t time.Time, n int) time.Time {
	d := t.In(istanbul)
	for n > 0 {
		d = d.AddDate(0, 0, 1)
		if BusinessDay(d) {
			n--
		}
	}
	return d
}

// takeConsentsTurn makes tx wait for, then hold up, every other writer of consents (a refusal, an import,
// a sync page, a re-verification) until it ends. Each takes it before any of its statements reads a
// consent or a refusal: a statement's snapshot is taken when it starts, and one that began while another
// writer's transaction was open would not see what that writer commits (an ONAY a sync stored, a refusal
// that turns it), then store its own decision on the older picture. The consents' version row is the
// turn: the statement trigger on iys_consents takes it anyway, so taking it first also keeps one order of
// locks for every writer.
func takeConsentsTurn(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `SELECT 1 FROM iys_consents_version FOR UPDATE`)
	return err
}

// outboxOneWaitingSQL ends an INSERT of RETs into iys_outbox: one RET waits per consent, and a newer one
// moves a waiting RET to its date (İYS keeps the latest decision: sent with the older date, it would lose
// to an ONAY given in between). One already sent does not hold a newer RET back (schema 19).
const outboxOneWaitingSQL = `ON CONFLICT (brand_code, recipient, type, recipient_type) WHERE state = 'waiting' DO UPDATE SET
	refusal_id = EXCLUDED.refusal_id, source = EXCLUDED.source, consent_date = EXCLUDED.consent_date
	WHERE iys_outbox.consent_date < EXCLUDED.consent_date`

// OriginProvider is the consent history's origin of a consent a provider refused to use (see NoConsent).
const OriginProvider = "provider"

// ProviderSourcePrefix begins the source of a RET a provider's word made here (RecordNoConsent): a RET
// known here only. A refusal of the person's that comes later still turns it, and goes to İYS.
const ProviderSourcePrefix = "provider: "

// NoConsent is a provider's refusal of a message for want of consent: Netgsm asked İYS and found none
// (code 50), or the recipient opted out with Twilio (21610).
type NoConsent struct {
	// Recipient is the address, Type and RecipientType the consent it was sent under.
	Recipient, Type, RecipientType string
	// Source names the provider's word ("netgsm 50"), kept as the consent's source here.
	Source string
	// At is when the provider refused.
	At time.Time
}

// RecordNoConsent turns to RET the stored ONAYs of brand that providers refused to use, dated when they
// refused, and appends each to the history (origin provider). Nothing is queued for İYS: the person
// refused nothing through the brand's channels, and İYS itself (through Netgsm) is what said no. A
// re-verification, or a newer ONAY pulled from İYS, sets a consent back. It returns how many it turned.
func RecordNoConsent(ctx context.Context, pool *pgxpool.Pool, brand string, ns []NoConsent) (int64, error) {
	if len(ns) == 0 {
		return 0, nil
	}
	rec, typ, rtype, src, at := make([]string, len(ns)), make([]string, len(ns)), make([]string, len(ns)), make([]string, len(ns)), make([]time.Time, len(ns))
	for i, n := range ns {
		rec[i], typ[i], rtype[i], src[i], at[i] = pgtext.Clean(n.Recipient), n.Type, n.RecipientType, ProviderSourcePrefix+pgtext.Clean(n.Source), n.At
		if at[i].IsZero() {
			at[i] = time.Now()
		}
	}
	var turned int64
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		if err := takeConsentsTurn(ctx, tx); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `
			WITH n AS (
				SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::timestamptz[]) AS n(recipient, type, recipient_type, source, at)
			), turned AS (
				UPDATE iys_consents c SET status = 'RET', source = n.source, consent_date = n.at, transaction_id = NULL, updated_at = now()
				FROM n
				WHERE c.recipient = n.recipient AND c.type = n.type AND c.recipient_type = n.recipient_type AND c.brand_code = $6
					AND c.status = 'ONAY' AND least(c.consent_date, c.updated_at) <= n.at
				RETURNING c.recipient, c.type, c.recipient_type, c.brand_code, c.source, c.consent_date
			), hist AS (
				INSERT INTO iys_consent_history (recipient, type, recipient_type, brand_code, status, source, consent_date, origin)
				SELECT recipient, type, recipient_type, brand_code, 'RET', source, consent_date, $7 FROM turned
			)
			SELECT count(*) FROM turned`, rec, typ, rtype, src, at, brand, OriginProvider).Scan(&turned)
	})
	if err != nil {
		return 0, fmt.Errorf("record a provider's refusal for want of consent: %w", err)
	}
	return turned, nil
}
