package worker

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/limiter"
	"github.com/campaignctl/campaignctl/providers"
)

// redis_lost_data says since when Redis lost its data: the moment a process first saw it empty (the
// epoch's renewal), when that came after the launch; nothing otherwise (batches dropped from the
// dead-letter queue, a launch that stopped before it queued them, leave no time in Redis).
func TestRedisLostDataSaysSinceWhen(t *testing.T) {
	t.Parallel()
	f := plan(t, 30)
	ctx := context.Background()
	since := func(step string) *time.Time { return lostData(t, f, step).Since }
	c := f.campaign(t)
	// Its batches were queued, as a launch queues them (an unqueued launch says so instead).
	if _, err := f.db.Exec(ctx, `UPDATE campaign_batches SET enqueued_at = now() WHERE campaign_id = $1`, f.id); err != nil {
		t.Fatal(err)
	}
	// The epoch is older than the launch: the batches went some other way, and nothing says when.
	if err := f.rdb.Set(ctx, state.EpochSinceKey, c.CreatedAt.Add(-time.Hour).UnixMilli(), 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got := since("the epoch older than the launch"); got != nil {
		t.Errorf("epoch older than the launch: since %v, want none", got)
	}
	// Redis emptied after the launch: the first process to look renews the epoch, and that is the time.
	if err := f.rdb.Del(ctx, state.EpochKey, state.EpochServerKey, state.EpochSinceKey).Err(); err != nil {
		t.Fatal(err)
	}
	before := time.Now().Add(-time.Second) // Redis's clock, on this machine
	if _, err := state.Epoch(ctx, f.rdb); err != nil {
		t.Fatal(err)
	}
	if got := since("Redis emptied"); got == nil || got.Before(before) || got.After(time.Now().Add(time.Second)) {
		t.Errorf("Redis emptied: since %v, want the epoch's renewal, within a second of %v", got, before.Add(time.Second))
	}
	// A resume after that loss (it queued the batches again), stopped before it queued them: the loss
	// came before the resume and is not why they are missing; nothing says when they went.
	time.Sleep(20 * time.Millisecond)
	if _, err := f.db.Exec(ctx, `UPDATE campaigns SET state_since = now() WHERE id = $1`, f.id); err != nil {
		t.Fatal(err)
	}
	if got := since("a resume after the loss"); got != nil {
		t.Errorf("a resume after the loss: since %v (the loss before it), want none", got)
	}
}

// Each reason a campaign does not move is read by Status, in the situation that causes it, and the
// campaign shows none once it moves again.
func TestStatusSaysWhyACampaignWaits(t *testing.T) {
	t.Parallel()
	f := plan(t, 30)
	ctx := context.Background()
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := f.db.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(step, reason string) *Waiting {
		t.Helper()
		s, err := Status(ctx, StatusOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id})
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		if s.Waiting != nil {
			got = s.Waiting.Reason
			if s.Waiting.Detail == "" {
				t.Errorf("%s: reason %s without a detail", step, got)
			}
		}
		if got != reason {
			t.Fatalf("%s: waiting %+v, want %q", step, s.Waiting, reason)
		}
		return s.Waiting
	}
	beat := func(providers map[string]string) {
		t.Helper()
		commercial := map[string]bool{}
		for ch := range providers {
			commercial[ch] = true
		}
		if err := state.PublishWorker(ctx, f.rdb, state.WorkerInfo{Owner: "w1", Providers: providers, Commercial: commercial}); err != nil {
			t.Fatal(err)
		}
	}
	// Redis emptied: no batch queued and no heartbeat either (the workers publish theirs again within
	// seconds); resume is what helps, whatever the workers.
	// The launch never queued its batches (killed, Redis or Postgres away between its commit and the
	// enqueue): said so, not that Redis lost its data.
	if w := expect("no batch ever queued, no heartbeat", WaitRedisLostData); !strings.Contains(w.Detail, "the launch stopped before it queued any of the campaign's") || w.Since != nil {
		t.Fatalf("never queued: detail %q since %v, want it to say the launch stopped before it queued them", w.Detail, w.Since)
	}

	client := asynq.NewClientFromRedisClient(f.rdb)
	defer client.Close()
	// One batch queued and the others not (a launch killed while it queued them): the campaign would stop
	// short of them, whatever the workers; resume is what helps. Before, it said no_worker.
	f.enqueueFirstBatch(t, client)
	if w := expect("one batch queued, the others never", WaitRedisLostData); !strings.Contains(w.Detail, "neither queued nor in the dead-letter queue") {
		t.Fatalf("partly queued: detail %q, want it to say batches are not queued", w.Detail)
	}
	if _, _, err := Enqueue(ctx, client, f.store, f.campaign(t), true); err != nil {
		t.Fatal(err)
	}
	c := f.campaign(t)
	recent := func(step string, w *Waiting, from time.Time) {
		t.Helper()
		if w.Since == nil || w.Since.Before(from.Truncate(time.Millisecond)) || w.Since.After(time.Now().Add(time.Second)) {
			t.Fatalf("%s: since %v, want between %v and now", step, w.Since, from)
		}
	}
	// Never a worker: the wait began with the launch.
	recent("no heartbeat", expect("no heartbeat", WaitNoWorker), c.CreatedAt)
	beat(map[string]string{"email": "sendgrid"})
	recent("a worker for e-mail only", expect("a worker for e-mail only", WaitNoWorkerForChannel), c.CreatedAt)
	time.Sleep(20 * time.Millisecond)
	lastBeat := time.Now()
	beat(map[string]string{"sms": f.provider.Name()})
	expect("queued, nothing in the way", "")
	// The worker is gone (its heartbeat expired): the wait began with its last heartbeat, not the launch.
	if err := state.RemoveWorker(ctx, f.rdb, "w1"); err != nil {
		t.Fatal(err)
	}
	recent("the worker gone", expect("the worker gone", WaitNoWorker), lastBeat)
	beat(map[string]string{"sms": f.provider.Name()})
	expect("a worker back", "")

	exec(`UPDATE campaigns SET start_at = now() + interval '1 hour' WHERE id = $1`, f.id)
	if w := expect("--at ahead", WaitScheduled); w.Until == nil || time.Until(*w.Until) < 50*time.Minute || w.Since == nil || time.Since(*w.Since) > time.Minute {
		t.Fatalf("scheduled since %v until %v, want since the launch, until the start in an hour", w.Since, w.Until)
	}
	// Its batches gone before the start (Redis wiped): it would not start; that is said now, not only once
	// the start has passed (it said scheduled until then).
	inspector := asynq.NewInspectorFromRedisClient(f.rdb)
	if _, err := inspector.DeleteAllPendingTasks(Queue); err != nil {
		t.Fatal(err)
	}
	if w := expect("--at ahead, batches gone", WaitRedisLostData); !strings.Contains(w.Detail, "would not start") {
		t.Fatalf("scheduled with no batch queued: detail %q, want it to say the campaign would not start", w.Detail)
	}
	if _, _, err := Enqueue(ctx, client, f.store, f.campaign(t), false); err != nil { // as resume queues them
		t.Fatal(err)
	}
	expect("--at ahead, queued again", WaitScheduled)
	exec(`UPDATE campaigns SET start_at = NULL WHERE id = $1`, f.id)
	// Queued for the start an hour ahead: due now, as before.
	if _, err := inspector.RunAllScheduledTasks(Queue); err != nil {
		t.Fatal(err)
	}
	inspector.Close()

	closed := time.Now().In(time.UTC).Add(2 * time.Hour)
	exec(`UPDATE campaigns SET send_window = $2, window_zone = 'UTC' WHERE id = $1`, f.id,
		closed.Format("15:04")+"-"+closed.Add(time.Hour).Format("15:04"))
	if w := expect("outside --window", WaitWindowClosed); w.Until == nil || w.Until.Sub(closed) > time.Minute || closed.Sub(*w.Until) > time.Minute ||
		w.Since == nil || w.Since.After(time.Now()) || time.Since(*w.Since) > time.Minute {
		t.Fatalf("window closed since %v until %v, want since the launch (it closed before), until about %v", w.Since, w.Until, closed)
	} else if !strings.Contains(w.Detail, closed.Format("15:04")+" UTC") {
		t.Fatalf("window closed: %q; want the opening as the window's own zone reads it (%s UTC)", w.Detail, closed.Format("15:04"))
	}
	// Closed, and no worker either (`workers --min 0` runs none until a batch is due): the window is what
	// it waits for; a worker would not move it. (It said no_worker, then window_closed once a worker came.)
	if err := state.RemoveWorker(ctx, f.rdb, "w1"); err != nil {
		t.Fatal(err)
	}
	expect("outside --window, no worker", WaitWindowClosed)
	beat(map[string]string{"sms": f.provider.Name()})
	exec(`UPDATE campaigns SET send_window = '' WHERE id = $1`, f.id)

	// The provider refuses the account: the batch notes it, and a batch that gets through clears it.
	f.provider.fail = func(int, providers.Message) error {
		return &providers.Error{Provider: "twilio", Status: 401, Code: 20003, Message: "Authenticate", Class: providers.Permanent}
	}
	if err := f.h.RunBatch(ctx, f.id, 0); err == nil {
		t.Fatal("bad credentials: want the batch kept for retry")
	}
	expect("bad credentials", WaitProviderAuth)
	// Fixed: the wait is over with the first answer, not once the batch has ended (it said provider_auth
	// for as long as the batch ran on).
	var during *Waiting
	var duringErr error
	var sends atomic.Int32
	var seen sync.Mutex
	f.provider.fail = func(int, providers.Message) error {
		if sends.Add(1) == 3 {
			s, err := Status(ctx, StatusOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id})
			seen.Lock()
			during, duringErr = s.Waiting, err
			seen.Unlock()
		}
		return nil
	}
	if err := f.h.RunBatch(ctx, f.id, 0); err != nil {
		t.Fatal(err)
	}
	if n := sends.Load(); n < 3 {
		t.Fatalf("%d sends in the batch after the fix; want 3 at least", n)
	}
	seen.Lock()
	w, werr := during, duringErr
	seen.Unlock()
	if werr != nil || w != nil {
		t.Fatalf("credentials fixed, the batch sending: waiting %+v (%v); want none", w, werr)
	}
	f.provider.fail = nil
	expect("credentials fixed", "")
	// A fleet half through a credentials change: another worker's batch is refused (its note) while this
	// one's sent a moment ago. The campaign moves; it said provider_auth between the good worker's sends.
	refused := Waiting{Reason: WaitProviderAuth, Detail: "twilio refuses the account (401)"}
	if err := state.NoteWaiting(ctx, f.rdb, f.id, refused); err != nil {
		t.Fatal(err)
	}
	expect("one worker refused, another sent a moment ago", "")
	// Nothing settled for longer than a run at a low cap takes between chunks: the refusal holds it.
	f.rdb.HSet(ctx, state.ProgressKey(f.id), state.ProgressMovedAt, time.Now().Add(-movingLately-time.Second).UnixMilli())
	expect("one worker refused, nothing sent since", WaitProviderAuth)
	if err := state.ClearWaiting(ctx, f.rdb, f.id, WaitProviderAuth); err != nil {
		t.Fatal(err)
	}

	bucket := state.ProviderBucket(f.provider.Name())
	wentDown := time.Now().Add(-3 * time.Minute).Truncate(time.Millisecond)
	f.rdb.HSet(ctx, state.PaceKey(bucket), "down", "1", "downat", wentDown.UnixMilli())
	if w := expect("provider down", WaitProviderDown); w.Since == nil || !w.Since.Equal(wentDown) {
		t.Fatalf("provider down since %v, want %v (when the pace went down)", w.Since, wentDown)
	}
	// With a fallback: the first down moves the sends to it, and the campaign waits only when that fails
	// too. Before, status said provider_down while the fallback carried the campaign, and nothing while
	// both failed and the workers had gone over to the fallback.
	fbBucket := state.ProviderBucket("netgsm")
	withFallback := func(failedOver bool) {
		t.Helper()
		if err := state.PublishWorker(ctx, f.rdb, state.WorkerInfo{Owner: "w1", Providers: map[string]string{"sms": f.provider.Name()},
			Commercial: map[string]bool{"sms": true}, Fallbacks: map[string]string{"sms": "netgsm"}, FailedOver: map[string]bool{"sms": failedOver}}); err != nil {
			t.Fatal(err)
		}
	}
	withFallback(false)
	expect("first down, the fallback up", "")
	fbWentDown := wentDown.Add(time.Minute)
	f.rdb.HSet(ctx, state.PaceKey(fbBucket), "down", "1", "downat", fbWentDown.UnixMilli())
	if w := expect("first and fallback down", WaitProviderDown); !strings.Contains(w.Detail, "fallback netgsm") || w.Since == nil || !w.Since.Equal(fbWentDown) {
		t.Fatalf("both down: %+v, want both named, since the later of the two went down (%v)", w, fbWentDown)
	}
	f.rdb.HSet(ctx, state.PaceKey(bucket), "down", "0")
	expect("first up, not failed over, the fallback down", "")
	withFallback(true)
	expect("failed over (the first skipped), the fallback down", WaitProviderDown)
	f.rdb.HSet(ctx, state.PaceKey(fbBucket), "down", "0")
	expect("failed over, the fallback up", "")
	beat(map[string]string{"sms": f.provider.Name()})
	pausedAt := time.Now()
	if err := limiter.New(f.rdb).Pause(ctx, bucket, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	// A longer pause extends it: the wait still began with the first.
	extendedAt := time.Now()
	if err := limiter.New(f.rdb).Pause(ctx, bucket, 8*time.Second); err != nil {
		t.Fatal(err)
	}
	if w := expect("provider paused", WaitProviderPaused); w.Until == nil || w.Since == nil ||
		w.Since.Before(pausedAt.Add(-time.Second)) || !w.Since.Before(extendedAt.Add(-10*time.Millisecond)) {
		t.Fatalf("provider paused since %v until %v, want since about %v", w.Since, w.Until, pausedAt)

	}
	began := expect("provider paused", WaitProviderPaused).Since
	// The pause is over and the next has not begun (a provider refusing every request is paused a second
	// at a time): still paused, since the first; a pause that begins now keeps that start too.
	f.rdb.Del(ctx, state.PauseKey(bucket))
	if w := expect("between two pauses", WaitProviderPaused); w.Since == nil || !w.Since.Equal(*began) || w.Until != nil {
		t.Fatalf("between two pauses: %+v, want paused since %v, no end known", w, began)
	}
	if err := limiter.New(f.rdb).Pause(ctx, bucket, time.Second); err != nil {
		t.Fatal(err)
	}
	if w := expect("the next pause", WaitProviderPaused); w.Since == nil || !w.Since.Equal(*began) || w.Until == nil {
		t.Fatalf("the next pause: %+v, want paused since %v, until its end", w, began)
	}
	f.rdb.Del(ctx, state.PauseKey(bucket), state.PauseRunKey(bucket))
	expect("the pauses over", "")

	insp := asynq.NewInspectorFromRedisClient(f.rdb)
	defer insp.Close()
	if _, err := insp.ArchiveAllPendingTasks(Queue); err != nil {
		t.Fatal(err)
	}
	if w := expect("every batch in the DLQ", WaitDLQ); w.Detail == "" || w.Since != nil {
		// Archived by hand, never failed: nothing says when they stopped.
		t.Fatalf("DLQ wait %+v, want a detail and no since", w)
	}
	// And with no worker running (`workers --min 0` runs none for the DLQ): still the DLQ, which is what
	// holds it; it said no_worker, and a worker started would not move it.
	if err := state.RemoveWorker(ctx, f.rdb, "w1"); err != nil {
		t.Fatal(err)
	}
	expect("every batch in the DLQ, no worker", WaitDLQ)
	beat(map[string]string{"sms": f.provider.Name()})
	// Beside them, a task of a batch that is done (a killed worker's, still active in the queue until
	// Asynq takes it back): it moves nothing, and the campaign still waits for the DLQ. A task of a batch
	// with pending recipients moves it. Before, any task in the queue hid the DLQ for that minute.
	var done, open int
	if err := f.db.QueryRow(ctx, `SELECT min(batch), max(batch) FROM campaign_batches WHERE campaign_id = $1`, f.id).Scan(&done, &open); err != nil || done == open {
		t.Fatalf("batches %d..%d (%v): the step needs two", done, open, err)
	}
	exec(`UPDATE campaign_recipients SET status = 'sent', sent_at = now() WHERE campaign_id = $1 AND batch = $2 AND status = 'pending'`, f.id, done)
	enqueueAs := func(b int) {
		t.Helper()
		task, err := NewBatchTask(f.id, b)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := client.Enqueue(task, asynq.TaskID(followUpID(f.id, b, time.Now()))); err != nil {
			t.Fatal(err)
		}
	}
	enqueueAs(done)
	expect("every batch left in the DLQ, beside a task of a batch that is done", WaitDLQ)
	enqueueAs(open)
	expect("a batch with pending recipients in the queue", "")
	if _, err := insp.DeleteAllPendingTasks(Queue); err != nil {
		t.Fatal(err)
	}
	if _, err := Pause(ctx, PauseOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id}); err != nil {
		t.Fatal(err)
	}
	if w := expect("paused", WaitPaused); w.Since == nil || time.Since(*w.Since) > time.Minute || time.Until(*w.Since) > time.Second {
		t.Fatalf("paused since %v, want the pause's time", w.Since)
	}
	// A campaign scheduled for later and paused waits for its resume, not for its start.
	exec(`UPDATE campaigns SET start_at = now() + interval '1 hour' WHERE id = $1`, f.id)
	expect("scheduled, then paused", WaitPaused)
	exec(`UPDATE campaigns SET start_at = NULL WHERE id = $1`, f.id)

	// Without Redis, the status is Postgres's, and says so.
	s, err := Status(ctx, StatusOptions{Store: f.store, CampaignID: f.id})
	if err != nil || !s.RedisUnavailable || s.Waiting != nil || s.Planned == 0 {
		t.Fatalf("status without Redis: %+v %v", s, err)
	}
	if s.SkippedByReason["revoked"]+s.SkippedByReason["no_consent"] == 0 && s.Skipped > 0 {
		t.Fatalf("skipped %d with reasons %v", s.Skipped, s.SkippedByReason)
	}
}

// While the workers write the recent sends' frequency marks back after Redis lost its data, the batches
// are queued (retrying each second) and nothing is sent: status said nothing held the campaign. Status
// reads it where it lives (the marks' epoch is not the epoch yet) and says redis_lost_data until it is over.
func TestStatusSaysTheMarksAreBeingWrittenBack(t *testing.T) {
	t.Parallel()
	f := queuedWithAWorker(t)
	ctx := context.Background()
	waiting := func() *Waiting { t.Helper(); return f.waiting(t) }
	if w := waiting(); w != nil {
		t.Fatalf("queued with a worker: waiting %+v, want none", w)
	}
	// Redis lost its data: a worker has issued a new epoch, and the marks are not back for it yet
	// (MarksBack answers ErrMarksPending meanwhile).
	if err := f.rdb.MSet(ctx, state.EpochKey, "e2", state.MarksKey, "e1").Err(); err != nil {
		t.Fatal(err)
	}
	// Nothing was sent lately: there is no mark to lose (a first setup's new Redis), and the moment the
	// first worker takes to find none is not reported as a loss.
	if w := waiting(); w != nil {
		t.Fatalf("marks pending with no recent send: waiting %+v, want none", w)
	}
	if _, err := f.db.Exec(ctx, `INSERT INTO send_log (campaign_id, user_id, status) VALUES ($1, 'u1', 'sent')`, f.id); err != nil {
		t.Fatal(err)
	}
	if w := waiting(); w == nil || w.Reason != WaitRedisLostData || !strings.Contains(w.Detail, "frequency marks") {
		t.Fatalf("marks being written back: waiting %+v, want redis_lost_data saying the marks are being written back", w)
	}
	// The marks are back for the epoch.
	if err := f.rdb.Set(ctx, state.MarksKey, "e2", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if w := waiting(); w != nil {
		t.Fatalf("marks back: waiting %+v, want none", w)
	}
}

// A campaign whose every batch left waits out the back-off of a retry (recipients the provider failed
// with errors that can pass, a run that failed) is not moving, and status says so (retry_backoff, until the
// next run, since the last failure). A batch due again within a moment, or another batch pending, is a
// campaign that moves. Before, an outside run watched a webhook campaign's last 7 recipients pending for 65
// s with waiting null.
func TestStatusSaysTheBatchesWaitOutTheirRetry(t *testing.T) {
	t.Parallel()
	f := queuedWithAWorker(t)
	ctx := context.Background()
	waiting := func() *Waiting { t.Helper(); return f.waiting(t) }
	client := asynq.NewClientFromRedisClient(f.rdb)
	defer client.Close()
	if w := waiting(); w != nil {
		t.Fatalf("queued: waiting %+v, want none", w)
	}
	// Each batch's run fails once, through a queue server as the workers' (its back-off is delay).
	failOnce := func(delay time.Duration) {
		t.Helper()
		insp := asynq.NewInspectorFromRedisClient(f.rdb)
		srv := asynq.NewServerFromRedisClient(f.rdb, asynq.Config{Concurrency: 4, Queues: map[string]int{Queue: 1},
			RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return delay }, LogLevel: asynq.FatalLevel})
		if err := srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return errors.New("the provider failed some recipients") })); err != nil {
			t.Fatal(err)
		}
		defer srv.Shutdown()
		deadline := time.Now().Add(15 * time.Second)
		for {
			info, err := insp.GetQueueInfo(Queue)
			if err != nil {
				t.Fatal(err)
			}
			if info.Pending == 0 && info.Active == 0 && info.Retry > 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the batches did not reach the retry set: %+v", info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	before := time.Now()
	failOnce(time.Minute)
	w := waiting()
	if w == nil || w.Reason != WaitRetry || !strings.Contains(w.Detail, "back-off") {
		t.Fatalf("every batch waiting a minute for its retry: waiting %+v, want %s", w, WaitRetry)
	}
	if w.Until == nil || time.Until(*w.Until) < 40*time.Second || time.Until(*w.Until) > 70*time.Second {
		t.Errorf("until %v, want about a minute from now", w.Until)
	}
	if w.Since == nil || w.Since.Before(before.Add(-time.Second)) || w.Since.After(time.Now().Add(time.Second)) {
		t.Errorf("since %v, want the failure, after %v", w.Since, before)
	}
	// Another batch pending: the campaign moves.
	f.enqueueFirstBatch(t, client, func(b int) asynq.Option { return asynq.TaskID(followUpID(f.id, b, time.Now())) })
	if w := waiting(); w != nil {
		t.Fatalf("a batch pending beside the ones to retry: waiting %+v, want none", w)
	}
	// Only batches due again within a moment (handed back between two chunks): it moves.
	insp := asynq.NewInspectorFromRedisClient(f.rdb)
	if _, err := insp.DeleteAllRetryTasks(Queue); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Enqueue(ctx, client, f.store, f.campaign(t), false); err != nil { // as resume queues them
		t.Fatal(err)
	}
	failOnce(time.Second)
	if w := waiting(); w != nil {
		t.Fatalf("batches due again within a second: waiting %+v, want none", w)
	}
}

// waiting is what status says campaign f waits on (nil: it moves, or it is over).
func (f *fixture) waiting(t *testing.T) *Waiting {
	t.Helper()
	s, err := Status(context.Background(), StatusOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id})
	if err != nil {
		t.Fatal(err)
	}
	return s.Waiting
}

// enqueueFirstBatch queues campaign f's first batch again, with the options made for its number.
func (f *fixture) enqueueFirstBatch(t *testing.T, client *asynq.Client, opts ...func(batch int) asynq.Option) {
	t.Helper()
	var first int
	if err := f.db.QueryRow(context.Background(), `SELECT min(batch) FROM campaign_batches WHERE campaign_id = $1`, f.id).Scan(&first); err != nil {
		t.Fatal(err)
	}
	task, err := NewBatchTask(f.id, first)
	if err != nil {
		t.Fatal(err)
	}
	var o []asynq.Option
	for _, opt := range opts {
		o = append(o, opt(first))
	}
	if _, err := client.Enqueue(task, o...); err != nil {
		t.Fatal(err)
	}
}

// lostData reads f's campaign's status, which must wait with redis_lost_data (step names the moment).
func lostData(t *testing.T, f *fixture, step string) *Waiting {
	t.Helper()
	s, err := Status(context.Background(), StatusOptions{Store: f.store, Redis: f.rdb, CampaignID: f.id})
	if err != nil {
		t.Fatal(err)
	}
	if s.Waiting == nil || s.Waiting.Reason != WaitRedisLostData {
		t.Fatalf("%s: waiting %+v, want %s", step, s.Waiting, WaitRedisLostData)
	}
	return s.Waiting
}

// After a Redis loss, a campaign whose consents are older than its --max-consent-age is told to sync
// first: resume refuses such consents, and redis_lost_data said only "Run campaignctl resume N" (an
// outside run: the command it named exited 2).
func TestRedisLostDataNamesTheSyncWhenTheConsentsAreTooOld(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := planAround(t, 10, func(s *campaign.Spec) { s.MaxConsentAge = 24 * time.Hour }, syncedNow(t))
	if _, err := f.db.Exec(ctx, `UPDATE campaign_batches SET enqueued_at = now() WHERE campaign_id = $1`, f.id); err != nil {
		t.Fatal(err)
	}
	detail := func(step string) string { return lostData(t, f, step).Detail }
	if d := detail("consents young enough"); !strings.Contains(d, "campaignctl resume") || strings.Contains(d, "iys sync") {
		t.Fatalf("consents young enough: detail %q; want resume, no sync", d)
	}
	if _, err := f.db.Exec(ctx, `UPDATE iys_sync_state SET last_success_at = now() - interval '3 days'`); err != nil {
		t.Fatal(err)
	}
	if d := detail("consents 3 days old"); !strings.Contains(d, "campaignctl resume") || !strings.Contains(d, "First run campaignctl iys sync") {
		t.Fatalf("consents 3 days old (--max-consent-age 24h): detail %q; want the sync named before the resume", d)
	}
}
