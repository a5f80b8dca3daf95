-- campaignctl schema, version 19: a refusal is queued for İYS even while an earlier one of the same consent
-- is in a batch whose result is awaited.
--
-- Version 10 allowed one RET on its way per consent, waiting or sent. A person who refused, gave consent
-- again in İYS, and refused again while the first RET's batch result was awaited (İYS gives it no sooner
-- than five minutes later) had the second RET dropped: İYS kept the newer ONAY. Now only one may wait; a
-- newer refusal of a consent whose RET waits moves that RET's date (see iys.RecordRefusals).
DROP INDEX iys_outbox_pending;
CREATE UNIQUE INDEX iys_outbox_pending ON iys_outbox (brand_code, recipient, type, recipient_type)
    WHERE state = 'waiting';
