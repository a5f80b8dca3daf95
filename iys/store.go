package iys

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrNoConsent is returned by Lookup when no consent is stored for the key.
var ErrNoConsent = errors.New("no İYS consent")

// Consent is one stored İYS consent.
type Consent struct {
	Recipient     string    `json:"recipient"`      // canonical: E.164 phone or lower-case e-mail
	Type          string    `json:"type"`           // MESAJ, EPOSTA or ARAMA
	RecipientType string    `json:"recipient_type"` // BIREYSEL or TACIR
	Status        string    `json:"status"`         // ONAY or RET
	Source        string    `json:"source"`         // as İYS or the import file gave it; may be empty
	ConsentDate   time.Time `json:"consent_date"`   // in Europe/Istanbul
	UpdatedAt     time.Time `json:"updated_at"`     // when this row was last written locally
}

// progressEvery is how many rows pass between two Progress calls.
const progressEvery = 10_000

// importWorkMem lets the in-file de-duplication sort a couple of million rows in memory instead of spilling
// to disk; it applies to the import's own transaction only.
const importWorkMem = "256MB"

// Import loads a consent CSV file (see Header and DateLayout) into iys_consents, all or nothing.
//
// Every line is validated and its recipient canonicalised for its type (CanonicalPhone for MESAJ and ARAMA,
// CanonicalEmail for EPOSTA); the first malformed line fails the whole import with a *LineError and nothing
// is written. Within the file the latest consent_date wins for each key (on a tie, the later line); a row
// then replaces the stored consent only if its consent_date is later, or the same and it is not an ONAY
// over a stored RET, because İYS keeps the latest decision and the order of two of one second is not known.
//
// The file is streamed: rows are validated as they are read and copied into a temporary table with COPY,
// so memory stays flat whatever the file's size; the merge is then a few set-based statements (see merge),
// all in one transaction, so a concurrent reader sees either none or all of the file. While the merge
// runs, other writers of iys_consents wait; readers do not.
//
// On a 2-core machine with a local Postgres 15, 1.7 million rows take about 12 s into an empty table or when
// nothing changes, and about 28 s when every stored consent is replaced (Postgres rewrites each row and its
// index entry; see BenchmarkImport).
func Import(ctx context.Context, pool *pgxpool.Pool, r io.Reader, opts ImportOptions) (ImportReport, error) {
	var rep ImportReport
	tx, err := pool.Begin(ctx)
	if err != nil {
		return rep, fmt.Errorf("import consents: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck

	if _, err := tx.Exec(ctx, `SET LOCAL work_mem = '`+importWorkMem+`'`); err != nil {
		return rep, fmt.Errorf("import consents: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE TEMP TABLE iys_import (
		line            bigint      NOT NULL,
		recipient       text        NOT NULL,
		type            text        NOT NULL,
		recipient_type  text        NOT NULL,
		status          text        NOT NULL,
		source          text        NOT NULL,
		consent_date    timestamptz NOT NULL
	) ON COMMIT DROP`); err != nil {
		return rep, fmt.Errorf("import consents: staging table: %w", err)
	}

	src := &consentSource{rd: newConsentReader(r), progress: opts.Progress}
	n, err := tx.CopyFrom(ctx, pgx.Identifier{"iys_import"},
		[]string{"line", "recipient", "type", "recipient_type", "status", "source", "consent_date"}, src)
	if src.err != nil {
		return rep, src.err // a *LineError or a read error, already with its context
	}
	if err != nil {
		return rep, fmt.Errorf("import consents: copy: %w", err)
	}
	rep.Rows = n
	if opts.Progress != nil {
		opts.Progress(n)
	}
	if n == 0 {
		// Nothing to merge, and nothing that says the consents are up to date: an empty export (a failed
		// download, the wrong file) must not make them look fresh to the launches' --max-consent-age.
		return rep, &LineError{Line: 2, Msg: "the file has no consent rows after its header; give the export of İYS consents (the header, then one row a consent)"}
	}

	// A temporary table gets no statistics by itself (autovacuum does not see it).
	if _, err := tx.Exec(ctx, `ANALYZE iys_import`); err != nil {
		return rep, fmt.Errorf("import consents: staging table: %w", err)
	}
	keys, inserted, updated, err := merge(ctx, tx, opts.BrandCode)
	if err != nil {
		return rep, fmt.Errorf("import consents: merge: %w", err)
	}
	if rep.Requeued, err = requeueOverruled(ctx, tx, opts.BrandCode); err != nil {
		return rep, fmt.Errorf("import consents: refusals İYS does not hold: %w", err)
	}
	// A complete export from İYS brings the consents up to date as a pull does: launches check how long
	// ago. A partial file does not: a RET given in İYS since the last complete look would be missed.
	// The merge has just written the history of every consent it inserted or changed, in this transaction:
	// the statistics autovacuum keeps cannot know those rows yet. With the history's from an emptier table
	// (a few rows of this brand), the look for the stored consents the file does not list (missingFromFile)
	// was planned as a scan of the whole file for each stored consent: 20,000 new rows over 9,000 stored
	// took 45 s, 200,000 did not end in 10 minutes. ANALYZE reads a sample (30,000 rows at most) and counts
	// this transaction's rows.
	if _, err := tx.Exec(ctx, `ANALYZE iys_consent_history`); err != nil {
		return rep, fmt.Errorf("import consents: %w", err)
	}
	if rep.Missing, err = missingFromFile(ctx, tx, opts.BrandCode); err != nil {
		return rep, fmt.Errorf("import consents: %w", err)
	}
	if rep.Missing == 0 {
		if err := MarkSynced(ctx, tx, opts.BrandCode, SourceImport, 0); err != nil {
			return rep, fmt.Errorf("import consents: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return rep, fmt.Errorf("import consents: commit: %w", err)
	}
	rep.Superseded = rep.Rows - keys
	rep.Inserted = inserted
	rep.Updated = updated
	rep.Unchanged = keys - inserted - updated
	return rep, nil
}

// latestSQL keeps, for each key in the staged file, the row with the latest consent_date; of two of one
// second, a RET (İYS's dates are whole seconds: the order of the two decisions is not known, and the
// import sides with the refusal, as the merge does with a stored RET), then the latest line. DISTINCT ON
// keeps the first row of each group in ORDER BY order. COLLATE "C" makes the sort
// a byte comparison whatever the database's collation (equality is the same), and the output order is the
// primary key's, so the inserts that follow fill index pages left to right instead of at random.
const latestSQL = `
	SELECT DISTINCT ON (recipient COLLATE "C", type COLLATE "C", recipient_type COLLATE "C")
	       recipient, type, recipient_type, status, source, consent_date
	FROM iys_import
	ORDER BY recipient COLLATE "C", type COLLATE "C", recipient_type COLLATE "C", consent_date DESC, status = 'RET' DESC, line DESC`

// merge folds the staged rows into iys_consents and returns how many distinct keys the file had, how many
// of them were inserted and how many updated.
//
// It takes a SHARE ROW EXCLUSIVE lock first: readers (planning, send-time checks) carry on, but other
// writers of consents wait until this import commits. That lets it use a plain INSERT for new keys and an
// UPDATE … FROM for existing ones, which on a million rows is about twice as fast as INSERT … ON CONFLICT
// (whose speculative insertion probes the index twice and logs twice as much), and it means a key cannot
// appear between the check and the insert.
func merge(ctx context.Context, tx pgx.Tx, brand string) (keys, inserted, updated int64, err error) {
	// The consents' turn before the table's lock: every writer takes the two in this order (a refusal
	// holds the turn when it writes its RET), and the import's statements read every refusal committed
	// before it (takeConsentsTurn).
	if err := takeConsentsTurn(ctx, tx); err != nil {
		return 0, 0, 0, err
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE iys_consents IN SHARE ROW EXCLUSIVE MODE`); err != nil {
		return 0, 0, 0, err
	}
	var empty bool
	if err := tx.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM iys_consents WHERE brand_code = $1)`, brand).Scan(&empty); err != nil {
		return 0, 0, 0, err
	}
	if empty { // the first import: nothing to compare with, so skip the staging copy and the joins
		var n int64
		err := tx.QueryRow(ctx, `
			WITH ins AS (
				INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date, brand_code)
				SELECT l.recipient, l.type, l.recipient_type, `+afterRefusalSQL+`, $1
				FROM (`+latestSQL+`) l LEFT JOIN `+refusedSQL+` f ON f.recipient = l.recipient AND f.type = l.type
				RETURNING recipient, type, recipient_type, status, source, consent_date
			), hist AS (`+historySQL+`)
			SELECT count(*) FROM ins`, brand).Scan(&n)
		if err != nil {
			return 0, 0, 0, err
		}
		return n, n, 0, nil
	}

	tag, err := tx.Exec(ctx, `CREATE TEMP TABLE iys_latest ON COMMIT DROP AS`+latestSQL)
	if err != nil {
		return 0, 0, 0, err
	}
	keys = tag.RowsAffected()
	if _, err := tx.Exec(ctx, `ANALYZE iys_latest`); err != nil { // temp tables get no autovacuum statistics
		return 0, 0, 0, err
	}
	// A stored consent is replaced by a same-date or later one (İYS keeps the latest decision), and only if
	// something differs, so that importing a file twice reports it unchanged and writes nothing.
	err = tx.QueryRow(ctx, `
		WITH l AS (
			-- An ONAY given before a refusal of its address is that refusal's RET (afterRefusalSQL): a file
			-- must not undo a refusal made here after the consent it carries.
			SELECT l.recipient, l.type, l.recipient_type, `+afterRefusalSQL+`
			FROM iys_latest l LEFT JOIN `+refusedSQL+` f ON f.recipient = l.recipient AND f.type = l.type
		), ins AS (
			UPDATE iys_consents c
			SET status = l.status, source = l.source, consent_date = l.consent_date, updated_at = now()
			FROM l
			WHERE c.recipient = l.recipient AND c.type = l.type AND c.recipient_type = l.recipient_type AND c.brand_code = $1
			  AND (l.consent_date > c.consent_date
			       -- Two decisions of one second (İYS's dates are whole seconds): their order is not known,
			       -- and a stored RET stays, as a sync keeps it (ApplyChanges).
			       OR l.consent_date = c.consent_date AND NOT (c.status = 'RET' AND l.status = 'ONAY'))
			  AND (c.status, c.source, c.consent_date) IS DISTINCT FROM (l.status, l.source, l.consent_date)
			RETURNING c.recipient, c.type, c.recipient_type, c.status, c.source, c.consent_date
		), hist AS (`+historySQL+`)
		SELECT count(*) FROM ins`, brand).Scan(&updated)
	if err != nil {
		return 0, 0, 0, err
	}
	err = tx.QueryRow(ctx, `
		WITH ins AS (
			INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date, brand_code)
			SELECT l.recipient, l.type, l.recipient_type, `+afterRefusalSQL+`, $1
			FROM iys_latest l LEFT JOIN `+refusedSQL+` f ON f.recipient = l.recipient AND f.type = l.type
			WHERE NOT EXISTS (SELECT 1 FROM iys_consents c
			                  WHERE c.recipient = l.recipient AND c.type = l.type AND c.recipient_type = l.recipient_type
			                    AND c.brand_code = $1)
			RETURNING recipient, type, recipient_type, status, source, consent_date
		), hist AS (`+historySQL+`)
		SELECT count(*) FROM ins`, brand).Scan(&inserted)
	if err != nil {
		return 0, 0, 0, err
	}
	return keys, inserted, updated, nil
}

// missingFromFile counts the consents stored for brand that came from İYS's data (an import, a pull or a
// re-verification wrote them: their history says so) and that the staged file does not list. Consents
// known here only (a refusal of an address İYS holds nothing for, a row an operator inserted) do not
// count: a complete export does not list them either.
func missingFromFile(ctx context.Context, tx pgx.Tx, brand string) (int64, error) {
	var n int64
	err := tx.QueryRow(ctx, `
		SELECT count(*) FROM iys_consents c
		WHERE c.brand_code = $1
		  AND NOT EXISTS (SELECT 1 FROM iys_import i
			WHERE i.recipient = c.recipient AND i.type = c.type AND i.recipient_type = c.recipient_type)
		  AND EXISTS (SELECT 1 FROM iys_consent_history h
			WHERE h.recipient = c.recipient AND h.type = c.type AND h.recipient_type = c.recipient_type
			  AND h.brand_code = c.brand_code AND h.origin IN ('import', '`+OriginPull+`', '`+OriginReverify+`'))`, brand).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("consents not in the file: %w", err)
	}
	return n, nil
}

// requeueOverruled queues for İYS the refusals made here that the staged file shows İYS does not hold: the
// file's latest row of a key is an ONAY older than the newest refusal of its address (stored as that
// refusal's RET by afterRefusalSQL). That refusal's RET has not reached İYS under this brand (it found no
// consent here and queued nothing, say), so it is queued now, as a sync does (ApplyChanges), unless a RET
// at least as new is on its way or registered. It is due two days after the refusal. Only the file's rows
// of refused addresses are read.
func requeueOverruled(ctx context.Context, tx pgx.Tx, brand string) (int64, error) {
	tag, err := tx.Exec(ctx, `
		WITH l AS (
			SELECT DISTINCT ON (i.recipient, i.type, i.recipient_type) i.recipient, i.type, i.recipient_type, i.status, i.consent_date
			FROM iys_import i
			WHERE EXISTS (SELECT 1 FROM refusals r WHERE r.recipient = i.recipient AND r.type = i.type)
			ORDER BY i.recipient, i.type, i.recipient_type, i.consent_date DESC, i.status = 'RET' DESC, i.line DESC
		)
		INSERT INTO iys_outbox (refusal_id, brand_code, recipient, type, recipient_type, source, consent_date, due_at)
		SELECT f.id, $1, l.recipient, l.type, l.recipient_type, f.source, f.refused_at, f.refused_at + interval '2 days'
		FROM l JOIN `+refusedSQL+` f ON f.recipient = l.recipient AND f.type = l.type
		WHERE l.status = 'ONAY' AND f.refused_at > l.consent_date
		  AND NOT EXISTS (SELECT 1 FROM iys_outbox x
			WHERE x.brand_code = $1 AND x.recipient = l.recipient AND x.type = l.type
			  AND x.recipient_type = l.recipient_type AND x.state <> 'refused' AND x.consent_date >= f.refused_at)
		`+outboxOneWaitingSQL, brand)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// refusedSQL is the newest local refusal (RecordRefusals) of each address and type, joined as f.
const refusedSQL = `(SELECT DISTINCT ON (recipient, type) id, recipient, type, refused_at, source FROM refusals
	ORDER BY recipient, type, refused_at DESC)`

// afterRefusalSQL is the status, source and consent date of a consent l about to be stored under a new
// key, with f its address's newest refusal (refusedSQL, LEFT JOINed): an ONAY given before the refusal
// is stored as the refusal's RET. A refusal turns every stored consent of its address and type to RET,
// whatever the recipient type and brand, and one of those stored only later (a TACIR record, another
// brand's) must not stand as ONAY either.
const afterRefusalSQL = `
	CASE WHEN l.status = 'ONAY' AND f.refused_at > l.consent_date THEN 'RET' ELSE l.status END AS status,
	CASE WHEN l.status = 'ONAY' AND f.refused_at > l.consent_date THEN f.source ELSE l.source END AS source,
	CASE WHEN l.status = 'ONAY' AND f.refused_at > l.consent_date THEN f.refused_at ELSE l.consent_date END AS consent_date`

// historySQL appends every consent an import changed (the CTE "ins", brand $1) to the history.
const historySQL = `
	INSERT INTO iys_consent_history (recipient, type, recipient_type, brand_code, status, source, consent_date, origin)
	SELECT recipient, type, recipient_type, $1, status, source, consent_date, 'import' FROM ins`

// consentSource feeds validated rows to COPY as they are read, so the file is never held in memory. pgx
// calls it from its own goroutine.
type consentSource struct {
	rd       *consentReader
	progress func(int64)
	row      consentRow
	vals     [7]any
	rows     int64
	err      error
}

func (s *consentSource) Next() bool {
	if s.err != nil {
		return false
	}
	row, err := s.rd.next()
	if err != nil {
		if err != io.EOF {
			s.err = err
		}
		return false
	}
	s.row = row
	s.rows++
	if s.progress != nil && s.rows%progressEvery == 0 {
		s.progress(s.rows)
	}
	return true
}

func (s *consentSource) Values() ([]any, error) {
	r := &s.row
	s.vals = [7]any{r.line, r.recipient, r.typ, r.recipientType, r.status, r.source, r.consentDate}
	return s.vals[:], nil
}

func (s *consentSource) Err() error { return s.err }

// Lookup returns the stored consent for (recipient, typ, recipientType). The recipient is canonicalised for
// typ first, so any spelling of the address finds it. It returns an error wrapping ErrNoConsent when there
// is none, and ErrInvalidPhone, ErrInvalidEmail or ErrInvalidType for an unusable key.
func Lookup(ctx context.Context, pool *pgxpool.Pool, recipient, typ, recipientType string) (Consent, error) {
	return LookupBrand(ctx, pool, "", recipient, typ, recipientType)
}

// LookupBrand is Lookup for the consents of one brand (its İYS brand code; "" for consents imported
// without one).
func LookupBrand(ctx context.Context, pool *pgxpool.Pool, brand, recipient, typ, recipientType string) (Consent, error) {
	canon, err := CanonicalRecipient(typ, recipient)
	if err != nil {
		return Consent{}, fmt.Errorf("lookup consent: %w", err)
	}
	c := Consent{Recipient: canon, Type: typ, RecipientType: recipientType}
	err = pool.QueryRow(ctx, `
		SELECT status, source, consent_date, updated_at FROM iys_consents
		WHERE recipient = $1 AND type = $2 AND recipient_type = $3 AND brand_code = $4`,
		canon, typ, recipientType, brand).Scan(&c.Status, &c.Source, &c.ConsentDate, &c.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Consent{}, fmt.Errorf("lookup consent %s %s: %w", typ, recipientType, ErrNoConsent)
	}
	if err != nil {
		return Consent{}, fmt.Errorf("lookup consent: %w", err)
	}
	c.ConsentDate = c.ConsentDate.In(istanbul)
	return c, nil
}

// Unbranded counts the consents stored without a brand (imported before IYS_BRAND_CODE was set): a
// brand's launches, syncs and re-verifications do not count them as the brand's.
func Unbranded(ctx context.Context, db *pgxpool.Pool) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, `SELECT count(*) FROM iys_consents WHERE brand_code = ''`).Scan(&n); err != nil {
		return 0, fmt.Errorf("consents without a brand: %w", err)
	}
	return n, nil
}

// SourceImport names CSV imports in iys_sync_state.
const SourceImport = "import"

// MarkSynced records, inside tx, that the consents were brought up to date through source (an İYS pull
// source, a re-verification, or an import) as of behind before now, by Postgres's clock: what İYS knew
// then is here, what it learnt since may not be (a pull leaves out the last PullLag, a re-verification
// asked about its first recipients when it began).
func MarkSynced(ctx context.Context, tx pgx.Tx, brand, source string, behind time.Duration) error {
	_, err := tx.Exec(ctx, `INSERT INTO iys_sync_state (brand_code, source, last_success_at)
		VALUES ($1, $2, now() - make_interval(secs => $3::float8))
		ON CONFLICT (brand_code, source) DO UPDATE SET last_success_at = EXCLUDED.last_success_at`, brand, source, behind.Seconds())
	if err != nil {
		return fmt.Errorf("record the consent sync: %w", err)
	}
	return nil
}
