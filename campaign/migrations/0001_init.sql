-- campaignctl schema, version 1.
-- Postgres is the source of truth for who was planned, sent and skipped; Redis only holds claims,
-- buckets, counters and queues, and can be rebuilt from these tables.

CREATE TABLE campaigns (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name          text        NOT NULL UNIQUE,
    channel       text        NOT NULL CHECK (channel IN ('sms', 'email', 'push')),
    state         text        NOT NULL CHECK (state IN ('planning', 'scheduled', 'running', 'paused',
                                                        'completed', 'cancelled', 'failed')),
    message       text        NOT NULL,
    subject       text        NOT NULL DEFAULT '',
    code_pool     text,
    rate          double precision NOT NULL DEFAULT 0,
    audience_sql  text        NOT NULL,
    audience      bigint      NOT NULL DEFAULT 0,
    eligible      bigint      NOT NULL DEFAULT 0,
    excluded      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    batch_size    integer     NOT NULL,
    batches       integer     NOT NULL DEFAULT 0,
    -- scheduling: when sending may start, the daily window (HH:MM-HH:MM, '' = any time) and its zone
    start_at      timestamptz,
    send_window   text        NOT NULL DEFAULT '',
    window_zone   text        NOT NULL DEFAULT 'Europe/Istanbul',
    -- no second commercial message to one address on this channel within this many seconds (0 = no cap)
    frequency_cap_seconds bigint NOT NULL DEFAULT 0,
    created_at    timestamptz NOT NULL DEFAULT now(),
    started_at    timestamptz,
    finished_at   timestamptz
);

-- One row per planned recipient. The primary key (campaign_id, user_id) is what makes a second plan of the
-- same person impossible; status moves pending -> sent | failed | skipped | unknown and never back, except
-- unknown -> pending on an explicit resend.
--
-- Foreign keys are left out on purpose here and below: a launch inserts up to millions of rows in one
-- statement, and a per-row key check costs seconds there. The planner writes campaign, recipients,
-- batches and reservations in one transaction, and campaigns are never deleted.
CREATE TABLE campaign_recipients (
    campaign_id          bigint      NOT NULL,
    user_id              text        NOT NULL,
    address              text        NOT NULL,
    vars                 jsonb       NOT NULL DEFAULT '{}'::jsonb,
    code                 text,
    code_id              bigint,
    batch                integer     NOT NULL,
    status               text        NOT NULL DEFAULT 'pending'
                                     CHECK (status IN ('pending', 'sent', 'failed', 'skipped', 'unknown')),
    reason               text,
    attempts             integer     NOT NULL DEFAULT 0,
    last_error           text,
    provider_message_id  text,
    segments             integer,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    sent_at              timestamptz,
    PRIMARY KEY (campaign_id, user_id)
);

CREATE INDEX campaign_recipients_batch ON campaign_recipients (campaign_id, batch);
-- One holder per code at a time. On the code's id, not its text: fresh codes are given out in id order,
-- so a launch appends to this index instead of inserting at random places (seconds at a million rows).
-- Recent sends, for the frequency cap at plan time. Partial: a launch inserts pending rows, which it skips.
CREATE INDEX campaign_recipients_sent ON campaign_recipients (sent_at) WHERE status = 'sent';
CREATE UNIQUE INDEX campaign_recipients_code_id ON campaign_recipients (code_id);
CREATE INDEX campaign_recipients_pending ON campaign_recipients (campaign_id) WHERE status = 'pending';

CREATE TABLE campaign_batches (
    campaign_id  bigint      NOT NULL,
    batch        integer     NOT NULL,
    size         integer     NOT NULL,
    enqueued_at  timestamptz,
    PRIMARY KEY (campaign_id, batch)
);

-- A pool is a name and a cursor: the codes of the pool with an id above next_id have never been given to
-- anyone. Reserving n codes takes the released ones first, then the next fresh ones in id order, and moves
-- the cursor: no per-code write at all, so a million codes are reserved in the time it takes to read them.
-- Writers of codes and the planner serialise on an advisory lock, so no code with a lower id can appear
-- after the cursor has passed it.
CREATE TABLE code_pools (
    name        text        PRIMARY KEY,
    next_id     bigint      NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Codes are unique across every pool and never change. Who holds a code is campaign_recipients.code_id
-- (unique there too): a code is given to at most one recipient at a time, and keeps that recipient across retries.
CREATE TABLE promo_codes (
    id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    pool  text   NOT NULL,
    code  text   NOT NULL UNIQUE
);

CREATE INDEX promo_codes_pool ON promo_codes (pool, id);

-- Codes of recipients who were never sent (failed for good, skipped, cancelled) go back to their pool here,
-- and are the first to be given out again.
CREATE TABLE released_codes (
    code_id      bigint      PRIMARY KEY,
    pool         text        NOT NULL,
    released_at  timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX released_codes_pool ON released_codes (pool, code_id);

-- İYS consents, keyed as İYS keys them: (recipient, type, recipient_type). Recipients are canonical:
-- phones in E.164 (+905XXXXXXXXX), e-mails lower-case.
CREATE TABLE iys_consents (
    recipient       text        NOT NULL,
    type            text        NOT NULL CHECK (type IN ('MESAJ', 'EPOSTA', 'ARAMA')),
    recipient_type  text        NOT NULL CHECK (recipient_type IN ('BIREYSEL', 'TACIR')),
    status          text        NOT NULL CHECK (status IN ('ONAY', 'RET')),
    source          text        NOT NULL DEFAULT '',
    consent_date    timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (recipient, type, recipient_type)
) WITH (fillfactor = 50); -- room for in-place (HOT) updates: a sync or re-import rewrites most rows

-- Append-only audit of every provider outcome and every send-time block.
CREATE TABLE send_log (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    campaign_id          bigint      NOT NULL,
    user_id              text        NOT NULL,
    status               text        NOT NULL,
    reason               text,
    provider_message_id  text,
    at                   timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX send_log_campaign ON send_log (campaign_id, user_id);
