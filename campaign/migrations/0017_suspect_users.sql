-- campaignctl schema, version 17: the recipients of a batch whose message may have gone out unseen.
--
-- When a run takes over a chunk in hand that a dead run leased under another Redis epoch (Redis lost its
-- data since), that run's claims are gone: nothing tells which of those recipients it sent. They are
-- suspect until a run settles them from what Redis still says (unknown when it says nothing). The lease
-- records the new epoch at the takeover, so the mark must outlive it: a run that takes over and stops
-- before settling them (a failed Redis call, a lost reply, a SIGTERM) leaves them suspect for the next.
-- A recipient leaves the list when its outcome is recorded.
ALTER TABLE campaign_batches ADD COLUMN suspect_users text[] NOT NULL DEFAULT '{}';
