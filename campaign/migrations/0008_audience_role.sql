-- campaignctl schema, version 8: the audience query runs with least privilege.
--
-- The audience SQL is written by whoever launches a campaign, and the engine's own connection is often a
-- superuser (the default DATABASE_URL connects as postgres). A read-only transaction is no sandbox: a
-- superuser's SELECT can read server files (pg_read_file, lo_import), list directories, reload the
-- configuration, terminate other sessions, reach other databases through dblink, and read the engine's own
-- tables (codes, consents, the audit) into a message. So the query runs as campaignctl_audience, a role
-- that cannot log in and holds only what an operator grants it (GRANT SELECT ON customers TO
-- campaignctl_audience).
--
-- SET ROLE is not enough: the session user may always set its role back (set_config('role', ...) inside
-- the query itself, then query_to_xml('...') runs anything as the session user). The query runs instead
-- inside a SECURITY DEFINER function owned by campaignctl_audience: there, PostgreSQL refuses to change
-- the role or the session authorization at all, for the query and whatever it calls.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'campaignctl_audience') THEN
        CREATE ROLE campaignctl_audience NOLOGIN;
    END IF;
EXCEPTION
    WHEN duplicate_object OR unique_violation THEN
        NULL; -- another database of the cluster created it a moment ago
    WHEN insufficient_privilege THEN
        RAISE EXCEPTION 'the role % may not create roles: ask a database administrator to run CREATE ROLE campaignctl_audience NOLOGIN (and GRANT campaignctl_audience TO %), then run campaignctl migrate again', current_user, current_user;
END
$$;

-- A role that is not a superuser must be a member of the role it makes a function's owner. One that is a
-- member already (an administrator granted it, or another database's migration did) grants nothing: the
-- grant needs the role's ADMIN OPTION, which such a member need not have.
DO $$
BEGIN
    IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
       AND NOT pg_has_role(current_user, 'campaignctl_audience', 'MEMBER') THEN
        EXECUTE format('GRANT campaignctl_audience TO %I', current_user);
    END IF;
EXCEPTION
    WHEN insufficient_privilege THEN
        RAISE EXCEPTION 'the role % is not a member of campaignctl_audience and may not make itself one: ask a database administrator to run GRANT campaignctl_audience TO %, then run campaignctl migrate again', current_user, current_user;
END
$$;

-- The function's own schema, so that the audience role needs CREATE on nothing else.
CREATE SCHEMA campaignctl_audience;
GRANT USAGE, CREATE ON SCHEMA campaignctl_audience TO campaignctl_audience;

-- rows runs one audience query as campaignctl_audience; the caller names the result's columns and types
-- (described beforehand), so each value keeps its type.
CREATE FUNCTION campaignctl_audience.rows(query text) RETURNS SETOF record
    LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    RETURN QUERY EXECUTE query;
END
$$;
ALTER FUNCTION campaignctl_audience.rows(text) OWNER TO campaignctl_audience;
REVOKE ALL ON FUNCTION campaignctl_audience.rows(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION campaignctl_audience.rows(text) TO CURRENT_USER;

-- A launch with --allow-privileged-audience says so here.
ALTER TABLE campaigns ADD COLUMN privileged_audience boolean NOT NULL DEFAULT false;
