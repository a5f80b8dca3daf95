-- campaignctl schema, version 9: the most SMS segments a message of the campaign may take (launch
-- --max-segments); a message rendered longer fails at send time instead of costing ten times the price, or
-- being refused by the provider (Twilio takes at most 1,600 characters).
ALTER TABLE campaigns ADD COLUMN max_segments int NOT NULL DEFAULT 10;
