// Package supervisor runs worker processes and scales them with the batch queue's backlog and with what the
// rate caps let the workers send. It knows nothing of Asynq, Redis or Postgres: an Observer tells it what
// the queue and the caps look like, and it starts and stops processes.
//
// # Lifecycle
//
// Run starts Policy.Min workers and takes its first decision at once, then one every Interval:
//
//   - Scale up: the missing workers are started at once.
//   - Scale down: one worker at a time, once fewer workers have been enough for the whole Cooldown and the
//     Cooldown has passed since the last change, and not while a pending task has waited WaitLimit. The
//     worker gets SIGTERM (it finishes the send in flight and hands its batches back to the queue within
//     its own --shutdown-timeout); the next scale down waits until it has exited. A worker still running
//     ShutdownTimeout + KillMargin after its SIGTERM is SIGKILLed (its batches come back through Asynq's
//     lease and the sweeper, as after any crash).
//   - A worker that exits without being asked is started again after a backoff (1 s, doubling up to 30 s
//     while workers keep dying within 30 s of their start) and counted in Status.Restarts. A worker that
//     exits with status 2 (bad usage or configuration) is not: Run stops the others and returns
//     ErrWorkerUsage, since it would only fail again.
//   - A worker whose heartbeat no look has found live (Observation.Beating) for Config.HungAfter is SIGKILLed
//     and another started in its place: frozen or hung, it counted as running while it sent nothing.
//   - When the Observer fails, the pool stays as it is until the queue can be seen again.
//   - When ctx is done, every worker gets SIGTERM and Run returns once all have exited.
//
// Every decision is logged with its figures and a one-word reason (see Decide for the formula): a change
// always, a hold when its reason changes.
package supervisor
