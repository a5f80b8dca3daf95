package worker

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/iys"
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
	if held, err := state.RefusalsHeldNow(ctx, f.rdb); err == nil || held.Held {
		t.Fatalf("the hook let the check through (%v, %v): this tests nothing", held, err)
	}
}

// afterLeaseStore runs after once, after the first LeaseChunk has read the chunk's consents.
type afterLeaseStore struct {
	Store
	once  sync.Once
	after func()
}

func (s *afterLeaseStore) LeaseChunk(ctx context.Context, c *campaign.Campaign, users []string, l campaign.Lease) (campaign.Chunk, error) {
	got, err := s.Store.LeaseChunk(ctx, c, users, l)
	if err == nil {
		s.once.Do(s.after)
	}
	return got, err
}

// Refusals spooled while the lease's consent read waited on Postgres (frozen, then thawed): the read's
// snapshot missed them, and by the time it returned the spool had been written into Postgres and its note
// cleared. The run looks at the notes again after the read, sees that one was written meanwhile, and
// reads the consents again before any send. Before, an outside run froze Postgres 14-42 s while STOP
// replies came in, and 2 to 9 of 8-10 refused recipients were texted once it thawed.
func TestARefusalSpooledDuringTheConsentReadIsReadBeforeAnySend(t *testing.T) {
	t.Parallel()
	f := plan(t, 8) // eligible: u1, u2, u4, u7, u8
	ctx := context.Background()
	f.h.cfg.Store = &afterLeaseStore{Store: f.store, after: func() {
		// The webhooks process: a STOP spooled (its note first), then Postgres back and the spool written
		// into it, the note cleared.
		if err := state.NoteRefusalsHeld(ctx, f.rdb, "hooks-1", time.Minute); err != nil {
			t.Error(err)
		}
		if _, err := f.db.Exec(ctx, `UPDATE iys_consents SET status = 'RET', source = 'IYS_MESAJ', consent_date = now() WHERE recipient IN ($1, $2)`, phone(1), phone(2)); err != nil {
			t.Error(err)
		}
		if err := state.ClearRefusalsHeld(ctx, f.rdb, "hooks-1"); err != nil {
			t.Error(err)
		}
	}}
	err := f.h.RunBatch(ctx, f.id, 0)
	var re *RetryError
	if !errors.As(err, &re) || re.Failure || !re.Wait {
		t.Fatalf("the run returned %v; want the batch back for later, without a failure", err)
	}
	if n := f.provider.total(); n != 0 {
		t.Fatalf("%d messages sent on consents read while refusals were spooled", n)
	}
	if err := f.h.RunBatch(ctx, f.id, 0); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"u1", "u2"} {
		if st, reason, _ := f.status(t, u); st != campaign.StatusSkipped || reason != campaign.ReasonRevoked {
			t.Errorf("%s is %s (%s), want skipped (%s)", u, st, reason, campaign.ReasonRevoked)
		}
	}
	if c := f.counts(t); c.Sent != 3 || c.Pending != 0 {
		t.Fatalf("counts %+v; want u4, u7 and u8 sent, u1 and u2 skipped", c)
	}
	f.assertOnce(t)
}

// The look at the spools' notes after the lease's consent read fails closed too: Redis not answering it,
// nothing of the chunk is sent and the batch waits, without using its retries.
func TestTheSecondLookAtTheRefusalsHeldFailsClosed(t *testing.T) {
	t.Parallel()
	f := plan(t, 8) // eligible: u1, u2, u4, u7, u8
	ctx := context.Background()
	f.h.cfg.Store = &afterLeaseStore{Store: f.store, after: func() { f.rdb.AddHook(failRefusalsCheck{}) }}
	err := f.h.RunBatch(ctx, f.id, 0)
	var re *RetryError
	if !errors.As(err, &re) || re.Failure {
		t.Fatalf("the run returned %v; want the batch back for later, without a failure", err)
	}
	if n := f.provider.total(); n != 0 {
		t.Fatalf("%d messages sent while the second look at the refusals held could not be read", n)
	}
	// The chunk it leased, and claimed nothing of, is let go: kept in hand through a Redis restart (a new
	// epoch), it was settled unknown from claims never taken; an outside run had 100 recipients of a batch
	// unknown, never sent, after a plain Redis restart with every worker alive.
	var inHand []string
	if err := f.db.QueryRow(ctx, `SELECT lease_users FROM campaign_batches WHERE campaign_id = $1 AND batch = 0`, f.id).Scan(&inHand); err != nil {
		t.Fatal(err)
	}
	if len(inHand) != 0 {
		t.Fatalf("the chunk %v stays in hand after a failure before any claim; want it let go", inHand)
	}
	if c := f.counts(t); c.Pending != 5 || c.Unknown != 0 {
		t.Fatalf("counts %+v; want all 5 pending", c)
	}
}

// A webhooks process that died with refusals in its spool leaves them named in Redis
// (state.RefusalsSpooledKey) after its note ran out: the workers lease again, but send nobody those
// refusals name until the spool is recorded. Before, the note ran out 5 s after the process died, and an
// outside run had 31 of 200 people texted 17–28 s after their RET had been answered 200. An e-mail's
// one-click refusal names its user; it holds only e-mail campaigns, and only that user.
func TestARefusalLeftInADeadProcesssSpoolStillStopsItsSend(t *testing.T) {
	t.Parallel()
	f := plan(t, 8) // eligible: u1, u2, u4, u7, u8
	ctx := context.Background()
	if err := state.NoteSpooled(ctx, f.rdb, []string{state.SpooledAddress("sms", phone(1)), state.SpooledAddress("email", phone(2)), state.SpooledUser("u4")}); err != nil {
		t.Fatal(err)
	}
	// The dead process's note ran out.
	if err := state.NoteRefusalsHeld(ctx, f.rdb, "hooks-dead", time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	f.runAll(t)
	if n := len(f.provider.sentTo(phone(1))); n != 0 {
		t.Fatalf("u1, whose RET waits in a dead process's spool, got %d messages", n)
	}
	if st, reason, code := f.status(t, "u1"); st != campaign.StatusSkipped || code != "" {
		t.Fatalf("u1: %s/%s code %q; want skipped, its code given back", st, reason, code)
	}
	// Another channel's refusal of the same number, and an e-mail's one-click of u4, hold nobody here.
	for _, u := range []int{2, 4, 7, 8} {
		if n := len(f.provider.sentTo(phone(u))); n != 1 {
			t.Errorf("u%d got %d messages, want 1", u, n)
		}
	}
	// Once the spool is recorded, its names are taken back.
	if err := state.ForgetSpooled(ctx, f.rdb, []string{state.SpooledAddress("sms", phone(1)), state.SpooledAddress("email", phone(2)), state.SpooledUser("u4")}); err != nil {
		t.Fatal(err)
	}
	if n, err := f.rdb.Exists(ctx, state.RefusalsSpooledKey).Result(); err != nil || n != 0 {
		t.Fatalf("the spooled names left %d keys (%v); want none", n, err)
	}
}

// A refusal a webhooks process is recording right now (its write waits for the consents' turn behind an
// import's merge, for seconds or minutes) is named in Redis before the write (state.AnnounceRefusals): the
// workers send nobody named from their next chunk, as they do once the RET is in Postgres, and audit the
// skip with the RET it was decided on, not the ONAY the lease read. A name whose end passed (its process
// died mid-write) holds nobody. Before, an outside run posted 40 refusals during an `iys import`: 25 to
// 31 of them were still sent, up to 3.7 s after, and the skips that the spool's names decided were audited
// ONAY.
func TestARefusalBeingRecordedStopsItsSendAndIsAuditedWithTheRET(t *testing.T) {
	t.Parallel()
	f := plan(t, 8) // eligible: u1, u2, u4, u7, u8
	ctx := context.Background()
	if err := state.AnnounceRefusals(ctx, f.rdb, []string{state.SpooledAddress("sms", phone(1)), state.SpooledAddress("sms", phone(4))}, time.Minute); err != nil {
		t.Fatal(err)
	}
	// u2's name runs out (its process died mid-write), and no later announcement drops it.
	if err := state.AnnounceRefusals(ctx, f.rdb, []string{state.SpooledAddress("sms", phone(2))}, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	// u4's refusal was recorded (or held in a spool) meanwhile: its name is taken back.
	if err := state.WithdrawRefusals(ctx, f.rdb, []string{state.SpooledAddress("sms", phone(4))}); err != nil {
		t.Fatal(err)
	}
	f.runAll(t)
	if n := len(f.provider.sentTo(phone(1))); n != 0 {
		t.Fatalf("u1, whose refusal is being recorded, got %d messages", n)
	}
	if st, reason, code := f.status(t, "u1"); st != campaign.StatusSkipped || reason != campaign.ReasonRevoked || code != "" {
		t.Fatalf("u1: %s/%s code %q; want skipped/revoked, its code given back", st, reason, code)
	}
	var cst, src string
	if err := f.db.QueryRow(ctx, `SELECT consent_status, consent_source FROM send_log WHERE campaign_id = $1 AND user_id = 'u1'`, f.id).Scan(&cst, &src); err != nil {
		t.Fatal(err)
	}
	if cst != iys.StatusRejected || src != iys.SourceSMS {
		t.Errorf("u1's skip is audited with consent %s from %s; want the RET it was decided on, RET from %s", cst, src, iys.SourceSMS)
	}
	// A name that ran out, and one taken back, hold nobody.
	for _, u := range []int{2, 4, 7, 8} {
		if n := len(f.provider.sentTo(phone(u))); n != 1 {
			t.Errorf("u%d got %d messages, want 1", u, n)
		}
	}
}
