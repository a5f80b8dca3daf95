-- campaignctl schema, version 5: chunk leases move from the recipients to their batch.
--
-- A batch run leases its batch, not each row: the batch row holds the run's random token, the lease's
-- expiry (renewed while the run sends), the Redis epoch its claims are taken under, and the users of the
-- chunk in hand (lease_users: claimed, or about to be, and not yet recorded). The semantics are those of
-- version 2: a second run of the same batch leaves a batch under a live lease alone; a lease that expired
-- belongs to a run that died and is taken over, and the Redis claims of its lease_users say which were
-- answered (or, if the epoch changed since, those without a claim become unknown). Recording a chunk's
-- outcomes empties lease_users; a run that ends lets the batch go.
--
-- One row write per chunk instead of one per recipient: the lease no longer rewrites every recipient row
-- (and its five indexes) before it is sent. The consent snapshot a row's audit record carries is read when
-- the chunk is leased, as before, and written with the outcome.
ALTER TABLE campaign_batches
    ADD COLUMN lease_token text,
    ADD COLUMN lease_until timestamptz,
    ADD COLUMN lease_epoch text,
    ADD COLUMN lease_users text[] NOT NULL DEFAULT '{}';

-- Chunks of runs that died are found by every worker's sweeper. Partial: only batches with a chunk in hand.
CREATE INDEX campaign_batches_lease ON campaign_batches (lease_until) WHERE lease_users <> '{}';

-- Rows leased under version 2 (an upgrade while a campaign runs) hand their lease to their batch.
UPDATE campaign_batches b SET lease_token = l.token, lease_until = l.until, lease_epoch = l.epoch, lease_users = l.users
FROM (
    SELECT campaign_id, batch, min(lease_token) AS token, max(lease_until) AS until, min(lease_epoch) AS epoch,
           array_agg(user_id) AS users
    FROM campaign_recipients
    WHERE lease_token IS NOT NULL AND status = 'pending'
    GROUP BY campaign_id, batch
) l
WHERE b.campaign_id = l.campaign_id AND b.batch = l.batch;

DROP INDEX campaign_recipients_lease;
ALTER TABLE campaign_recipients
    DROP COLUMN lease_token,
    DROP COLUMN lease_until,
    DROP COLUMN lease_epoch;

-- Pending recipients by campaign and batch (a batch run's load, what is left of a campaign) in one partial
-- index: an outcome takes its row out of it instead of adding an entry to a full (campaign, batch) index.
DROP INDEX campaign_recipients_batch;
DROP INDEX campaign_recipients_pending;
CREATE INDEX campaign_recipients_pending ON campaign_recipients (campaign_id, batch) WHERE status = 'pending';

-- The audit log is read by campaign and user (send_log_campaign); its id only orders it. No index on the
-- id: nothing looks an entry up by it, and every outcome would pay for one.
ALTER TABLE send_log DROP CONSTRAINT send_log_pkey;
