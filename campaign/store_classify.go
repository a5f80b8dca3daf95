package campaign

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// classify gives every staged audience row its reason for exclusion (none: eligible) in the temporary
// table audience_classified, and counts the rows by reason into rep. It returns the consents' version it
// read before the consents (nil when İYS is not consulted).
func (p *Planner) classify(ctx context.Context, tx pgx.Tx, spec Spec, tmpl *Template, rep *Report) (*int64, error) {
	t0 := time.Now()
	rule := spec.consentRule()
	// Who got a message on this channel within the frequency cap, across campaigns: the audit log's sent
	// entries of that time (its BRIN index on the time finds them without touching the rest), each
	// recipient still sent since then (its row, by its key). Every transition to sent is logged by the
	// statement that makes it, at or after the recipient's sent_at (migration 0012).
	if _, err := tx.Exec(ctx, fmt.Sprintf(`CREATE TEMP TABLE recent_sends ON COMMIT DROP AS
		SELECT DISTINCT s.address
		FROM send_log l
		JOIN campaigns c ON c.id = l.campaign_id
		JOIN campaign_recipients s ON s.campaign_id = l.campaign_id AND s.user_id = l.user_id
		WHERE %[3]t AND l.status = `+sqlSent+` AND l.at > now() - interval '%[1]d seconds' AND c.channel = '%[2]s'
		  AND NOT c.transactional
		  AND s.status = `+sqlSent+` AND s.sent_at > now() - interval '%[1]d seconds'`,
		// A cap of 0 is none: not even a message sent while this launch plans (now() is when its
		// transaction began) excludes anyone. The cap is about commercial messages: a transactional one
		// is neither held back by it nor counted for it.
		int64(spec.FrequencyCap/time.Second), spec.Channel, spec.FrequencyCap > 0 && !spec.Transactional)); err != nil {
		return nil, fmt.Errorf("plan: recent sends: %w", err)
	}

	// The consents' version, read before the consents themselves: a change committed after this read
	// moves the version past what the campaign keeps, so the leases read every consent again; one
	// committed before it is seen by the classification below (see migration 0007).
	var consentVersion *int64
	if rule.checksIYS() {
		var v int64
		if err := tx.QueryRow(ctx, `SELECT version FROM iys_consents_version`).Scan(&v); err != nil {
			return nil, fmt.Errorf("plan: consent version: %w", err)
		}
		consentVersion = &v
	}

	// Addresses providers condemned (unregistered push tokens): joined only when the channel has any, so
	// that a million-row audience does not probe an empty table a million times.
	var invalidJoin, invalidTest string
	var anyInvalid bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM invalid_addresses WHERE channel = $1)`, spec.Channel).Scan(&anyInvalid); err != nil {
		return nil, fmt.Errorf("plan: invalid addresses: %w", err)
	}
	if anyInvalid {
		invalidJoin = `LEFT JOIN invalid_addresses ia ON ia.channel = ` + quoteLiteral(string(spec.Channel)) + ` AND ia.address = a.address`
		invalidTest = ` OR ia.address IS NOT NULL`
	}
	// Each row's own reason (its address, its values, its consent, the frequency cap).
	ownSQL := `SELECT a.*,
				c.status AS c_status, c.source AS c_source, c.consent_date AS c_date, c.transaction_id AS c_txn,
				coalesce(c.synced_at, c.updated_at) AS c_synced,
				CASE WHEN a.user_id IS NULL THEN '` + ReasonMissingUser + `'
				     WHEN a.address IS NULL` + invalidTest + ` THEN '` + ReasonInvalidAddress + `'
				     WHEN ` + missingValueTest(tmpl, spec.Channel) + ` THEN '` + ReasonMissingValue + `'
				     WHEN ` + headerValueTest(tmpl, spec.Channel) + ` THEN '` + ReasonInvalidValue + `'
				     ELSE coalesce(` + rule.refusalSQL("c.status", "a.vars") + `,
				          CASE WHEN r.address IS NOT NULL THEN '` + ReasonFrequencyCap + `' END)
				END AS own_reason
			FROM audience_stage a LEFT JOIN iys_consents c ON ` + rule.joinSQL("c", "a.address", quoteLiteral) + `
			` + invalidJoin + `
			LEFT JOIN recent_sends r ON r.address = a.address`
	// An audience with no user and no address twice (the usual one) needs no ranking: every row's reason
	// is its own, and the three sorts of a million rows are spared (hash aggregates find the duplicates).
	var dup bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM audience_stage WHERE user_id IS NOT NULL GROUP BY user_id HAVING count(*) > 1)
		OR EXISTS (SELECT 1 FROM audience_stage WHERE address IS NOT NULL GROUP BY address HAVING count(*) > 1)`).Scan(&dup); err != nil {
		return nil, fmt.Errorf("plan: duplicates: %w", err)
	}
	classified := `SELECT a.ord, a.user_id, a.address, a.vars, a.raw_address, a.c_status, a.c_source, a.c_date, a.c_txn, a.c_synced,
			a.own_reason AS reason FROM (` + ownSQL + `) a`
	if dup {
		var err error
		if classified, err = p.takeInOrder(ctx, tx, ownSQL); err != nil {
			return nil, err
		}
	}
	if _, err := tx.Exec(ctx, `CREATE TEMP TABLE audience_classified ON COMMIT DROP AS `+classified); err != nil {
		return nil, fmt.Errorf("plan: classify audience: %w", err)
	}
	p.step("classify", t0)

	rows, err := tx.Query(ctx, `SELECT reason, count(*) FROM audience_classified GROUP BY reason`)
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	for rows.Next() {
		var reason *string
		var n int64
		if err := rows.Scan(&reason, &n); err != nil {
			rows.Close()
			return nil, fmt.Errorf("plan: %w", err)
		}
		rep.Audience += n
		if reason == nil {
			rep.Eligible = n
		} else {
			rep.Excluded[*reason] = n
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	return consentVersion, nil
}

// takeInOrder classifies an audience with duplicates (a user on several rows, or several users on one
// address): the rows are taken one by one in the query's order, and a row that can be sent (no reason of
// its own) is planned when neither its user nor its address is planned yet. So of a customer's rows the
// first that can be sent on an address still free is planned, and of the customers on one address the
// first that can be sent there: a CRM's row without a phone, or with a refused number, ahead of the
// customer's good row does not lose the customer, and a customer whose first number went to another
// keeps their own other number, however the rows chain. A row not planned says why: duplicate_user when
// its customer is planned on another row, else its own reason, else duplicate_address (its address went
// to another customer).
//
// Only the rows that can be sent and share a user or an address with another such row are contested: they
// are read in order (a user and an address each as two 64-bit hashes, not as text) and the ones that lose
// are written back; every other row is decided by its own reason alone. It returns the classification's
// SQL over the rows' own reasons (audience_own).
func (p *Planner) takeInOrder(ctx context.Context, tx pgx.Tx, ownSQL string) (string, error) {
	if _, err := tx.Exec(ctx, `CREATE TEMP TABLE audience_own ON COMMIT DROP AS `+ownSQL); err != nil {
		return "", fmt.Errorf("plan: classify audience: %w", err)
	}
	// Joins, not IN (…) OR IN (…): a subplan too large for memory would be scanned again for every row.
	rows, err := tx.Query(ctx, `WITH s AS MATERIALIZED (
			SELECT ord, user_id, address FROM audience_own WHERE own_reason IS NULL
		), du AS (
			SELECT user_id FROM s GROUP BY user_id HAVING count(*) > 1
		), da AS (
			SELECT address FROM s GROUP BY address HAVING count(*) > 1
		)
		SELECT s.ord, hashtextextended(s.user_id, 0), hashtextextended(s.user_id, 1), hashtextextended(s.address, 0), hashtextextended(s.address, 1)
		FROM s LEFT JOIN du ON du.user_id = s.user_id LEFT JOIN da ON da.address = s.address
		WHERE du.user_id IS NOT NULL OR da.address IS NOT NULL
		ORDER BY s.ord`)
	if err != nil {
		return "", fmt.Errorf("plan: classify audience: %w", err)
	}
	// A collision of both hashes of two different users (or addresses) could only leave a row out, never
	// plan a user or an address twice.
	type key [2]int64
	users, addrs := map[key]struct{}{}, map[key]struct{}{}
	var lost []int64
	var ord int64
	var u, a key
	_, err = pgx.ForEachRow(rows, []any{&ord, &u[0], &u[1], &a[0], &a[1]}, func() error {
		_, userTaken := users[u]
		_, addrTaken := addrs[a]
		if userTaken || addrTaken {
			lost = append(lost, ord)
			return nil
		}
		users[u], addrs[a] = struct{}{}, struct{}{}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("plan: classify audience: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE TEMP TABLE audience_lost (ord bigint PRIMARY KEY) ON COMMIT DROP`); err != nil {
		return "", fmt.Errorf("plan: classify audience: %w", err)
	}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"audience_lost"}, []string{"ord"}, pgx.CopyFromSlice(len(lost), func(i int) ([]any, error) { return []any{lost[i]}, nil })); err != nil {
		return "", fmt.Errorf("plan: classify audience: %w", err)
	}
	if _, err := tx.Exec(ctx, `ANALYZE audience_own, audience_lost`); err != nil {
		return "", fmt.Errorf("plan: classify audience: %w", err)
	}
	return `SELECT a.ord, a.user_id, a.address, a.vars, a.raw_address, a.c_status, a.c_source, a.c_date, a.c_txn, a.c_synced,
			CASE WHEN a.user_id IS NULL THEN '` + ReasonMissingUser + `'
			     WHEN a.own_reason IS NULL AND l.ord IS NULL THEN NULL
			     WHEN w.user_id IS NOT NULL THEN '` + ReasonDuplicateUser + `'
			     WHEN a.own_reason IS NOT NULL THEN a.own_reason
			     ELSE '` + ReasonDuplicateAddress + `'
			END AS reason
		FROM audience_own a
		LEFT JOIN audience_lost l ON l.ord = a.ord
		LEFT JOIN (
			-- The users planned: on a row that can be sent and did not lose.
			SELECT DISTINCT o.user_id FROM audience_own o
			WHERE o.own_reason IS NULL AND NOT EXISTS (SELECT 1 FROM audience_lost x WHERE x.ord = o.ord)
		) w ON w.user_id = a.user_id`, nil
}

// missingValueTest is the SQL condition that a row lacks (NULL) a column the template prints: such a row
// is excluded rather than sent "Merhaba <no value>". A column the template only tests ({{if .f}},
// {{with .f}}, {{or .f "fallback"}}) takes its fallback instead (Template.PrintedFields). Field names come from the parsed template and are
// passed as quoted literals.
func missingValueTest(tmpl *Template, ch Channel) string {
	var conds []string
	for _, f := range tmpl.PrintedFields() {
		switch f {
		case "code", "campaign", "user_id", ch.AddressColumn():
			continue
		case "unsubscribe_url":
			if ch.Spec().Unsubscribe {
				continue // the worker's, per recipient
			}
		}
		conds = append(conds, "(a.vars->>"+quoteLiteral(f)+") IS NULL")
	}
	if len(conds) == 0 {
		return "false"
	}
	return strings.Join(conds, " OR ")
}

// headerValueTest is the SQL condition that a value the message puts in a subject that travels as a header
// (an e-mail's) holds a carriage return or a line feed: in a header that would start a header of its own
// (Bcc: ...).
func headerValueTest(tmpl *Template, ch Channel) string {
	if !ch.Spec().SubjectHeader {
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

// exclusions lists exclusion counts by reason, for a message.
func exclusions(ex map[string]int64) string {
	parts := make([]string, 0, len(ex))
	for _, r := range slices.Sorted(maps.Keys(ex)) {
		parts = append(parts, fmt.Sprintf("%s %d", r, ex[r]))
	}
	return strings.Join(parts, ", ")
}
