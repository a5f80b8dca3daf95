-- campaignctl schema, version 11: the audience rows a launch excluded, each with its reason, for
-- `campaignctl report`. Until now only their counts by reason were kept (campaigns.excluded).
--
-- Written once, by the plan's transaction, in one INSERT ... SELECT from the classified audience; never
-- updated. user_id and address are NULL where the audience row had none (missing_user, invalid_address).
-- No primary key and no foreign key: a launch of a million customers writes a quarter of a million rows
-- here, and the report reads them by campaign only, so one index on campaign_id is all it pays for.
CREATE TABLE campaign_exclusions (
    campaign_id  bigint NOT NULL,
    user_id      text,
    address      text,
    reason       text   NOT NULL
);
CREATE INDEX campaign_exclusions_campaign ON campaign_exclusions (campaign_id);
