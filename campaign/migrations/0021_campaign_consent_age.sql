-- A commercial launch on an İYS channel refuses consents brought up to date longer ago than its
-- --max-consent-age, unless --allow-stale-consent. A batch that runs much later (its retries, the DLQ,
-- resume) must not send on consents older than that either: the campaign keeps the age it was launched
-- with (NULL: none, or the launch allowed stale consents), and a batch that finds them older hands itself
-- to the DLQ with what to run.
ALTER TABLE campaigns ADD COLUMN max_consent_age_seconds bigint;
