-- A provider that checks İYS itself (Netgsm's code 50) or keeps its own opt-outs (Twilio's 21610, a STOP)
-- may refuse a message for want of consent. That is recorded against the recipient's consent, turning a
-- stored ONAY to RET here only (nothing goes to İYS: the person refused nothing through the brand's
-- channels), with its own origin in the history. A re-verification (iys sync --reverify) or a newer
-- decision pulled from İYS sets it right if İYS holds an ONAY after all.
ALTER TABLE iys_consent_history DROP CONSTRAINT IF EXISTS iys_consent_history_origin_check;
ALTER TABLE iys_consent_history ADD CONSTRAINT iys_consent_history_origin_check
    CHECK (origin IN ('pull', 'reverify', 'import', 'refusal', 'provider'));
