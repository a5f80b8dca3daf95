-- A provider's refusal for want of consent (Netgsm's code 50, Twilio's 21610 at creation) as it came in,
-- until the consents it turns RET are written. The worker that got the answer writes them in the
-- background (an import may hold the consents for minutes); a worker killed first (kill -9, OOM, a
-- shutdown that could not wait) leaves the row here, and another worker writes it: nothing else would ever
-- carry the provider's word again (no message was created, so no status callback follows).
--
-- holder is the liveness lock key (campaign.Lease.Holder) of the worker writing it: nobody else takes the
-- row while that lock is held. A row without a holder is taken once taken_until has passed. The table
-- holds only the refusals not written yet, a handful: it has no index but its key.
CREATE TABLE pending_provider_refusals (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    campaign_id  bigint      NOT NULL,
    user_ids     text[]      NOT NULL,
    addresses    text[]      NOT NULL,  -- canonical, in the order of user_ids
    opted_out    boolean     NOT NULL,  -- the person's refusal (Twilio 21610), not İYS holding none (Netgsm 50)
    reason       text        NOT NULL,  -- the provider's answer: the refusal's evidence or source
    refused_at   timestamptz NOT NULL,
    holder       bigint,
    taken_until  timestamptz NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
