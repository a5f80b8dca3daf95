package supervisor

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestDecide(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	pol := Policy{Min: 1, Max: 5, Concurrency: 4, Cooldown: 30 * time.Second}
	wide := Policy{Min: 1, Max: 20, Concurrency: 4, Cooldown: 30 * time.Second}

	for _, tc := range []struct {
		name   string
		pol    Policy
		st     State
		o      Observation
		want   Decision
		wantSt State
	}{
		{
			name: "backlog: up at once, however far",
			pol:  pol, st: State{Workers: 1, LastChange: t0},
			o:      Observation{At: at(time.Second), Pending: 14, Active: 4, Latency: 12 * time.Second},
			want:   Decision{From: 1, To: 5, Backlog: 18, Need: 5, Reason: ReasonBacklog},
			wantSt: State{Workers: 5, LastChange: at(time.Second)},
		},
		{
			name: "backlog beyond --max: clamped",
			pol:  pol, st: State{Workers: 2, LastChange: t0},
			o:      Observation{At: at(time.Second), Pending: 400, Active: 8},
			want:   Decision{From: 2, To: 5, Backlog: 408, Need: 102, Reason: ReasonBacklog},
			wantSt: State{Workers: 5, LastChange: at(time.Second)},
		},
		{
			name: "at --max with more backlog: hold",
			pol:  pol, st: State{Workers: 5, LastChange: t0},
			o:      Observation{At: at(time.Minute), Pending: 400, Active: 20},
			want:   Decision{From: 5, To: 5, Backlog: 420, Need: 105, Reason: ReasonMax},
			wantSt: State{Workers: 5, LastChange: t0},
		},
		{
			name: "tasks due soon count",
			pol:  pol, st: State{Workers: 1, LastChange: t0},
			o:      Observation{At: at(time.Second), Active: 4, Due: 4},
			want:   Decision{From: 1, To: 2, Backlog: 8, Need: 2, Reason: ReasonBacklog},
			wantSt: State{Workers: 2, LastChange: at(time.Second)},
		},
		{
			name: "free slots absorb the pending: hold",
			pol:  pol, st: State{Workers: 2, LastChange: t0},
			o:      Observation{At: at(time.Minute), Pending: 3, Active: 5},
			want:   Decision{From: 2, To: 2, Backlog: 8, Need: 2, Reason: ReasonSteady},
			wantSt: State{Workers: 2, LastChange: t0},
		},
		{
			name: "below --min at start",
			pol:  Policy{Min: 2, Max: 5, Concurrency: 4, Cooldown: time.Minute}, st: State{Workers: 0, LastChange: t0},
			o:      Observation{At: t0},
			want:   Decision{From: 0, To: 2, Reason: ReasonMin},
			wantSt: State{Workers: 2, LastChange: t0},
		},
		{
			name: "idle at --min: hold",
			pol:  pol, st: State{Workers: 1, LastChange: t0},
			o:      Observation{At: at(time.Hour)},
			want:   Decision{From: 1, To: 1, Reason: ReasonMin},
			wantSt: State{Workers: 1, LastChange: t0},
		},
		{
			name: "idle inside the cooldown: hold, the cooldown starts",
			pol:  pol, st: State{Workers: 3, LastChange: t0},
			o:      Observation{At: at(10 * time.Second)},
			want:   Decision{From: 3, To: 3, Reason: ReasonCooldown},
			wantSt: State{Workers: 3, LastChange: t0, LowSince: at(10 * time.Second)},
		},
		{
			name: "idle for the whole cooldown: one worker less",
			pol:  pol, st: State{Workers: 5, LastChange: t0, LowSince: at(5 * time.Second)},
			o:      Observation{At: at(35 * time.Second)},
			want:   Decision{From: 5, To: 4, Reason: ReasonIdle},
			wantSt: State{Workers: 4, LastChange: at(35 * time.Second), LowSince: at(5 * time.Second)},
		},
		{
			name: "the next one waits for a cooldown after the last change",
			pol:  pol, st: State{Workers: 4, LastChange: at(35 * time.Second), LowSince: at(5 * time.Second)},
			o:      Observation{At: at(50 * time.Second)},
			want:   Decision{From: 4, To: 4, Reason: ReasonCooldown},
			wantSt: State{Workers: 4, LastChange: at(35 * time.Second), LowSince: at(5 * time.Second)},
		},
		{
			name: "backlog shrank for the cooldown: one less, not down to the need",
			pol:  pol, st: State{Workers: 4, LastChange: t0, LowSince: at(time.Second)},
			o:      Observation{At: at(time.Minute), Pending: 1, Active: 4},
			want:   Decision{From: 4, To: 3, Backlog: 5, Need: 2, Reason: ReasonShrank},
			wantSt: State{Workers: 3, LastChange: at(time.Minute), LowSince: at(time.Second)},
		},
		{
			name: "backlog back during the cooldown: the cooldown is reset",
			pol:  pol, st: State{Workers: 3, LastChange: t0, LowSince: at(20 * time.Second)},
			o:      Observation{At: at(40 * time.Second), Active: 12},
			want:   Decision{From: 3, To: 3, Backlog: 12, Need: 3, Reason: ReasonSteady},
			wantSt: State{Workers: 3, LastChange: t0},
		},
		{
			name: "scale up clears a running cooldown",
			pol:  pol, st: State{Workers: 2, LastChange: t0, LowSince: at(20 * time.Second)},
			o:      Observation{At: at(40 * time.Second), Pending: 4, Active: 8},
			want:   Decision{From: 2, To: 3, Backlog: 12, Need: 3, Reason: ReasonBacklog},
			wantSt: State{Workers: 3, LastChange: at(40 * time.Second)},
		},
		{
			name: "tasks wait although the counts say fewer: no scale down, the cooldown starts again",
			pol:  pol, st: State{Workers: 4, LastChange: t0, LowSince: at(time.Second)},
			o:      Observation{At: at(time.Minute), Pending: 2, Active: 1, Latency: 6 * time.Second},
			want:   Decision{From: 4, To: 4, Backlog: 3, Need: 1, Reason: ReasonWaiting},
			wantSt: State{Workers: 4, LastChange: t0},
		},
		{
			name: "queue paused: pending does not count",
			pol:  pol, st: State{Workers: 3, LastChange: t0, LowSince: at(time.Second)},
			o:      Observation{At: at(time.Minute), Pending: 40, Active: 4, Paused: true},
			want:   Decision{From: 3, To: 2, Backlog: 4, Need: 1, Reason: ReasonPaused},
			wantSt: State{Workers: 2, LastChange: at(time.Minute), LowSince: at(time.Second)},
		},
		{
			// A paused queue's pending tasks wait by definition: their latency is not workers that have
			// slots and take nothing (tasks_waiting), which would hold the pool for as long as the pause.
			name: "queue paused for longer than the wait limit: pending does not count",
			pol:  pol, st: State{Workers: 3, LastChange: t0, LowSince: at(time.Second)},
			o:      Observation{At: at(time.Minute), Pending: 40, Active: 4, Latency: time.Minute, Paused: true},
			want:   Decision{From: 3, To: 2, Backlog: 4, Need: 1, Reason: ReasonPaused},
			wantSt: State{Workers: 2, LastChange: at(time.Minute), LowSince: at(time.Second)},
		},
		{
			name: "rate caps saturated: no more workers",
			pol:  pol, st: State{Workers: 2, LastChange: t0},
			o: Observation{At: at(time.Minute), Pending: 20, Active: 8, RateCap: 100, SendRate: 95,
				RateSince: at(55 * time.Second)},
			want:   Decision{From: 2, To: 2, Backlog: 28, Need: 7, RateLimit: 2, Reason: ReasonRateCap},
			wantSt: State{Workers: 2, LastChange: t0, PerWorker: 47.5},
		},
		{
			name: "per-worker rate measured with every slot busy: up to what saturates the caps",
			pol:  wide, st: State{Workers: 2, LastChange: t0},
			o: Observation{At: at(10 * time.Second), Pending: 40, Active: 8, RateCap: 100, SendRate: 20,
				RateSince: at(5 * time.Second)},
			want:   Decision{From: 2, To: 10, Backlog: 48, Need: 12, RateLimit: 10, Reason: ReasonBacklog},
			wantSt: State{Workers: 10, LastChange: at(10 * time.Second), PerWorker: 10},
		},
		{
			name: "per-worker rate not measured while slots were free",
			pol:  wide, st: State{Workers: 2, LastChange: t0},
			o: Observation{At: at(10 * time.Second), Pending: 40, Active: 5, RateCap: 100, SendRate: 20,
				RateSince: at(5 * time.Second)},
			want:   Decision{From: 2, To: 12, Backlog: 45, Need: 12, Reason: ReasonBacklog},
			wantSt: State{Workers: 12, LastChange: at(10 * time.Second)},
		},
		{
			name: "per-worker rate not measured across a change of the pool",
			pol:  wide, st: State{Workers: 2, LastChange: at(7 * time.Second)},
			o: Observation{At: at(10 * time.Second), Pending: 40, Active: 8, RateCap: 100, SendRate: 20,
				RateSince: at(5 * time.Second)},
			want:   Decision{From: 2, To: 12, Backlog: 48, Need: 12, Reason: ReasonBacklog},
			wantSt: State{Workers: 12, LastChange: at(10 * time.Second)},
		},
		{
			name: "the per-worker rate seen earlier bounds a scale up",
			pol:  wide, st: State{Workers: 2, LastChange: t0, PerWorker: 10},
			o:      Observation{At: at(time.Minute), Pending: 100, Active: 6, RateCap: 35, SendRate: 12},
			want:   Decision{From: 2, To: 4, Backlog: 106, Need: 27, RateLimit: 4, Reason: ReasonBacklog},
			wantSt: State{Workers: 4, LastChange: at(time.Minute), PerWorker: 10},
		},
		{
			name: "a campaign without any cap: the rate limits nothing",
			pol:  pol, st: State{Workers: 2, LastChange: t0, PerWorker: 10},
			o:      Observation{At: at(time.Minute), Pending: 100, Active: 8, Uncapped: true, SendRate: 500},
			want:   Decision{From: 2, To: 5, Backlog: 108, Need: 27, Reason: ReasonBacklog},
			wantSt: State{Workers: 5, LastChange: at(time.Minute), PerWorker: 10},
		},
		{
			name: "the caps fell (a campaign ended): down to what saturates them, after the cooldown",
			pol:  wide, st: State{Workers: 5, LastChange: t0, LowSince: at(time.Second), PerWorker: 10},
			o:      Observation{At: at(time.Minute), Pending: 30, Active: 10, RateCap: 20, SendRate: 15},
			want:   Decision{From: 5, To: 4, Backlog: 40, Need: 10, RateLimit: 2, Reason: ReasonRateCap},
			wantSt: State{Workers: 4, LastChange: at(time.Minute), LowSince: at(time.Second), PerWorker: 10},
		},
		{
			name: "two supervisors on the queue: each takes half of what the backlog needs, rounded up",
			pol:  wide, st: State{Workers: 1, LastChange: t0},
			o:      Observation{At: at(time.Second), Pending: 36, Active: 4, Supervisors: 2},
			want:   Decision{From: 1, To: 5, Backlog: 40, Need: 5, Supervisors: 2, Reason: ReasonBacklog},
			wantSt: State{Workers: 5, LastChange: at(time.Second)},
		},
		{
			name: "three supervisors: a third, rounded up",
			pol:  wide, st: State{Workers: 1, LastChange: t0},
			o:      Observation{At: at(time.Second), Pending: 36, Active: 4, Supervisors: 3},
			want:   Decision{From: 1, To: 4, Backlog: 40, Need: 4, Supervisors: 3, Reason: ReasonBacklog},
			wantSt: State{Workers: 4, LastChange: at(time.Second)},
		},
		{
			name: "the other supervisor gone: this one takes the whole backlog again",
			pol:  wide, st: State{Workers: 5, LastChange: t0},
			o:      Observation{At: at(time.Minute), Pending: 32, Active: 8, Supervisors: 1},
			want:   Decision{From: 5, To: 10, Backlog: 40, Need: 10, Reason: ReasonBacklog},
			wantSt: State{Workers: 10, LastChange: at(time.Minute)},
		},
		{
			name: "two supervisors: the send rate is both pools', the caps' workers are shared",
			pol:  wide, st: State{Workers: 2, LastChange: t0},
			o: Observation{At: at(10 * time.Second), Pending: 40, Active: 16, RateCap: 100, SendRate: 40,
				RateSince: at(5 * time.Second), Supervisors: 2},
			// 40 msg/s from 2 × 2 workers: 10 a worker; the caps take 10 workers, 5 of them this pool's.
			want:   Decision{From: 2, To: 5, Backlog: 56, Need: 7, RateLimit: 5, Supervisors: 2, Reason: ReasonBacklog},
			wantSt: State{Workers: 5, LastChange: at(10 * time.Second), PerWorker: 10},
		},
		{
			name: "two supervisors, slots of the other pool free: the per-worker rate is not measured",
			pol:  wide, st: State{Workers: 2, LastChange: t0},
			o: Observation{At: at(10 * time.Second), Pending: 40, Active: 8, RateCap: 100, SendRate: 20,
				RateSince: at(5 * time.Second), Supervisors: 2},
			want:   Decision{From: 2, To: 6, Backlog: 48, Need: 6, Supervisors: 2, Reason: ReasonBacklog},
			wantSt: State{Workers: 6, LastChange: at(10 * time.Second)},
		},
		{
			name: "--min 0: an idle pool goes to zero",
			pol:  Policy{Min: 0, Max: 3, Concurrency: 1}, st: State{Workers: 1, LastChange: t0},
			o:      Observation{At: at(time.Second)},
			want:   Decision{From: 1, To: 0, Reason: ReasonIdle},
			wantSt: State{Workers: 0, LastChange: at(time.Second), LowSince: at(time.Second)},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, gotSt := tc.pol.Decide(tc.st, tc.o)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("decision (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantSt, gotSt); diff != "" {
				t.Errorf("state (-want +got):\n%s", diff)
			}
		})
	}
}

// A run of decisions: up at once under a backlog, then down one worker per cooldown once it is gone.
func TestDecideOverTime(t *testing.T) {
	t.Parallel()
	pol := Policy{Min: 1, Max: 4, Concurrency: 2, Cooldown: 10 * time.Second}
	t0 := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	st := State{Workers: 1, LastChange: t0}
	var got []int
	for i := 0; i <= 60; i += 5 {
		o := Observation{At: t0.Add(time.Duration(i) * time.Second)}
		if i < 15 {
			o.Pending, o.Active = 20, 2*st.Workers
		}
		var d Decision
		d, st = pol.Decide(st, o)
		got = append(got, d.To)
	}
	// 0-10 s backlog; idle from 15 s: the cooldown runs to 25 s, then one less every 10 s.
	want := []int{4, 4, 4, 4, 4, 3, 3, 2, 2, 1, 1, 1, 1}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("workers every 5 s (-want +got):\n%s", diff)
	}
}

func TestRateCap(t *testing.T) {
	t.Parallel()
	caps := map[string]float64{"sms": 100, "email": 1000, "webhook": 0}
	for _, tc := range []struct {
		name         string
		running      []Running
		wantCap      float64
		wantUncapped bool
	}{
		{"nothing running", nil, 0, false},
		{"one campaign, provider cap only", []Running{{"sms", 0, 0}}, 100, false},
		{"own caps below the provider's", []Running{{"sms", 30, 0}, {"sms", 50, 0}}, 80, false},
		{"own caps above the provider's together", []Running{{"sms", 80, 0}, {"sms", 50, 0}}, 100, false},
		{"one campaign without its own cap takes the provider's", []Running{{"sms", 20, 0}, {"sms", 0, 0}}, 100, false},
		{"two providers add up", []Running{{"sms", 0, 0}, {"email", 200, 0}}, 300, false},
		{"uncapped provider, capped campaign", []Running{{"webhook", 10, 0}}, 10, false},
		{"uncapped provider, uncapped campaign", []Running{{"sms", 0, 0}, {"webhook", 0, 0}}, 0, true},
		// The provider's cap counts SMS segments: two-segment messages go at half of it.
		{"a cap in segments, two a message", []Running{{"sms", 0, 2}}, 50, false},
		{"a cap in segments, own caps below it in messages", []Running{{"sms", 40, 2}}, 40, false},
		{"a cap in segments, the campaigns' mean", []Running{{"sms", 0, 1}, {"sms", 0, 3}}, 50, false},
		{"a cap in segments, not yet known", []Running{{"sms", 0, 0}, {"email", 0, 0.5}}, 1100, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, u := RateCap(tc.running, caps)
			if c != tc.wantCap || u != tc.wantUncapped {
				t.Errorf("RateCap = %g, %v; want %g, %v", c, u, tc.wantCap, tc.wantUncapped)
			}
		})
	}
}

func TestSendRate(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	prev := Observation{At: t0, Sends: map[int64]int64{1: 100, 2: 50, 3: 900}}
	cur := Observation{At: t0.Add(5 * time.Second), Sends: map[int64]int64{
		1: 150, // +50
		2: 60,  // +10
		3: 10,  // counters rebuilt lower: nothing
		4: 500, // new: nothing
	}}
	if got := SendRate(prev, cur); got != 12 {
		t.Errorf("SendRate = %g, want 12 (60 calls in 5 s)", got)
	}
	if got := SendRate(Observation{At: t0}, cur); got != 0 {
		t.Errorf("SendRate without earlier counts = %g, want 0", got)
	}
	if got := SendRate(cur, cur); got != 0 {
		t.Errorf("SendRate over no time = %g, want 0", got)
	}
}
