-- campaignctl schema, version 2: chunk leases.
--
-- Before a worker claims the recipients of a chunk in Redis it leases their rows here, with a random token
-- of its batch run, an expiry it renews while it sends, and the Redis epoch (a value kept in Redis that
-- changes when Redis loses its data). A second run of the same batch (a redelivery, or a task enqueued
-- again after Redis was emptied) leaves rows under a live lease alone, so two runs never send one chunk
-- at once. A lease that expired belongs to a run that died: its rows are taken over, and the Redis claims
-- say which were answered. When the epoch changed since, those claims may be gone, so a row without one
-- becomes unknown instead of being sent a second time. A run that ends normally clears its leases.
ALTER TABLE campaign_recipients
    ADD COLUMN lease_token text,
    ADD COLUMN lease_until timestamptz,
    ADD COLUMN lease_epoch text;


-- Expired leases are found by every worker's sweeper, which settles a dead run's chunk from its claims
-- while Redis still has them. Partial: only rows under a lease are in it.
CREATE INDEX campaign_recipients_lease ON campaign_recipients (lease_until) WHERE lease_token IS NOT NULL;
