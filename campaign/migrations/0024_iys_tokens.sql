-- The İYS API's access and refresh tokens, kept between runs of the iys commands: İYS gives 10 tokens an
-- hour per IP and restarts the hour on an early request, and a cron of sync and push every 15 minutes
-- asked for one each run. Sealed (AES-GCM) with a key derived from the API user's password: whoever reads
-- the table without IYS_PASSWORD reads nothing of use. halt_until keeps İYS's refusal of new tokens (H084)
-- so that a later run does not ask early and restart its hour.
CREATE TABLE iys_tokens (
    key         text        PRIMARY KEY,  -- a hash of the API's base URL and the user name
    sealed      bytea,
    halt_until  timestamptz,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
