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

	"github.com/campaignctl/campaignctl/providers"
)

// A channel without an İYS consent type (push, webhook) has no consent store here: a recipient's opt-in
// lives in the customer's own database, behind the audience query. So that a withdrawal between the
// launch and the send stops the message, as an İYS RET does, the workers run the campaign's audience query
// again at send time, restricted to the users of the chunk they lease (OptIns.Read): a recipient the
// query no longer returns with its opt-in true is skipped as revoked. The launch checks that the query can
// be re-run that way (probeOptIns).

// optInTimeout bounds one re-read of a chunk's opt-ins.
const optInTimeout = 30 * time.Second

// optInProbeMax is the longest the launch's re-read of optInProbeUsers recipients may take: a query that
// cannot find a few users faster holds every chunk as long at send time. optInSlow is when it is said.
const (
	optInProbeMax = 5 * time.Second
	optInSlow     = 250 * time.Millisecond
)

// optInProbeUsers is how many recipients a launch re-reads to check that its audience query can be re-run
// for some of its users (probeOptIns).
const optInProbeUsers = 200

// ReadsOptIns says whether the campaign's recipients need the audience's opt-in column to say true, read
// again at send time: a commercial message on a channel without an İYS type.
func (c *Campaign) ReadsOptIns() bool { return c.consentRule().readsOptIn() }

func (r consentRule) readsOptIn() bool {
	return !r.Transactional && r.IYSType == "" && r.OptInColumn != ""
}

// arrayElem quotes a user ID inside a quoted array element; escapeString writes a text into an escape
// string literal (E'...').
var (
	arrayElem    = strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	escapeString = strings.NewReplacer(`\`, `\\`, `'`, `''`)
)

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
		b.WriteString(arrayElem.Replace(u))
		b.WriteString(`"`)
	}
	b.WriteString("}")
	// An escape string: its backslashes mean the same whatever standard_conforming_strings says.
	col, lit := "a.user_id", "E'"+escapeString.Replace(b.String())+"'"
	if asText {
		col, lit = "a.user_id::text", lit+"::text[]"
	}
	// The query goes on lines of its own: a comment on its last line ends there.
	return "SELECT * FROM (\n" + trimStatement(audience) + "\n) AS a WHERE " + col + " = ANY(" + lit + ")"
}

// trimStatement drops what may end a statement after its last clause, so that it can be a subquery: blanks,
// semicolons, block comments after the semicolon, and line comments on lines of their own or after the
// semicolon.
func trimStatement(sql string) string {
	for {
		sql = strings.TrimRight(sql, " \t\r\n;")
		if strings.HasSuffix(sql, "*/") {
			if i := strings.LastIndex(sql, "/*"); i >= 0 {
				if before := strings.TrimRight(sql[:i], " \t\r\n"); strings.HasSuffix(before, ";") {
					sql = before
					continue
				}
			}
		}
		line := sql[strings.LastIndexByte(sql, '\n')+1:]
		i := strings.Index(line, "--")
		if i < 0 {
			return sql
		}
		before := strings.TrimSpace(line[:i])
		for strings.HasSuffix(before, "*/") && strings.Contains(before, "/*") {
			before = strings.TrimSpace(before[:strings.LastIndex(before, "/*")]) // a block comment before it
		}
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
			var here string
			if err := atx.QueryRow(ctx, `SELECT current_database()`).Scan(&here); err != nil {
				return nil, nil, err
			}
			if c.AudienceDatabase != "" && here != c.AudienceDatabase {
				return nil, nil, fmt.Errorf("campaign %d was launched on the audience database %q, and this worker's audience database is %q: its opt-ins are read only where they were; give the workers the launch's AUDIENCE_DATABASE_URL",
					c.ID, c.AudienceDatabase, here)
			}
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

// Read runs the campaign's audience query again now for users and returns what its rows say of them
// (OptInRows.OptedIn decides for each planned address). It runs read-only, as the launch ran the query (the audience role, unless the campaign was
// launched with --allow-privileged-audience), under optInTimeout; the session is reset afterwards, so
// that nothing the query left on it (a setting, a session lock) outlives the read.
func (o *OptIns) Read(ctx context.Context, c *Campaign, users []string) (OptInRows, error) {
	if len(users) == 0 {
		return OptInRows{}, nil
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
	got, err := func() (OptInRows, error) {
		atx, err := conn.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
		if err != nil {
			return nil, err
		}
		defer atx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
		if _, err := atx.Exec(ctx, fmt.Sprintf(`SET LOCAL statement_timeout = %d`, optInTimeout.Milliseconds())); err != nil {
			return nil, err
		}
		return readOptIns(ctx, atx, spec, users, o.runner(c))
	}()
	if err != nil {
		// Postgres quotes the value a row failed on ("invalid input syntax for type integer: \"…@…\""):
		// no caller may show an address that way (the worker's log, status, the queue's UI).
		return nil, scrubbed{fmt.Errorf("opt-ins of campaign %d: %w", c.ID, err)}
	}
	// What DISCARD ALL does, less the prepared statements: those are the pool's own (pgx's statement cache).
	if _, err := conn.Exec(ctx, `CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT; RESET ALL; UNLISTEN *; SELECT pg_advisory_unlock_all(); DISCARD TEMP; DISCARD SEQUENCES`); err == nil {
		clean = true
	}
	return got, nil
}

// OptInRows is what a re-read of the opt-ins found: for each user the query returned, the addresses of its
// rows (canonical, as the launch stored them), true for those with a row whose opt-in says yes.
type OptInRows map[string]map[string]bool

// OptedIn says whether user's planned address addr is still in the audience with the opt-in true. A user
// with several rows (a user joined with its devices; the launch kept one as the recipient and excluded the
// others as duplicate_user) is judged by the row of the address it was planned with; one whose planned
// address the query no longer returns (the device removed) is not opted in.
func (o OptInRows) OptedIn(user, addr string) bool { return o[user][addr] }

// readOptIns runs spec's audience query restricted to users in atx and returns what its rows say of them
// (OptInRows). A user_id column whose type cannot read the IDs back (they are its text) is compared as
// text, under a savepoint.
func readOptIns(ctx context.Context, atx pgx.Tx, spec Spec, users []string,
	runner func(context.Context, pgx.Tx, Spec) (pgx.Rows, []string, error)) (OptInRows, error) {
	col, addrCol := spec.Channel.OptInColumn(), spec.Channel.AddressColumn()
	canonical := spec.Channel.Spec().Canonical
	run := func(asText bool) (OptInRows, error) {
		s := spec
		s.AudienceSQL = optInSQL(spec.AudienceSQL, users, asText)
		rows, names, err := runner(ctx, atx, s)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		userIdx, addrIdx, optIdx := -1, -1, -1
		for i, n := range names {
			if n == "user_id" {
				userIdx = i
			}
			if n == addrCol {
				addrIdx = i // the same column as user_id for the webhook channel
			}
			if n == col {
				optIdx = i
			}
		}
		if userIdx < 0 || addrIdx < 0 || optIdx < 0 {
			// A query that failed before its first row has no columns: its error says why.
			rows.Close()
			if err := rows.Err(); err != nil {
				return nil, err
			}
			return nil, fmt.Errorf("%w: the audience query no longer returns user_id, %s and %s", ErrInvalid, addrCol, col)
		}
		got := OptInRows{}
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				return nil, err
			}
			if vals[userIdx] == nil || vals[addrIdx] == nil {
				continue
			}
			addr, err := canonical(toText(vals[addrIdx]))
			if err != nil {
				continue // not an address: the launch excluded such a row
			}
			u := toText(vals[userIdx])
			if got[u] == nil {
				got[u] = map[string]bool{}
			}
			yes := false
			if v := vals[optIdx]; v != nil {
				yes = optInSays(toText(v))
			}
			got[u][addr] = got[u][addr] || yes
		}
		if err := rows.Err(); err != nil {
			return nil, err
		}
		return got, nil
	}
	if _, err := atx.Exec(ctx, `SAVEPOINT typed`); err != nil {
		return nil, err
	}
	got, err := run(false)
	var pgErr *pgconn.PgError
	if err != nil && errors.As(err, &pgErr) && (pgErr.Code == "22P02" || pgErr.Code == "42883" || pgErr.Code == "42846" || pgErr.Code == "22007" || pgErr.Code == "22008") {
		// The IDs do not read as the column's type (invalid text, no equality with it): compared as text.
		if _, rerr := atx.Exec(ctx, `ROLLBACK TO SAVEPOINT typed`); rerr != nil {
			return nil, rerr
		}
		got, err = run(true)
	}
	return got, err
}

// optInSays reports whether v, an opt-in column's value as text, says yes (optInTrue, as the lease reads
// it from the planned values).
func optInSays(v string) bool { return optInYes[strings.ToLower(v)] }

// optInYes is optInTrue as a set, read once.
var optInYes = func() map[string]bool {
	m := map[string]bool{}
	for _, t := range strings.Split(optInTrue, ",") {
		m[strings.Trim(strings.TrimSpace(t), "'")] = true
	}
	return m
}()

// scrubbed shows its error with the addresses and phone numbers it quotes masked (providers.ScrubText);
// errors.Is and errors.As still see the error itself.
type scrubbed struct{ err error }

func (e scrubbed) Error() string { return providers.ScrubText(e.err.Error()) }
func (e scrubbed) Unwrap() error { return e.err }
