-- campaignctl schema, version 15: when a campaign entered its state.
--
-- status says since when a campaign waits; for a paused campaign that is when it was paused. Every change
-- of state through Transition (pause, resume, cancel) records it; NULL for a state entered before this
-- version.
ALTER TABLE campaigns ADD COLUMN state_since timestamptz;
