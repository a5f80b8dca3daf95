-- campaignctl schema, version 12: a recipient's outcome is written in place.
--
-- Recording an outcome changes status, sent_at and provider_message_id. While an index named any of them
-- (the partial indexes on status = 'pending' and status = 'sent', the index on provider_message_id), every
-- outcome wrote a new version of the whole row on another page, plus an entry in each of the table's
-- indexes: about 15 buffers and five index insertions a recipient, the largest share of Postgres's CPU
-- per message. With no index on a column an outcome changes and room left on each page, Postgres updates
-- the row on its own page (a heap-only tuple) and no index is touched.
--
-- What the dropped indexes found is found elsewhere:
--   - a batch's pending rows: the (campaign, batch) index, a batch at a time;
--   - whether a campaign has pending rows left: its batches not yet settled (campaign_batches.settled,
--     set once a batch has no pending row, cleared by a trigger when a row of it becomes pending again),
--     each looked at through the (campaign, batch) index;
--   - who was sent a message lately (a launch's frequency cap): the audit log's 'sent' entries by time,
--     through a BRIN index (the log is appended in time order), then the recipient row by its key;
--   - the recipient of a receipt that names only the provider's message ID: the audit entry that recorded
--     that message ID.
-- The audit log is written by the same statements as the outcomes, so it names every send the rows do.

ALTER TABLE campaign_batches ADD COLUMN settled boolean NOT NULL DEFAULT false;
UPDATE campaign_batches b SET settled = true
WHERE NOT EXISTS (SELECT 1 FROM campaign_recipients r
                  WHERE r.campaign_id = b.campaign_id AND r.batch = b.batch AND r.status = 'pending');
CREATE INDEX campaign_batches_unsettled ON campaign_batches (campaign_id, batch) WHERE NOT settled;

-- Whatever makes a recipient pending again (`resume --resend-unknown`, an operator's UPDATE, a binary of an
-- earlier version) takes its batch's mark away in the same transaction. An outcome never fires it: it
-- moves a row out of pending, or leaves it there.
CREATE FUNCTION campaign_batch_unsettle() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE campaign_batches SET settled = false
    WHERE campaign_id = NEW.campaign_id AND batch = NEW.batch AND settled;
    RETURN NULL;
END
$$;
CREATE TRIGGER campaign_recipients_unsettle AFTER UPDATE OF status, batch ON campaign_recipients
    FOR EACH ROW WHEN (NEW.status = 'pending' AND (OLD.status <> 'pending' OR OLD.batch <> NEW.batch))
    EXECUTE FUNCTION campaign_batch_unsettle();

-- A recipient made sent by a receipt (it was unknown) was not logged until now: its entry, so that the
-- frequency cap sees it.
INSERT INTO send_log (campaign_id, user_id, status, reason, provider_message_id, channel, template_hash, at)
SELECT r.campaign_id, r.user_id, 'sent', 'accepted by the provider (its receipt says ' || r.delivery || ')',
       r.provider_message_id, c.channel, c.template_hash, r.sent_at
FROM campaign_recipients r JOIN campaigns c ON c.id = r.campaign_id
WHERE r.status = 'sent' AND r.sent_at IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM send_log l WHERE l.campaign_id = r.campaign_id AND l.user_id = r.user_id AND l.status = 'sent');

CREATE INDEX campaign_recipients_batch ON campaign_recipients (campaign_id, batch);
DROP INDEX campaign_recipients_pending;
DROP INDEX campaign_recipients_sent;
DROP INDEX campaign_recipients_message;

CREATE INDEX send_log_sent_at ON send_log USING brin (at);
-- By a hash of the message ID: an integer key costs a send a third less to insert than the text (a
-- message ID is random: each lands on its own leaf), and a receipt compares the ID itself once found.
CREATE INDEX send_log_message ON send_log (hashtext(provider_message_id)) WHERE provider_message_id IS NOT NULL;

-- Room on each page for every row on it to be rewritten once in place: a row of the bulk case is about
-- 230 bytes, 280 once its outcome is written, and a chunk rewrites all the rows of a page in one statement
-- (none of the old versions can be pruned before it commits). New pages only: rows written before keep
-- their pages, and their outcomes are written as before.
ALTER TABLE campaign_recipients SET (fillfactor = 45);
