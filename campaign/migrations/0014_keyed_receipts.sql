-- A receipt finds its recipient by the campaign and user it names (Twilio's status callback URL carries
-- them when the worker sets one for each message, SendGrid's custom_args always), or, naming only the
-- provider's message ID, through the audit entry that recorded that ID. Only the sends whose receipts can
-- arrive that way need the entry in the message-ID index: a message ID is random, so each entry is an
-- insertion into its own leaf of a large B-tree, the costliest part of an outcome's audit row.
-- receipt_keyed marks the sends whose receipts name their recipient (the provider said so when it sent).
-- Entries written before are not marked, and stay in the index.
ALTER TABLE send_log ADD COLUMN receipt_keyed boolean NOT NULL DEFAULT false;

DROP INDEX send_log_message;
CREATE INDEX send_log_message ON send_log (hashtext(provider_message_id))
    WHERE provider_message_id IS NOT NULL AND NOT receipt_keyed;
