-- campaignctl schema, version 18: the provider that sent (or refused) each recipient's message.
--
-- A worker records it with the outcome: the channel's provider, or its fallback when the first was down.
-- NULL for a recipient never sent, for an outcome read back from a claim (a run that took a chunk over),
-- and for rows recorded before this version; `campaignctl report` then names the channel's provider as
-- the environment configures it.
ALTER TABLE campaign_recipients ADD COLUMN provider text;
