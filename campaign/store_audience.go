package campaign

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/campaignctl/campaignctl/internal/unsubscribe"
	"github.com/campaignctl/campaignctl/providers"
)

// serverMajor is the major version of the Postgres server c is connected to (0 when it does not say).
func serverMajor(c *pgconn.PgConn) int {
	v := c.ParameterStatus("server_version")
	if i := strings.IndexAny(v, ". "); i > 0 {
		v = v[:i]
	}
	n, _ := strconv.Atoi(v)
	return n
}

// stageAudience runs the audience query read-only and streams its rows into audience_stage. It returns the
// audience database's name (current_database()), which the campaign records for the workers' re-reads.
func (p *Planner) stageAudience(ctx context.Context, engineTx pgx.Tx, spec Spec, tmpl *Template) (string, error) {
	var db string
	err := p.stageAudienceIn(ctx, engineTx, spec, tmpl, &db)
	return db, err
}

func (p *Planner) stageAudienceIn(ctx context.Context, engineTx pgx.Tx, spec Spec, tmpl *Template, dbName *string) error {
	conn, err := p.Audience.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("audience database: %w", err)
	}
	// The audience query's session is closed afterwards, never handed back to the pool: what the query
	// left on it outlives its transaction (a session advisory lock, which would hold the engine's code
	// reservations up for good; a setting changed with set_config(..., false)), and must not reach a
	// statement of the engine's, or the next audience query.
	defer func() {
		c := conn.Hijack()
		if ctx.Err() != nil {
			// Interrupted (a SIGTERM, a timeout): the query may still run on the server, which notices a
			// closed connection only when it next writes. It is cancelled before the session is dropped.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			c.PgConn().CancelRequest(cctx) //nolint:errcheck // best effort: the close follows anyway
			cancel()
		}
		c.Close(context.WithoutCancel(ctx)) //nolint:errcheck // the session is dropped either way
	}()
	atx, err := conn.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("audience database: %w", err)
	}
	defer atx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	if _, err := atx.Exec(ctx, fmt.Sprintf(`SET LOCAL statement_timeout = %d`, spec.StatementTimeout.Milliseconds())); err != nil {
		return fmt.Errorf("audience database: %w", err)
	}
	// A launch killed outright (kill -9, a lost machine) cannot cancel its query: the server would run it
	// to the statement timeout. From Postgres 14 on, the server checks every second that its client is
	// still there while the query runs, and ends it when not.
	if err := atx.QueryRow(ctx, `SELECT current_database()`).Scan(dbName); err != nil {
		return fmt.Errorf("audience database: %w", err)
	}
	if serverMajor(conn.Conn().PgConn()) >= 14 {
		if _, err := atx.Exec(ctx, `SET LOCAL client_connection_check_interval = 1000`); err != nil {
			return fmt.Errorf("audience database: %w", err)
		}
	}
	rows, cols, err := runAudience(ctx, atx, spec)
	if err != nil {
		return err
	}
	defer rows.Close()

	src := &audienceSource{rows: rows, userIdx: -1, addrIdx: -1, optIdx: -1, canonical: spec.Channel.Spec().Canonical}
	if spec.OneClickUnsubscribe() {
		src.maxUser = unsubscribe.MaxUserID // each message carries a link with its user ID
	}
	for i, name := range cols {
		if name == "user_id" {
			src.userIdx = i
		}
		if name == spec.Channel.AddressColumn() {
			src.addrIdx = i // the same column as user_id for the webhook channel
		}
		if name == spec.Channel.OptInColumn() && spec.consentRule().readsOptIn() {
			src.optIdx = i
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
		return fmt.Errorf("%w: the audience query returns no %s column (it returns: %v); select it, e.g. `SELECT %s...`",
			ErrInvalid, missing, cols, exampleColumns(addressExample(spec.Channel), optInExample(spec.Channel)))
	}
	if col := spec.Channel.OptInColumn(); col != "" && !slices.Contains(cols, col) {
		return fmt.Errorf("%w: a %s audience must return the %s column (true for recipients who opted in; %s has no İYS consent), e.g. `SELECT %s...`",
			ErrInvalid, spec.Channel, col, spec.Channel, exampleColumns(addressExample(spec.Channel), optInExample(spec.Channel)))
	}
	if err := columnsOwnName(cols, spec); err != nil {
		return err
	}
	keys := append(append([]string(nil), cols...), "campaign")
	if spec.CodePool != "" {
		keys = append(keys, "code")
	}
	if spec.OneClickUnsubscribe() {
		keys = append(keys, "unsubscribe_url")
	} else if slices.Contains(tmpl.Fields(), "unsubscribe_url") && !slices.Contains(cols, "unsubscribe_url") {
		if spec.Channel.Spec().Unsubscribe {
			return fmt.Errorf("%w: the message template uses {{.unsubscribe_url}}, which a transactional e-mail does not have (it carries no unsubscribe link); remove it, or launch without --transactional", ErrInvalid)
		}
		return fmt.Errorf("%w: the message template uses {{.unsubscribe_url}}, which only commercial e-mail has: a %s message carries no unsubscribe link (an SMS's opt-out is its RET line); remove it", ErrInvalid, spec.Channel.Spec().Title)
	}
	if err := tmpl.Check(keys); err != nil {
		return err
	}
	if _, err := engineTx.CopyFrom(ctx, pgx.Identifier{"audience_stage"}, []string{"ord", "user_id", "address", "vars", "raw_address"}, src); err != nil {
		if src.err != nil {
			// The rest of the audience is not wanted: the connection is closed rather than drained (a
			// query of huge values would otherwise be read to its end).
			atx.Conn().Close(context.WithoutCancel(ctx)) //nolint:errcheck
			return src.err
		}
		if rerr := rows.Err(); rerr != nil {
			return audienceError(rerr, spec.StatementTimeout, !spec.AllowPrivilegedAudience)
		}
		return fmt.Errorf("plan: stage audience: %w", err)
	}
	rows.Close()
	if len(src.probe) > 0 {
		return p.probeOptIns(ctx, atx, spec, src.probe, src.ord)
	}
	return nil
}

// probeOptIns checks that the audience query can be run again for some of its recipients, as the workers
// run it for each chunk to read the opt-ins at send time (OptIns): probe, (user, address) pairs whose
// opt-in the query has just said yes to, must come back with it, under the workers' own time limit. A
// query that picks its recipients by chance, position or the moment (ORDER BY random(), LIMIT, now())
// would have the workers skip most of them as revoked, and one that takes longer than optInProbeMax for a
// few recipients would hold each chunk as long (the workers' limit is optInTimeout): the launch is refused
// instead, before anything is written. A re-read slow enough to make the whole campaign's reads long is
// only said (optInSlow).
func (p *Planner) probeOptIns(ctx context.Context, atx pgx.Tx, spec Spec, probe [][2]string, audience int64) error {
	if _, err := atx.Exec(ctx, fmt.Sprintf(`SET LOCAL statement_timeout = %d`, optInProbeMax.Milliseconds())); err != nil {
		return fmt.Errorf("audience database: %w", err)
	}
	users := make([]string, len(probe))
	for i, pr := range probe {
		users[i] = pr[0]
	}
	start := time.Now()
	got, err := readOptIns(ctx, atx, spec, users, runAudience)
	took := time.Since(start)
	if err != nil {
		var pgErr *pgconn.PgError
		if took >= optInProbeMax*9/10 {
			return fmt.Errorf("%w: the audience query, run again for %d of its recipients, took more than %v; the workers run it again for each chunk at send time to read the %s opt-ins, so it must find a few users at once: let Postgres look them up by the column behind user_id (an index on it, and no LIMIT, DISTINCT ON or window function around it); nothing was written or sent",
				ErrInvalid, len(users), optInProbeMax, spec.Channel)
		}
		if !errors.Is(err, ErrInvalid) && errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "42") {
			err = fmt.Errorf("%w: %v", ErrInvalid, err)
		}
		return fmt.Errorf("the audience query cannot be run again for some of its recipients, as the workers run it to read %s opt-ins at send time: %w; make it one SELECT that can be a subquery",
			spec.Channel, err)
	}
	var lost []string
	for _, pr := range probe {
		if !got.OptedIn(pr[0], pr[1]) {
			lost = append(lost, pr[0])
		}
	}
	if len(lost) > 0 {
		return fmt.Errorf("%w: the audience query, run again for %d of its recipients with %s true, did not return %d of them with it (e.g. user_id %s): the workers run it again for each chunk at send time to read the opt-ins, so it must pick its recipients by what they are, not by chance, position or the moment (ORDER BY random(), LIMIT, OFFSET); keep a sample in a table of its own and select from it, or select by a condition on the rows; nothing was written or sent",
			ErrInvalid, len(users), spec.Channel.OptInColumn(), len(lost), providers.MaskUserID(lost[0]))
	}
	// About what the campaign's reads take in all: one a chunk of a few hundred.
	if all := time.Duration(float64(took) * float64(audience) / float64(len(users))); (took > optInSlow || all > time.Minute) && p.Log != nil {
		p.Log.Warn("the audience query is slow to run again for a few recipients: the workers run it for each chunk to read the opt-ins at send time, and the chunk waits as long; let Postgres look the users up by the column behind user_id (an index on it, and no LIMIT, DISTINCT ON or window function around it)",
			"recipients", len(users), "took", took.Round(time.Millisecond), "all_reads_about", all.Round(time.Second))
	}
	return nil
}

// deniedSchema finds the schema in PostgreSQL's "permission denied for schema x".
var deniedSchema = regexp.MustCompile(`permission denied for schema (\S+)`)

// deniedTable finds the table in PostgreSQL's "permission denied for table x".
var deniedTable = regexp.MustCompile(`permission denied for (?:table|view|materialized view) (\S+)`)

func audienceError(err error, timeout time.Duration, restricted bool) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.Contains(pgErr.Message, "within security-definer function"):
			return fmt.Errorf("%w: the audience query tried to change its role (%s); it must be one plain SELECT", ErrInvalid, pgErr.Message)
		case restricted && pgErr.Code == pgInsufficientPrivilege:
			if m := deniedSchema.FindStringSubmatch(pgErr.Message); m != nil {
				return fmt.Errorf("%w: the audience query was refused what it asked for (%s): the role it runs as may not use that schema. If the audience's tables are in it, grant it: GRANT USAGE ON SCHEMA %s TO %s in the engine's database (or to the AUDIENCE_DATABASE_URL role in an audience database of its own), and GRANT SELECT on the tables",
					ErrInvalid, pgErr.Message, m[1], AudienceRole)
			}
			m := deniedTable.FindStringSubmatch(pgErr.Message)
			if m == nil {
				// A function or a server file, not a table: nothing to grant.
				return fmt.Errorf("%w: the audience query was refused what it asked for (%s): it runs as a role that may read only the audience tables it is granted, never the server's files, functions that act on the server, or other sessions. Select from the audience tables only, or launch with --allow-privileged-audience (recorded on the campaign)",
					ErrInvalid, pgErr.Message)
			}
			table := m[1]
			if i := strings.LastIndexByte(table, '.'); i >= 0 {
				table = table[i+1:]
			}
			if slices.Contains(EngineTables, strings.Trim(table, `"`)) {
				return fmt.Errorf("%w: the audience query was refused what it asked for (%s): %s is one of the engine's own tables (codes, consents, refusals, sends), which an audience may never read. Select the audience from your own tables",
					ErrInvalid, pgErr.Message, m[1])
			}
			return fmt.Errorf("%w: the audience query was refused what it asked for (%s): it runs as a role that may read only what it is granted, never the engine's own tables or the server's files and sessions. If that table is part of the audience, grant it to the role the query runs as: GRANT SELECT ON %s TO %s in the engine's database, or to the AUDIENCE_DATABASE_URL role in an audience database of its own",
				ErrInvalid, pgErr.Message, m[1], AudienceRole)
		case pgErr.Code == pgReadOnlySQLTransaction:
			// Postgres names the statement's own command: a write inside a WITH is reported as a SELECT.
			return fmt.Errorf("%w: the audience query tried to write (%s; a WITH that inserts, updates or deletes counts); it must be a read-only SELECT", ErrInvalid, pgErr.Message)
		case pgErr.Code == pgQueryCanceled:
			return fmt.Errorf("%w: the audience query ran longer than %v and was cancelled; add an index or narrow the query, or give it longer with --statement-timeout", ErrInvalid, timeout)
		case pgErr.Code == pgSyntaxError && pgErr.Message == "cannot insert multiple commands into a prepared statement":
			return fmt.Errorf("%w: the audience file holds more than one statement; it must be exactly one SELECT", ErrInvalid)
		}
		// Postgres quotes the value it could not take ("invalid input syntax for type bigint: …"): an
		// audience column's, a phone number or an e-mail address as often as not.
		return fmt.Errorf("%w: the audience query failed: %s (SQLSTATE %s); fix the SQL in the --audience file", ErrInvalid, providers.ScrubText(pgErr.Message), pgErr.Code)
	}
	return fmt.Errorf("audience query: %w", err)
}

// columnsOwnName refuses an audience whose columns a message could not tell apart: two of one name (a
// template reads one of them, whichever), or one named as a value the engine fills itself (the campaign's
// name, the promo code of a campaign with a pool, an e-mail's unsubscribe link), which would replace it.
func columnsOwnName(cols []string, spec Spec) error {
	engine := map[string]string{"campaign": "the campaign's name"}
	if spec.CodePool != "" {
		engine["code"] = "the promo code from pool " + spec.CodePool
	}
	if spec.OneClickUnsubscribe() {
		engine["unsubscribe_url"] = "the recipient's one-click unsubscribe link"
	}
	for i, name := range cols {
		if slices.Contains(cols[:i], name) {
			return fmt.Errorf("%w: the audience query returns two columns named %s; give each a name of its own (... AS other_name)", ErrInvalid, name)
		}
		if what, ok := engine[name]; ok {
			return fmt.Errorf("%w: the audience query returns a column named %s, but {{.%s}} is %s, which would replace it; rename the column (... AS other_name)", ErrInvalid, name, name, what)
		}
	}
	return nil
}

// audienceSource adapts the audience rows to CopyFrom: it canonicalises the address (an invalid one
// becomes NULL, to be excluded as invalid_address) and folds the other columns into the vars JSON.
type audienceSource struct {
	rows             pgx.Rows
	names            []string
	userIdx, addrIdx int
	// canonical is the channel's (ChannelSpec.Canonical).
	canonical func(raw string) (string, error)
	// maxUser is the longest user ID the campaign can take, in bytes (0: MaxValueBytes).
	maxUser int
	// optIdx is the opt-in column read again at send time (-1: none); probe collects the first users
	// whose opt-in says yes, for probeOptIns.
	optIdx int
	probe  [][2]string
	ord    int64
	err    error
}

func (s *audienceSource) Next() bool { return s.err == nil && s.rows.Next() }

func (s *audienceSource) Values() ([]any, error) {
	// A value past the bound is refused from its wire size, before it is decoded into a copy.
	for i, raw := range s.rows.RawValues() {
		if len(raw) > MaxValueBytes {
			return nil, s.tooLarge(i, len(raw))
		}
	}
	vals, err := s.rows.Values()
	if err != nil {
		s.err = fmt.Errorf("audience row %d: %w", s.ord+1, err)
		return nil, s.err
	}
	s.ord++
	// rawAddr is the audience's value when it is not an address (excluded as invalid_address, and shown
	// as it was by report --with-address); nil otherwise.
	var user, addr, rawAddr any
	// A user_id of blanks is no more an ID than a missing one: the row is excluded as missing_user_id.
	if u := vals[s.userIdx]; u != nil && strings.TrimSpace(toText(u)) != "" {
		user = toText(u)
		if t := user.(string); s.maxUser > 0 && len(t) > s.maxUser {
			s.err = fmt.Errorf("%w: audience row %d: user_id %.40q… is %d bytes; a commercial e-mail's one-click unsubscribe link carries its user_id, which may be at most %d bytes: select a shorter key as user_id",
				ErrInvalid, s.ord, t, len(t), s.maxUser)
			return nil, s.err
		}
	}
	if raw := vals[s.addrIdx]; raw != nil {
		if a, err := s.canonical(toText(raw)); err == nil {
			addr = a
		} else {
			rawAddr = toText(raw)
		}
	}
	if s.optIdx >= 0 && user != nil && addr != nil && len(s.probe) < optInProbeUsers {
		if v := vals[s.optIdx]; v != nil && optInSays(toText(v)) {
			s.probe = append(s.probe, [2]string{user.(string), addr.(string)})
		}
	}
	vars := make(map[string]any, len(vals))
	for i, v := range vals {
		if i == s.userIdx || i == s.addrIdx {
			continue
		}
		if f, ok := asFloat(v); ok && (math.IsNaN(f) || math.IsInf(f, 0)) {
			s.err = fmt.Errorf("%w: audience row %d (user_id %v): column %s is %v, which a message cannot carry; select it as text (%s::text) or replace it (NULLIF, CASE WHEN ... = 'NaN' THEN NULL)",
				ErrInvalid, s.ord, providers.MaskUserID(fmt.Sprint(user)), s.names[i], f, s.names[i])
			return nil, s.err
		}
		vars[s.names[i]] = jsonValue(v)
	}
	b, err := json.Marshal(vars)
	if err != nil {
		// A value JSON has no form for, inside an array or a composite (a NaN or an infinite float).
		s.err = fmt.Errorf("%w: audience row %d (user_id %v): %v; select the column that holds it as text (col::text)", ErrInvalid, s.ord, providers.MaskUserID(fmt.Sprint(user)), err)
		return nil, s.err
	}
	return []any{s.ord, user, addr, json.RawMessage(b), rawAddr}, nil
}

// tooLarge refuses the next row for its column i of n bytes, naming its user_id decoded alone.
func (s *audienceSource) tooLarge(i, n int) error {
	s.ord++
	user := "?"
	if raw := s.rows.RawValues()[s.userIdx]; raw != nil && len(raw) <= MaxValueBytes {
		f := s.rows.FieldDescriptions()[s.userIdx]
		var v any
		if err := s.rows.Conn().TypeMap().Scan(f.DataTypeOID, f.Format, raw, &v); err == nil && v != nil {
			user = toText(v)
		}
	}
	s.err = fmt.Errorf("%w: audience row %d (user_id %.40s): the value of %s is %d KiB, more than %d KiB; select a shorter value (e.g. left(%s, 500))",
		ErrInvalid, s.ord, providers.MaskUserID(user), s.names[i], n>>10, MaxValueBytes>>10, s.names[i])
	return s.err
}

func (s *audienceSource) Err() error {
	if s.err != nil {
		return s.err
	}
	return s.rows.Err()
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

// asFloat is v as a float64 when it is a float.
func asFloat(v any) (float64, bool) {
	switch f := v.(type) {
	case float64:
		return f, true
	case float32:
		return float64(f), true
	}
	return 0, false
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

// addressExample is how an audience SELECT names the channel's address column, for an error's example.
func addressExample(ch Channel) string {
	switch col := ch.AddressColumn(); col {
	case "phone":
		return "gsm AS phone"
	case "email":
		return "mail AS email"
	case "user_id":
		return "" // the user is the address (a webhook's)
	default:
		return "device_token AS " + col
	}
}

// optInExample is how an audience SELECT names the channel's opt-in column, for an error's example; ""
// for a channel without one.
func optInExample(ch Channel) string {
	if col := ch.OptInColumn(); col != "" {
		return "notify AS " + col
	}
	return ""
}

// exampleColumns is the start of an example audience SELECT's column list: user_id, then the columns
// given, each once (a channel that addresses the user itself has no address column of its own), and a
// trailing ", " for the "..." after it.
func exampleColumns(cols ...string) string {
	out := "id AS user_id, "
	for _, c := range cols {
		if c != "" && c != "user_id" {
			out += c + ", "
		}
	}
	return out
}
