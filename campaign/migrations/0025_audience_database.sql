-- The audience database a campaign was launched on (its current_database()): the workers run its audience
-- query again there at send time to read push and webhook opt-ins, and refuse to read them anywhere else
-- (a worker without the launch's AUDIENCE_DATABASE_URL would read a table of the same name in the engine's
-- database). NULL for campaigns launched before.
ALTER TABLE campaigns ADD COLUMN audience_database text;
