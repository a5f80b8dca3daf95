-- A delivery receipt that names only the provider's message ID (a Twilio callback set on the account, not
-- per message) and came before the worker recorded the send that carries that ID: the worker writes its
-- chunk's outcomes after the provider's answers (a second or so later; up to minutes while Postgres is
-- away). Such a receipt is kept here, and the webhooks process applies it again every few seconds until
-- the send is recorded, or drops it once it is older than a send can be held (RetryEarlyReceipts). Before,
-- it was dropped at once as naming no message of this engine's, and its event ID counted as seen, so that
-- the provider's repeat was ignored too.
--
-- A receipt that names its campaign and user is matched to the recipient's row whatever its outcome, and
-- never comes here. The table holds only the receipts waiting, a handful: no index but its key.
CREATE TABLE early_receipts (
    provider     text        NOT NULL,
    event_id     text        NOT NULL,
    message_id   text        NOT NULL,
    status       text        NOT NULL,
    error        text        NOT NULL DEFAULT '',
    at           timestamptz NOT NULL,
    received_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, event_id)
);
