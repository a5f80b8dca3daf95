package campaign

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A channel without an İYS consent type (push, webhook) has no consent store here: a recipient's opt-in
// lives in the customer's own database, behind the audience query. So that a withdrawal between the
// launch and the send stops the message, as an İYS RET does, the workers run the campaign's audience query
// again at send time, restricted to the users of the chunk they lease (OptIns.Read): a recipient the
// query no longer returns with its opt-in true is skipped as revoked. The launch checks that the query can
// be re-run that way (probeOptIns).

// optInTimeout bounds one re-read of a chunk's opt-ins.
const optInTimeout = 30 * time.Second

// optInProbeUsers is how many recipients a launch re-reads to check that its audience query can be re-run
// for some of its users (probeOptIns).
const optInProbeUsers = 200

// ReadsOptIns says whether the campaign's recipients need the audience's opt-in column to say true, read
// again at send time: a commercial message on a channel without an İYS type.
func (c *Campaign) ReadsOptIns() bool { return c.consentRule().readsOptIn() }

func (r consentRule) readsOptIn() bool {
	return !r.Transactional && r.IYSType == "" && r.OptInColumn != ""
}

// optInSQL is the audience query restricted to users: the query as a subquery, filtered on its user_id
// column. The users are one array literal compared with the column as it is typed (the literal takes the
// column's type), so that Postgres pushes the filter into the query and looks the users up by the
// column's index instead of running the whole audience; asText compares the column's text instead, for a
// user_id whose type cannot read the IDs back.
func optInSQL(audience string, users []string, asText bool) string {
	var b strings.Builder
	b.WriteString("{")
	for i, u := range users {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`"`)
		b.WriteString(strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(u))
		b.WriteString(`"`)
	}
	b.WriteString("}")
	// An escape string: its backslashes mean the same whatever standard_conforming_strings says.
	col, lit := "a.user_id", "E'"+strings.NewReplacer(`\`, `\\`, `'`, `''`).Replace(b.String())+"'"
	if asText {
		col, lit = "a.user_id::text", lit+"::text[]"
	}
	// The query goes on lines of its own: a comment on its last line ends there.
	return "SELECT * FROM (\n" + trimStatement(audience) + "\n) AS a WHERE " + col + " = ANY(" + lit + ")"
}

// trimStatement drops what may end a statement after its last clause, so that it can be a subquery: blanks,
// semicolons, and line comments on lines of their own or after the semicolon.
func trimStatement(sql string) string {
	for {
		sql = strings.TrimRight(sql, " \t\r\n;")
		line := sql[strings.LastIndexByte(sql, '\n')+1:]
		i := strings.Index(line, "--")
		if i < 0 {
			return sql
		}
		before := strings.TrimSpace(line[:i])
		if before != "" && !strings.HasSuffix(before, ";") {
			return sql // a comment after the last clause, ended by the line break that follows
		}
		sql = sql[:len(sql)-len(line)+i]
	}
}

// OptIns re-reads recipients' opt-ins on the audience database at send time.
type OptIns struct {
	// Pool is the audience database (AUDIENCE_DATABASE_URL, or the engine's).
	Pool *pgxpool.Pool

	mu sync.Mutex
	// checked holds, by campaign, what the audience's role was found to may (audienceMode) and the
	// query's shape, for optInRecheck: the checks cost more than a chunk's read.
	checked map[int64]optInCheck
}

type optInCheck struct {
	sql     string
	wrapped bool
	shape   *audienceShape
	at      time.Time
}

// optInRecheck is how long a re-read of the opt-ins goes on the role checks and the columns a read found
// before: a privilege granted to the audience role meanwhile is found within it.
const optInRecheck = time.Minute

// runner runs the audience query of c restricted as spec says, with what was checked of c's audience
// less than optInRecheck ago.
func (o *OptIns) runner(c *Campaign) func(ctx context.Context, atx pgx.Tx, spec Spec) (pgx.Rows, []string, error) {
	return func(ctx context.Context, atx pgx.Tx, spec Spec) (pgx.Rows, []string, error) {
		o.mu.Lock()
		known, ok := o.checked[c.ID]
		o.mu.Unlock()
		if !ok || known.sql != c.AudienceSQL || time.Since(known.at) > optInRecheck {
			wrapped, err := audienceMode(ctx, atx, spec)
			if err != nil {
				return nil, nil, err
			}
			known = optInCheck{sql: c.AudienceSQL, wrapped: wrapped, at: time.Now()}
		}
		rows, shape, err := runAudienceAs(ctx, atx, spec, known.wrapped, known.shape)
		if err != nil {
			o.forget(c.ID) // checked again next time: the columns may have changed
			return nil, nil, err
		}
		known.shape = shape
		o.mu.Lock()
		if o.checked == nil || len(o.checked) > 1024 {
			o.checked = map[int64]optInCheck{}
		}
		o.checked[c.ID] = known
		o.mu.Unlock()
		return rows, shape.names, nil
	}
}

func (o *OptIns) forget(id int64) {
	o.mu.Lock()
	delete(o.checked, id)
	o.mu.Unlock()
}

// OptIns re-reads opt-ins on the engine's database: the audience's when AUDIENCE_DATABASE_URL is not set.
func (s *Store) OptIns() *OptIns { return &OptIns{Pool: s.pool} }

// Read returns those of users whom the campaign's audience query, run again now for them, returns with
// the channel's opt-in column true. A user the query no longer returns, or returns twice, is not among
// them. It runs read-only, as the launch ran the query (the audience role, unless the campaign was
// launched with --allow-privileged-audience), under optInTimeout; the session is reset afterwards, so
// that nothing the query left on it (a setting, a session lock) outlives the read.
func (o *OptIns) Read(ctx context.Context, c *Campaign, users []string) (map[string]bool, error) {
	if len(users) == 0 {
		return map[string]bool{}, nil
	}
	conn, err := o.Pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("opt-ins: audience database: %w", err)
	}
	clean := false
	defer func() {
		if !clean {
			c := conn.Hijack()
			c.Close(context.WithoutCancel(ctx)) //nolint:errcheck // the session is dropped either way
			return
		}
		conn.Release()
	}()
	spec := Spec{Channel: c.Channel, AudienceSQL: c.AudienceSQL, AllowPrivilegedAudience: c.PrivilegedAudience, StatementTimeout: optInTimeout}
	got, err := func() (map[string]bool, error) {
		atx, err := conn.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
		if err != nil {
			return nil, err
		}
		defer atx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
		if _, err := atx.Exec(ctx, fmt.Sprintf(`SET LOCAL statement_timeout = %d`, optInTimeout.Milliseconds())); err != nil {
			return nil, err
		}
		yes, _, err := readOptIns(ctx, atx, spec, users, o.runner(c))
		return yes, err
	}()
	if err != nil {
		return nil, fmt.Errorf("opt-ins of campaign %d: %w", c.ID, err)
	}
	// What DISCARD ALL does, less the prepared statements: those are the pool's own (pgx's statement cache).
	if _, err := conn.Exec(ctx, `CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT; RESET ALL; UNLISTEN *; SELECT pg_advisory_unlock_all(); DISCARD TEMP; DISCARD SEQUENCES`); err == nil {
		clean = true
	}
	return got, nil
}

// readOptIns runs spec's audience query restricted to users in atx and returns the users it returns once,
// with the opt-in column true, and those it returns more than once. A user_id column whose type cannot read the IDs back (they are its text) is
// compared as text, under a savepoint.
func readOptIns(ctx context.Context, atx pgx.Tx, spec Spec, users []string,
	runner func(context.Context, pgx.Tx, Spec) (pgx.Rows, []string, error)) (yes, twice map[string]bool, err error) {
	col := spec.Channel.OptInColumn()
	run := func(asText bool) (map[string]bool, error) {
		s := spec
		s.AudienceSQL = optInSQL(spec.AudienceSQL, users, asText)
		rows, names, err := runner(ctx, atx, s)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		userIdx, optIdx := -1, -1
		for i, n := range names {
			switch n {
			case "user_id":
				userIdx = i
			case col:
				optIdx = i
			}
		}
		if userIdx < 0 || optIdx < 0 {
			return nil, fmt.Errorf("%w: the audience query no longer returns user_id and %s", ErrInvalid, col)
		}
		seen := map[string]int{}
		yes := map[string]bool{}
		twice = map[string]bool{}
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				return nil, err
			}
			if vals[userIdx] == nil {
				continue
			}
			u := toText(vals[userIdx])
			seen[u]++
			if v := vals[optIdx]; v != nil && optInSays(toText(v)) {
				yes[u] = true
			}
		}
		if err := rows.Err(); err != nil {
			return nil, err
		}
		for u, n := range seen {
			if n > 1 {
				// The launch excluded a second row as a duplicate: which one counts is not known.
				delete(yes, u)
				twice[u] = true
			}
		}
		return yes, nil
	}
	if _, err := atx.Exec(ctx, `SAVEPOINT typed`); err != nil {
		return nil, nil, err
	}
	yes, err = run(false)
	var pgErr *pgconn.PgError
	if err != nil && errors.As(err, &pgErr) && (pgErr.Code == "22P02" || pgErr.Code == "42883" || pgErr.Code == "42846" || pgErr.Code == "22007" || pgErr.Code == "22008") {
		// The IDs do not read as the column's type (invalid text, no equality with it): compared as text.
		if _, rerr := atx.Exec(ctx, `ROLLBACK TO SAVEPOINT typed`); rerr != nil {
			return nil, nil, rerr
		}
		yes, err = run(true)
	}
	if err != nil {
		return nil, nil, err
	}
	return yes, twice, nil
}

// optInSays reports whether v, an opt-in column's value as text, says yes (optInTrue, as the lease reads
// it from the planned values).
func optInSays(v string) bool {
	for _, t := range strings.Split(optInTrue, ",") {
		if strings.Trim(strings.TrimSpace(t), "'") == strings.ToLower(v) {
			return true
		}
	}
	return false
}
