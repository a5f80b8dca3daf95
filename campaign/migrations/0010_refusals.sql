-- campaignctl schema, version 10: refusals that come back through the messages (a one-click unsubscribe,
-- a SendGrid unsubscribe or spam report, an SMS "RET" to the sender), and the outbox that registers them
-- in İYS.
--
-- A refusal is a local RET at once: it is written to iys_consents (which moves iys_consents_version, so
-- the next chunk of every running campaign reads the person's consent again and skips them as revoked),
-- appended to the consent history with origin 'refusal', and kept here with its evidence. Law 6563: a
-- refusal the brand receives through its own channels is registered in İYS, within three business days.

-- Every refusal as it arrived, once per provider event (a provider repeats its posts; a person may click
-- a link twice): the audit of where each came from.
CREATE TABLE refusals (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    via          text        NOT NULL,  -- one_click, sendgrid, twilio_inbound
    event_id     text        NOT NULL,  -- the provider's event ID, or the link's campaign:user
    kind         text        NOT NULL,  -- unsubscribe, group_unsubscribe, spamreport, inbound, one_click
    recipient    text        NOT NULL,  -- canonical: E.164, or the e-mail in lower case
    type         text        NOT NULL CHECK (type IN ('MESAJ', 'EPOSTA', 'ARAMA')),
    source       text        NOT NULL,  -- the İYS source of the RET: HS_EPOSTA, HS_MESAJ
    campaign_id  bigint,
    user_id      text,
    evidence     text        NOT NULL,
    refused_at   timestamptz NOT NULL,  -- when the person refused (the provider's event time)
    recorded_at  timestamptz NOT NULL DEFAULT now(),
    consents     int         NOT NULL DEFAULT 0, -- the stored consents it turned from ONAY to RET
    UNIQUE (via, event_id)
);
CREATE INDEX refusals_recipient ON refusals (recipient, type);

-- The RETs to register in İYS, one per consent a refusal turned from ONAY to RET (a consent already RET,
-- or never stored, has nothing to register: İYS refuses a first add as RET, H175). brand_code '' is
-- registered under the pusher's IYS_BRAND_CODE.
CREATE TABLE iys_outbox (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    refusal_id      bigint      NOT NULL REFERENCES refusals (id),
    brand_code      text        NOT NULL DEFAULT '',
    recipient       text        NOT NULL,
    type            text        NOT NULL,
    recipient_type  text        NOT NULL,
    status          text        NOT NULL DEFAULT 'RET',
    source          text        NOT NULL,
    consent_date    timestamptz NOT NULL,
    -- waiting: to send (again, from next_at); sent: in an İYS batch request whose result is awaited;
    -- accepted: İYS registered it; already: İYS held RET already (H174); refused: İYS refused it (the code
    -- is kept) and it is not tried again.
    state           text        NOT NULL DEFAULT 'waiting' CHECK (state IN ('waiting', 'sent', 'accepted', 'already', 'refused')),
    attempts        int         NOT NULL DEFAULT 0,
    next_at         timestamptz NOT NULL DEFAULT now(),
    request_id      text,
    item_index      int,
    sent_at         timestamptz,
    transaction_id  text,
    error_code      text,
    error           text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    done_at         timestamptz,
    -- Two business days after the refusal: past it, still not registered, the outbox is reported loudly
    -- (the law's limit is three).
    due_at          timestamptz NOT NULL
);
-- One RET on its way per consent: a second refusal of the same person while the first waits adds none.
CREATE UNIQUE INDEX iys_outbox_pending ON iys_outbox (brand_code, recipient, type, recipient_type)
    WHERE state IN ('waiting', 'sent');
CREATE INDEX iys_outbox_state ON iys_outbox (state, next_at);

ALTER TABLE iys_consent_history DROP CONSTRAINT IF EXISTS iys_consent_history_origin_check;
ALTER TABLE iys_consent_history ADD CONSTRAINT iys_consent_history_origin_check
    CHECK (origin IN ('pull', 'reverify', 'import', 'refusal'));
