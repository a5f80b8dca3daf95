package worker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/internal/state"
)

// While a webhooks process holds refusals in its spool (providers posted them while Postgres was away),
// a worker leases nothing to send: the consents it would read miss them. Before, the workers sent as soon
// as Postgres was back, on consents read before the spool was written into it: an outside run had 124 of
// 1,000 unsubscribed recipients e-mailed after the unsubscribe was acknowledged. Once the note is
// cleared (the spool is empty), or has run out (its process died), the batch goes.
func TestNoSendWhileRefusalsWaitInTheSpool(t *testing.T) {
	t.Parallel()
	f := plan(t, 8) // eligible: u1, u2, u4, u7, u8
	ctx := context.Background()
	if err := state.NoteRefusalsHeld(ctx, f.rdb, "hooks-1", time.Minute); err != nil {
		t.Fatal(err)
	}
	err := f.h.RunBatch(ctx, f.id, 0)
	var re *RetryError
	if !errors.As(err, &re) || re.Failure || !re.Wait {
		t.Fatalf("the run returned %v; want the batch back for later, without a failure", err)
	}
	if n := f.provider.total(); n != 0 {
		t.Fatalf("%d messages sent while refusals waited in the spool", n)
	}
	if w, _ := state.Waits(ctx, f.rdb, f.id); w[WaitRefusalsHeld].Reason != WaitRefusalsHeld {
		t.Fatalf("waiting notes %v; want %s for status", w, WaitRefusalsHeld)
	}
	if err := state.ClearRefusalsHeld(ctx, f.rdb, "hooks-1"); err != nil {
		t.Fatal(err)
	}
	// A note that ran out (its webhooks process died) holds nobody.
	if err := state.NoteRefusalsHeld(ctx, f.rdb, "hooks-2", time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	if err := f.h.RunBatch(ctx, f.id, 0); err != nil {
		t.Fatal(err)
	}
	if c := f.counts(t); c.Sent != 5 {
		t.Fatalf("counts %+v once the spool is empty; want the 5 eligible sent", c)
	}
	if w, _ := state.Waits(ctx, f.rdb, f.id); len(w) > 0 {
		t.Fatalf("waiting notes %v once the batch went; want none", w)
	}
}

// failRefusalsCheck is a go-redis hook that fails the worker's check of the refusals held (the script over
// state.RefusalsHeldKey) as an unreachable Redis would, and lets every other command through.
type failRefusalsCheck struct{}

func (failRefusalsCheck) DialHook(next redis.DialHook) redis.DialHook { return next }

func (failRefusalsCheck) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "evalsha" || name == "eval" {
			for _, a := range cmd.Args() {
				if a == state.RefusalsHeldKey {
					err := errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")
					cmd.SetErr(err)
					return err
				}
			}
		}
		return next(ctx, cmd)
	}
}

func (failRefusalsCheck) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// The check of the refusals held fails closed: while a webhooks process holds refusals and Redis does not
// answer that check, nothing is sent and the batch waits, without using its retries. Taken for "none held",
// the run would lease and send on consents that miss those refusals (the claims that follow answer: only
// this check failed).
func TestRefusalsHeldFailsClosedOnARedisError(t *testing.T) {
	t.Parallel()
	f := plan(t, 8) // eligible: u1, u2, u4, u7, u8
	ctx := context.Background()
	if err := state.NoteRefusalsHeld(ctx, f.rdb, "hooks-1", time.Minute); err != nil {
		t.Fatal(err)
	}
	f.rdb.AddHook(failRefusalsCheck{})
	err := f.h.RunBatch(ctx, f.id, 0)
	var re *RetryError
	if !errors.As(err, &re) || re.Failure {
		t.Fatalf("the run returned %v; want the batch back for later, without a failure", err)
	}
	if n := f.provider.total(); n != 0 {
		t.Fatalf("%d messages sent while the refusals held could not be read", n)
	}
	if err := state.ClearRefusalsHeld(ctx, f.rdb, "hooks-1"); err != nil {
		t.Fatal(err)
	}
	if held, err := state.RefusalsHeld(ctx, f.rdb); err == nil || held {
		t.Fatalf("the hook let the check through (%v, %v): this tests nothing", held, err)
	}
}
