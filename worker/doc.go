// Package worker runs campaign batches from the Asynq queue and delivers them through the providers.
//
// # The life of one recipient
//
//	launch    planned in Postgres: pending, with its code and batch (campaign.Planner)
//	queue     its batch is one Asynq task "<campaign>:<batch>" (Enqueue)
//	lease     a run leases the recipient's chunk: state, consent read again (RunBatch, gate)
//	pace      a token from the campaign's and the provider's buckets (limiter, readyToSend)
//	claim     SET NX sent:<campaign>:<user> just before the call (State.ClaimSend / ClaimWindow)
//	send      the provider's adapter (providers.Provider), one message or one request of many
//	answer    judge: accepted, ambiguous, refused, ... → the claim, the mark, the code (answer.go)
//	record    outcomes written to Postgres per chunk, the lease let go (flush, campaign.Store.Record)
//	receipt   a delivery receipt later sets its delivery, and proves a send the worker could not (webhooks)
//	recover   a dead run's chunk: swept from its claims (Sweep), or unknown when Redis lost them
//
// # Delivery guarantee
//
// A batch task carries only a campaign ID and a batch number; the handler reads the batch's still-pending
// recipients from Postgres, so a task that runs twice (redelivery after a crash, a lease lost, a second
// enqueue after success) only sees what is left. For each recipient, in this order:
//
//  1. consent is checked again (a RET recorded after launch blocks the send: skipped, reason revoked);
//  2. a token is taken from the campaign's and the provider's Redis buckets (shared by all workers);
//  3. the claim SET sent:<campaign>:<user> NX is taken, just before the provider call;
//  4. the provider is called, and its answer is written into the claim at once (state.Sent, Failed, Unknown);
//  5. outcomes are written to Postgres in bulk, only onto rows still pending.
//
// A claim that already exists is never sent again: its value says what happened (sent, failed, unknown),
// or, when it holds no answer, either that another live worker is sending right now (young claim: leave it
// pending and look again later) or that a worker died while waiting for the provider (old claim: the
// recipient becomes unknown, since the message may have gone out). A definite transient rejection (429,
// 5xx, connection refused) releases the claim for a retry; a timeout after the request was written is
// ambiguous and makes the recipient unknown. Any Redis error stops the batch before the send (fail closed).
//
// The claims are only as complete as the Redis that holds them. A random epoch (EpochKey) names the data
// they were taken in: chunk leases record it, and a claim is refused under another one. It is tied to the
// master it was issued on (EpochServerKey: run_id and replication ID), and renewed when Redis is emptied,
// restarted or failed over, even to a replica that lagged and so lost the last claims while keeping the
// epoch. Every new connection checks it before carrying a command (CheckEpochOnConnect), and so does
// Epoch, read at each batch start and sweep. A chunk taken over from a dead run under another epoch is
// settled from the claims that remain; its other recipients become unknown, never sent again.
//
// # Lifecycle
//
// Launch plans a campaign in Postgres and then queues one task per batch (plan before queue, so a launch
// stopped in between leaves either nothing or a complete plan). Pause and Cancel record the new state in
// Postgres and set the halt mark (HaltKey) that the claim script reads, so no new send starts on any
// worker once they return (sends whose claims are over 100 ms old when they are to leave, as after a
// stall of Redis that queued the halt behind them, read the mark again first); Cancel then closes the
// recipients not sent. Resume continues a paused
// campaign, or any campaign after an incident, from Postgres: it rebuilds the progress counters, takes
// the campaign's batches out of the dead-letter queue and queues every batch with pending recipients.
// ListDLQ, RetryDLQ and PurgeDLQ work on the dead-letter queue (Asynq's archive); Status and ListStatus
// read where campaigns stand, and QueueObserver what the worker supervisor sizes its pool by. Each takes
// an options struct and returns a report, for the CLI to print.
//
// Claim values start with the campaign's nonce (its creation time), because campaign IDs start again at 1
// when the engine database is re-created while Redis may still hold the old campaign 1's claims: a claim
// with another nonce is a leftover and is replaced, never read as this campaign's.
package worker
