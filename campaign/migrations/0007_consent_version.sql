-- campaignctl schema, version 7: a send-time consent check that reads nothing per recipient while no
-- consent has changed since the launch.
--
-- Every statement that writes iys_consents (INSERT, UPDATE, DELETE, COPY, TRUNCATE; an import, a sync,
-- a hand-written fix) moves iys_consents_version in its own transaction. A launch reads the version before
-- it reads the consents and keeps it on the campaign, with each planned recipient's consent as it read it.
-- When a chunk is leased, the same statement reads the version again: unchanged, no consent can differ
-- from what the launch read, and the lease takes the recipients' planned consents; changed, it reads each
-- recipient's consent from iys_consents as before (a RET given after the launch blocks the send either way).
CREATE TABLE iys_consents_version (
    one      boolean PRIMARY KEY DEFAULT true CHECK (one),
    version  bigint  NOT NULL
);
INSERT INTO iys_consents_version (one, version) VALUES (true, 1);

CREATE FUNCTION iys_consents_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE iys_consents_version SET version = version + 1;
    RETURN NULL;
END
$$;

-- Per statement, not per row: an import of millions of rows moves the version once. Before the statement,
-- not after: the version row stays locked until the writer commits, so writers of consents queue on it, and
-- a writer takes it before the first consent row it locks. Taken after, two writers whose statements
-- touch the same consents could each hold a row the other waits for.
CREATE TRIGGER iys_consents_changed BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON iys_consents
    FOR EACH STATEMENT EXECUTE FUNCTION iys_consents_changed();
-- Whatever session_replication_role says (a restore or a tool that sets it to replica).
ALTER TABLE iys_consents ENABLE ALWAYS TRIGGER iys_consents_changed;
-- Logical replication applies changes row by row and fires no statement trigger for them: a row trigger
-- enabled only for replication moves the version there too, one write per replicated row, while ordinary
-- sessions keep one write per statement.
CREATE TRIGGER iys_consents_replicated AFTER INSERT OR UPDATE OR DELETE ON iys_consents
    FOR EACH ROW EXECUTE FUNCTION iys_consents_changed();
ALTER TABLE iys_consents ENABLE REPLICA TRIGGER iys_consents_replicated;

-- NULL (campaigns launched before this version, and those whose consents are not İYS's): the lease reads
-- every recipient's consent.
ALTER TABLE campaigns ADD COLUMN consent_version bigint;

-- The consent each recipient was planned on (NULL where none was read), for the audit of a send leased
-- while the version is unchanged.
ALTER TABLE campaign_recipients
    ADD COLUMN consent_status    text,
    ADD COLUMN consent_source    text,
    ADD COLUMN consent_date      timestamptz,
    ADD COLUMN consent_txn       text,
    ADD COLUMN consent_synced_at timestamptz;
