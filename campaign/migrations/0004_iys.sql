-- campaignctl schema, version 4: İYS sync, consent gates and the send audit.

-- What İYS said last about each consent: its transaction ID and when this engine last heard it. İYS keys a
-- consent by brand too: the brand code ('' for consents imported without one) joins the primary key.
ALTER TABLE iys_consents
    ADD COLUMN transaction_id text,
    ADD COLUMN synced_at      timestamptz,
    ADD COLUMN brand_code     text NOT NULL DEFAULT '';
ALTER TABLE iys_consents DROP CONSTRAINT iys_consents_pkey,
    ADD PRIMARY KEY (recipient, type, recipient_type, brand_code);

-- Every consent change received from the İYS API (pull or re-verification), append-only.
-- No primary key: it is only appended to and read per recipient, and an import of 1.7 million consents
-- writes as many rows, each index entry costing time.
CREATE TABLE iys_consent_history (
    id              bigint GENERATED ALWAYS AS IDENTITY,
    recipient       text        NOT NULL,
    type            text        NOT NULL,
    recipient_type  text        NOT NULL,
    brand_code      text        NOT NULL DEFAULT '',
    status          text        NOT NULL,
    source          text        NOT NULL DEFAULT '',
    consent_date    timestamptz NOT NULL,
    transaction_id  text,
    origin          text        NOT NULL CHECK (origin IN ('pull', 'reverify', 'import')),
    recorded_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX iys_consent_history_recipient ON iys_consent_history (recipient, type, recipient_type, brand_code, id);

-- The consent-changes pull: one cursor per İYS source, and when the engine's consents were last brought
-- up to date (a pull that reached the end, a re-verification, or a CSV import).
CREATE TABLE iys_sync_state (
    brand_code       text        NOT NULL DEFAULT '',
    source           text        NOT NULL,
    cursor           text        NOT NULL DEFAULT '',
    last_success_at  timestamptz,
    PRIMARY KEY (brand_code, source)
);

-- Consent gates chosen at launch.
ALTER TABLE campaigns
    ADD COLUMN recipient_type      text    NOT NULL DEFAULT 'BIREYSEL' CHECK (recipient_type IN ('BIREYSEL', 'TACIR')),
    ADD COLUMN transactional       boolean NOT NULL DEFAULT false,
    ADD COLUMN allow_stale_consent boolean NOT NULL DEFAULT false,
    ADD COLUMN template_hash       text    NOT NULL DEFAULT '',
    ADD COLUMN brand_code          text    NOT NULL DEFAULT '';

-- The consent a worker read for a recipient when it took the recipient's chunk (status, source, date,
-- transaction ID, sync time), copied into the audit with the outcome.
ALTER TABLE campaign_recipients ADD COLUMN consent_snapshot jsonb;

-- The audit: every send and every block, with the consent it was decided on.
ALTER TABLE send_log
    ADD COLUMN channel            text,
    ADD COLUMN consent_status     text,
    ADD COLUMN consent_source     text,
    ADD COLUMN consent_date       timestamptz,
    ADD COLUMN consent_txn        text,
    ADD COLUMN consent_synced_at  timestamptz,
    ADD COLUMN template_hash      text;
