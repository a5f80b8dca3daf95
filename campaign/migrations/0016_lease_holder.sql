-- campaignctl schema, version 16: which worker process holds a batch's lease.
--
-- lease_holder is the key of a session advisory lock that the worker process holding the lease keeps
-- while it lives (worker.Liveness). A process killed outright closes its connection and Postgres lets
-- the lock go at once: the sweep then takes the chunk in hand of a dead process without waiting for the
-- lease to expire (lease_until outlives the provider's timeout, 30 s by default). NULL for a lease taken
-- by a run without one (an earlier binary, tests), which is only ever taken over once it expires.
ALTER TABLE campaign_batches ADD COLUMN lease_holder bigint;
