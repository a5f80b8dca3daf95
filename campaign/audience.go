package campaign

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// AudienceRole is the role audience queries run as (see migrations/0008_audience_role.sql): it cannot log
// in and holds only the grants an operator gives it on the audience's tables.
const AudienceRole = "campaignctl_audience"

// EngineTables are the engine's own tables, every one the migrations create (a test holds the list to
// the schema). An audience query must never read them: they hold every code, consent, refusal and send,
// which a template could put into a message.
var EngineTables = []string{
	"campaigns", "campaign_recipients", "campaign_batches", "campaign_exclusions", "code_pools", "promo_codes",
	"released_codes", "iys_consents", "iys_consent_history", "iys_sync_state", "iys_consents_version",
	"iys_outbox", "iys_tokens", "refusals", "send_log", "invalid_addresses", "receipt_events", "early_receipts",
	"schema_migrations", "pending_provider_refusals",
}

// runAudience runs the audience query in atx (read-only, under its statement timeout) and returns its
// rows and column names.
//
// Where the audience database has the engine's schema, the query runs inside campaignctl_audience.rows,
// as AudienceRole, which can change neither its role nor its session authorization there. Elsewhere (an
// AUDIENCE_DATABASE_URL of its own) it runs as that connection's role, which must then be one that may do
// no more than read: not a superuser, no server file, program or signal rights, no access to the engine's
// tables. spec.AllowPrivilegedAudience runs it as the connection's role whatever that may do.
func runAudience(ctx context.Context, atx pgx.Tx, spec Spec) (pgx.Rows, []string, error) {
	wrapped, err := audienceMode(ctx, atx, spec)
	if err != nil {
		return nil, nil, err
	}
	rows, shape, err := runAudienceAs(ctx, atx, spec, wrapped, nil)
	if err != nil {
		return nil, nil, err
	}
	return rows, shape.names, nil
}

// audienceMode checks what the audience query may run as (see runAudience) and says whether it runs
// wrapped, inside campaignctl_audience.rows as AudienceRole; it refuses a role that may do more than read.
func audienceMode(ctx context.Context, atx pgx.Tx, spec Spec) (wrapped bool, err error) {
	if spec.AllowPrivilegedAudience {
		return false, nil
	}
	var user string
	// A role that may not use the audience schema cannot look the function up (to_regprocedure fails on
	// the schema's permission): for it the schema is as good as absent.
	if err := atx.QueryRow(ctx, `SELECT CASE WHEN coalesce((SELECT has_schema_privilege(n.oid, 'USAGE') FROM pg_namespace n WHERE n.nspname = 'campaignctl_audience'), false)
			THEN coalesce(has_function_privilege(to_regprocedure('campaignctl_audience.rows(text)'), 'EXECUTE'), false) ELSE false END, session_user`).Scan(&wrapped, &user); err != nil {
		return false, fmt.Errorf("audience database: %w", err)
	}
	runAs := user
	if wrapped {
		runAs = AudienceRole
	}
	why, err := mayDoMore(ctx, atx, runAs)
	if err != nil {
		return false, err
	}
	if why != "" {
		if wrapped {
			return false, fmt.Errorf("%w: the audience role %s %s, so an audience query could read more than the audience; revoke that (e.g. REVOKE ALL ON ALL TABLES IN SCHEMA public FROM %s, then GRANT SELECT on the audience tables only), or launch with --allow-privileged-audience (recorded on the campaign)",
				ErrInvalid, AudienceRole, why, AudienceRole)
		}
		return false, fmt.Errorf("%w: the audience query would run as %q, which %s: it could read server files, stop other sessions or read the engine's codes and consents into the messages. Run `campaignctl migrate` on the audience database (it creates the %s role) and grant that role the audience tables (GRANT SELECT ON customers TO %s), or set AUDIENCE_DATABASE_URL to a role that may only read them, or launch with --allow-privileged-audience (recorded on the campaign)",
			ErrInvalid, user, why, AudienceRole, AudienceRole)
	}
	return wrapped, nil
}

// audienceShape is what a wrapped audience query returns: its columns' names, and their definitions for
// campaignctl_audience.rows' column list.
type audienceShape struct {
	names []string
	defs  string
}

// runAudienceAs runs the audience query as audienceMode said. A wrapped query's columns are read first
// (Describe runs nothing) and named with their types, so that every value arrives as the query typed it;
// known, when given, is a shape read before for the same columns, and spares that.
func runAudienceAs(ctx context.Context, atx pgx.Tx, spec Spec, wrapped bool, known *audienceShape) (pgx.Rows, *audienceShape, error) {
	restricted := !spec.AllowPrivilegedAudience
	if !wrapped {
		rows, err := atx.Query(ctx, spec.AudienceSQL)
		if err != nil {
			return nil, nil, audienceError(err, spec.StatementTimeout, restricted)
		}
		return rows, &audienceShape{names: fieldNames(rows)}, nil
	}
	shape := known
	if shape == nil {
		sd, err := atx.Prepare(ctx, "", spec.AudienceSQL)
		if err != nil {
			return nil, nil, audienceError(err, spec.StatementTimeout, restricted)
		}
		if len(sd.Fields) == 0 {
			return nil, nil, fmt.Errorf("%w: the audience query returned no columns; it must be one SELECT returning user_id and %s", ErrInvalid, spec.Channel.AddressColumn())
		}
		oids, mods := make([]uint32, len(sd.Fields)), make([]int32, len(sd.Fields))
		names := make([]string, len(sd.Fields))
		for i, f := range sd.Fields {
			oids[i], mods[i], names[i] = f.DataTypeOID, f.TypeModifier, f.Name
		}
		var types []string
		var pseudo []bool
		if err := atx.QueryRow(ctx, `SELECT array_agg(format_type(x.t, NULLIF(x.m, -1)) ORDER BY x.i), array_agg(ty.typtype = 'p' ORDER BY x.i)
			FROM unnest($1::oid[], $2::int[]) WITH ORDINALITY AS x(t, m, i) JOIN pg_type ty ON ty.oid = x.t`, oids, mods).Scan(&types, &pseudo); err != nil {
			return nil, nil, fmt.Errorf("audience query: column types: %w", err)
		}
		if len(types) != len(names) {
			return nil, nil, fmt.Errorf("audience query: column types: %d of %d found", len(types), len(names))
		}
		defs := make([]string, len(names))
		for i := range names {
			if pseudo[i] {
				return nil, nil, fmt.Errorf("%w: the audience column %q has no type of its own (%s); cast it, e.g. `... ::text AS %s`", ErrInvalid, names[i], types[i], names[i])
			}
			defs[i] = "c" + strconv.Itoa(i+1) + " " + types[i]
		}
		shape = &audienceShape{names: names, defs: strings.Join(defs, ", ")}
	}
	rows, err := atx.Query(ctx, `SELECT * FROM campaignctl_audience.rows($1) AS a(`+shape.defs+`)`, spec.AudienceSQL)
	if err != nil {
		return nil, nil, audienceError(err, spec.StatementTimeout, restricted)
	}
	return rows, shape, nil
}

func fieldNames(rows pgx.Rows) []string {
	var cols []string
	for _, fd := range rows.FieldDescriptions() {
		cols = append(cols, fd.Name)
	}
	return cols
}

// mayDoMore says what role may do beyond reading the tables it is granted ("" when nothing): be a
// superuser, read or write the server's files, run programs, signal other sessions, read all data, or read
// one of the engine's tables or any column of one — itself or through any role it is a member of.
func mayDoMore(ctx context.Context, tx pgx.Tx, role string) (string, error) {
	var powers, tables []string
	err := tx.QueryRow(ctx, `
		WITH m AS (SELECT r.oid, r.rolname, r.rolsuper FROM pg_roles r WHERE pg_has_role($1::name, r.oid, 'MEMBER'))
		SELECT
			array_remove(ARRAY[
				CASE WHEN EXISTS (SELECT 1 FROM m WHERE rolsuper) THEN 'is a superuser' END,
				CASE WHEN EXISTS (SELECT 1 FROM m WHERE rolname IN ('pg_read_server_files', 'pg_write_server_files', 'pg_execute_server_program')) THEN 'may read or write server files or run programs' END,
				CASE WHEN EXISTS (SELECT 1 FROM m WHERE rolname = 'pg_signal_backend') THEN 'may terminate other sessions' END,
				CASE WHEN EXISTS (SELECT 1 FROM m WHERE rolname IN ('pg_read_all_data', 'pg_write_all_data')) THEN 'may read all data' END
			], NULL),
			array(SELECT DISTINCT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
				WHERE c.relname = ANY($2) AND c.relkind IN ('r', 'p', 'v', 'm') AND n.nspname NOT IN ('pg_catalog', 'information_schema')
				  AND (has_any_column_privilege($1::name, c.oid, 'SELECT') OR EXISTS (SELECT 1 FROM m WHERE m.oid = c.relowner))
				ORDER BY 1)`, role, EngineTables).Scan(&powers, &tables)
	if err != nil {
		return "", fmt.Errorf("audience database: privileges of %s: %w", role, err)
	}
	if len(tables) > 0 {
		powers = append(powers, "may read the engine's tables ("+strings.Join(tables, ", ")+")")
	}
	return strings.Join(powers, ", "), nil
}
