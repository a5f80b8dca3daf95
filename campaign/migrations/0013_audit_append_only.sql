-- The audit log is appended to by every outcome and read back only by time (a launch's frequency cap, the
-- UI's rates: its BRIN index on at) and by message ID (a receipt that names nothing else). Its index by
-- campaign and user cost each send an entry in a B-tree; what read the log that way now reads the
-- recipient's row:
--   - whether a recipient was once recorded unknown (its message may have gone out with its code, which
--     then never goes back to the pool): campaign_recipients.ever_unknown. The statement that records an
--     outcome sets it with the status; a trigger sets it for any other writer of 'unknown' (an operator's
--     UPDATE, a binary of an earlier version). No index names it, so an outcome is still written in place.

ALTER TABLE campaign_recipients ADD COLUMN ever_unknown boolean NOT NULL DEFAULT false;

UPDATE campaign_recipients r SET ever_unknown = true
WHERE EXISTS (SELECT 1 FROM send_log l WHERE l.campaign_id = r.campaign_id AND l.user_id = r.user_id AND l.status = 'unknown');

-- After the update, not before it: a BEFORE row trigger makes every update lock its row first (a second
-- write per outcome), while an AFTER trigger's condition is read from the versions the update made, and
-- the function runs only for a row that became unknown without its mark.
CREATE FUNCTION campaign_recipient_ever_unknown() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE campaign_recipients SET ever_unknown = true
    WHERE campaign_id = NEW.campaign_id AND user_id = NEW.user_id AND NOT ever_unknown;
    RETURN NULL;
END
$$;
CREATE TRIGGER campaign_recipients_ever_unknown AFTER UPDATE OF status ON campaign_recipients
    FOR EACH ROW WHEN (NEW.status = 'unknown' AND NOT NEW.ever_unknown)
    EXECUTE FUNCTION campaign_recipient_ever_unknown();

DROP INDEX send_log_campaign;
