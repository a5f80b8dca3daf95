// Package campaign holds the campaign model, its Postgres store and the launch planner.
//
// # Lifecycle
//
// A launch plans a campaign in one transaction: it streams the audience query's rows into a staging table,
// classifies every row (missing user, duplicate user, invalid number, duplicate number, no consent, RET),
// inserts the eligible recipients each with one promo code reserved from the pool and a batch number, records
// the batches, and commits with the campaign in state running (or rolls everything back on a dry run or on
// any error, so a failed launch leaves nothing behind). Only then are the batches enqueued (package worker);
// a crash between commit and enqueue is repaired by resume, which enqueues again under the same task IDs.
//
// States: planning → running → completed, with paused, cancelled and failed as side exits.
//
// # Delivery guarantee
//
// Postgres is the source of truth. A recipient row moves once from pending to sent, failed, skipped or
// unknown; the store only updates rows that are still pending, so an outcome recorded twice (a redelivered
// batch) changes nothing. Which recipients were claimed in Redis, and what the provider answered, is
// written into the claim first, so that no crash can lose an outcome or cause a second send.
package campaign
