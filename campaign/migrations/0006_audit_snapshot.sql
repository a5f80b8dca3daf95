-- campaignctl schema, version 6: the consent snapshot travels with the outcome into the audit only.
--
-- A worker reads each recipient's consent when it leases the recipient's chunk, and the audit record of the
-- outcome (send_log's consent_* columns) keeps what it read. The copy the recipient row kept as JSON was
-- read by nothing but the outcome's own statement, and it made every outcome's row version (and its WAL)
-- a few hundred bytes larger.
ALTER TABLE campaign_recipients DROP COLUMN consent_snapshot;
