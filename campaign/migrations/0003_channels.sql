-- campaignctl schema, version 3: e-mail and push, and delivery receipts.

-- The webhook channel posts to an in-house system.
ALTER TABLE campaigns DROP CONSTRAINT campaigns_channel_check,
    ADD CONSTRAINT campaigns_channel_check CHECK (channel IN ('sms', 'email', 'push', 'webhook'));

-- An e-mail campaign may have an HTML part (html/template) and may name a template kept at the provider
-- (a SendGrid dynamic template, "d-..."). The subject column already exists.
ALTER TABLE campaigns
    ADD COLUMN html        text NOT NULL DEFAULT '',
    ADD COLUMN template_id text NOT NULL DEFAULT '';

-- Addresses a provider condemned for good (an unregistered push token): later launches exclude them as
-- invalid_address.
CREATE TABLE invalid_addresses (
    channel  text        NOT NULL,
    address  text        NOT NULL,
    reason   text        NOT NULL,
    at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (channel, address)
);

-- Delivery receipts (Twilio status callbacks, SendGrid events): what happened after the provider
-- accepted the message. status stays what the send returned (sent); delivery is the last receipt's word.
ALTER TABLE campaign_recipients
    ADD COLUMN delivery        text,
    ADD COLUMN delivery_error  text,
    ADD COLUMN delivery_at     timestamptz;

-- Receipts name the provider's message ID (Twilio's SID); only sent rows carry one.
CREATE INDEX campaign_recipients_message ON campaign_recipients (provider_message_id) WHERE provider_message_id IS NOT NULL;

-- Receipt events already applied (providers deliver them at least once).
CREATE TABLE receipt_events (
    provider  text        NOT NULL,
    event_id  text        NOT NULL,
    at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, event_id)
);
