package state

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testredis"
)

// newClaims is a Store on a Redis DB of the test's own whose epoch is "e1", with claims that last ttl.
func newClaims(t *testing.T, ttl time.Duration) (*redis.Client, *Store) {
	t.Helper()
	rdb, _ := testredis.New(t)
	if err := rdb.Set(context.Background(), EpochKey, "e1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	return rdb, New(rdb, ttl)
}

// The claim scripts write a claim in the same call that finds one (SET NX GET, SET GET). These are the
// cases where what that call found must undo or redirect it: a Guard that refuses after a free claim was
// taken, a leftover of an earlier campaign with the same ID, an answer written over a claim that vanished
// or that another value took over, and a request's mark hash whose TTL is looked at once.
func TestClaimScriptsUndoWhatTheGuardsRefuse(t *testing.T) {
	t.Parallel()
	const ttl = time.Hour
	rdb, cl := newClaims(t, ttl)
	ctx := context.Background()
	c := &campaign.Campaign{ID: 41, Channel: campaign.ChannelSMS, CreatedAt: time.Now(), FrequencyCap: time.Hour}
	nonce := Nonce(c)
	ok := Guard{Epoch: "e1", Halt: HaltKey(c.ID), CheckHalt: true}
	now := time.Now()
	mine := InFlightValue(now, "w1")
	get := func(key string) (string, time.Duration) {
		t.Helper()
		v, err := rdb.Get(ctx, key).Result()
		if err != nil {
			return "", 0
		}
		return v, rdb.PTTL(ctx, key).Val()
	}
	claim := func(user string, g Guard, prev *Answer) (Claimed, error) {
		return cl.ClaimSend(ctx, c, nonce, SendClaim{Key: ClaimKey(c.ID, user), Value: mine, Addr: "+9055500000" + user}, g, prev, "", now)
	}

	// A free claim under another epoch, or while the campaign is halted: refused, and nothing stays written.
	if _, err := claim("1", Guard{Epoch: "e0", Halt: ok.Halt, CheckHalt: true}, nil); !errors.Is(err, ErrEpoch) {
		t.Fatalf("claim under another epoch: %v, want ErrEpoch", err)
	}
	if v, _ := get(ClaimKey(c.ID, "1")); v != "" {
		t.Fatalf("a refused claim left %q", v)
	}
	rdb.Set(ctx, HaltKey(c.ID), "paused", 0)
	if _, err := claim("1", ok, nil); !errors.Is(err, ErrHalted) {
		t.Fatalf("claim while halted: %v, want ErrHalted", err)
	}
	if v, _ := get(ClaimKey(c.ID, "1")); v != "" {
		t.Fatalf("a claim refused by the halt left %q", v)
	}
	rdb.Del(ctx, HaltKey(c.ID))

	// A leftover of an earlier campaign 41 stays while the Guard refuses, and is replaced once it allows.
	leftover := "oldnonce/" + SentValue("SMold", 1)
	rdb.Set(ctx, ClaimKey(c.ID, "2"), leftover, 0)
	if _, err := claim("2", Guard{Epoch: "e0", Halt: ok.Halt}, nil); !errors.Is(err, ErrEpoch) {
		t.Fatalf("claim over a leftover under another epoch: %v, want ErrEpoch", err)
	}
	if v, _ := get(ClaimKey(c.ID, "2")); v != leftover {
		t.Fatalf("the leftover became %q while the Guard refused", v)
	}
	if got, err := claim("2", ok, nil); err != nil || got.Result != Ours {
		t.Fatalf("claim over a leftover: %+v, %v; want ours", got, err)
	}
	if v, left := get(ClaimKey(c.ID, "2")); v != nonce+"/"+mine || left <= 0 || left > ttl {
		t.Fatalf("claim over a leftover is %q with TTL %v, want ours with the claim TTL", v, left)
	}

	// A free claim is ours with its TTL; the same value again is still ours (a retried script); another
	// run's claim is reported, not overwritten.
	if got, err := claim("3", ok, nil); err != nil || got.Result != Ours {
		t.Fatalf("free claim: %+v, %v", got, err)
	}
	if got, err := claim("3", ok, nil); err != nil || got.Result != Ours {
		t.Fatalf("own claim again: %+v, %v; want ours", got, err)
	}
	other := nonce + "/" + InFlightValue(now, "w2")
	rdb.Set(ctx, ClaimKey(c.ID, "4"), other, 0)
	if got, err := claim("4", ok, nil); err != nil || got.Result != Taken || got.Old != InFlightValue(now, "w2") {
		t.Fatalf("claim held by another run: %+v, %v; want it reported", got, err)
	}
	if v, _ := get(ClaimKey(c.ID, "4")); v != other {
		t.Fatalf("another run's claim became %q", v)
	}

	// The previous send's answer rides on the next claim: written over our pending value (TTL kept), written
	// with the full TTL when the claim vanished, and never over a value someone else wrote.
	sent := SentValue("SMnew", 1)
	rdb.Set(ctx, ClaimKey(c.ID, "5"), nonce+"/"+mine, 10*time.Minute)
	if _, err := claim("6", ok, &Answer{Key: ClaimKey(c.ID, "5"), InFlight: mine, Value: sent}); err != nil {
		t.Fatal(err)
	}
	if v, left := get(ClaimKey(c.ID, "5")); v != nonce+"/"+sent || left > 10*time.Minute || left <= 0 {
		t.Fatalf("previous answer over our claim: %q with TTL %v; want the answer with the claim's TTL", v, left)
	}
	if _, err := claim("7", ok, &Answer{Key: ClaimKey(c.ID, "vanished"), InFlight: mine, Value: sent}); err != nil {
		t.Fatal(err)
	}
	if v, left := get(ClaimKey(c.ID, "vanished")); v != nonce+"/"+sent || left <= 10*time.Minute || left > ttl {
		t.Fatalf("previous answer over a vanished claim: %q with TTL %v; want the answer with the full TTL", v, left)
	}
	rdb.Set(ctx, ClaimKey(c.ID, "8"), other, 0)
	if _, err := claim("9", ok, &Answer{Key: ClaimKey(c.ID, "8"), InFlight: mine, Value: sent}); err != nil {
		t.Fatal(err)
	}
	if v, left := get(ClaimKey(c.ID, "8")); v != other || left != -1 {
		t.Fatalf("previous answer over another run's claim: it became %q (TTL %v)", v, left)
	}

	// settleMany: the same three cases in one call, and the taken-over one is reported.
	keys := []string{ClaimKey(c.ID, "s1"), ClaimKey(c.ID, "s2"), ClaimKey(c.ID, "s3")}
	rdb.Set(ctx, keys[0], nonce+"/"+mine, 10*time.Minute)
	rdb.Set(ctx, keys[2], other, 0)
	err := cl.SettleMany(ctx, keys, nonce, []string{mine, mine, mine}, []string{sent, sent, sent})
	if err == nil {
		t.Fatal("settleMany over a taken-over claim reported nothing")
	}
	if v, left := get(keys[0]); v != nonce+"/"+sent || left > 10*time.Minute || left <= 0 {
		t.Fatalf("settled claim: %q with TTL %v", v, left)
	}
	if v, left := get(keys[1]); v != nonce+"/"+sent || left <= 10*time.Minute || left > ttl {
		t.Fatalf("settled vanished claim: %q with TTL %v; want the full TTL", v, left)
	}
	if v, left := get(keys[2]); v != other || left != -1 {
		t.Fatalf("taken-over claim became %q (TTL %v)", v, left)
	}

	// settleMany: each claim gets its own answer over its own pending value, where they differ.
	keys = []string{ClaimKey(c.ID, "d1"), ClaimKey(c.ID, "d2"), ClaimKey(c.ID, "d3"), ClaimKey(c.ID, "d4")}
	ins := []string{mine, mine, "c|2|other-run", "c|2|other-run"}
	answers := []string{sent, SentValue("SM00000000000000000000000000000002", 1), SentValue("SM00000000000000000000000000000002", 1), sent}
	for i, k := range keys {
		rdb.Set(ctx, k, nonce+"/"+ins[i], 10*time.Minute)
	}
	if err := cl.SettleMany(ctx, keys, nonce, ins, answers); err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		if v, _ := get(k); v != nonce+"/"+answers[i] {
			t.Fatalf("claim %d settled as %q, want %q", i, v, nonce+"/"+answers[i])
		}
	}

	// claimSendMany: every recipient's mark lands in the day's hash, which gets its TTL.
	e := &campaign.Campaign{ID: 42, Channel: campaign.ChannelEmail, CreatedAt: time.Now(), FrequencyCap: time.Hour}
	var scs []SendClaim
	for _, a := range []string{"a@example.com", "b@example.com", "c@example.com", "d@example.com"} {
		scs = append(scs, SendClaim{Key: ClaimKey(e.ID, a), Value: mine, Addr: a})
	}
	got, _, err := cl.ClaimWindow(ctx, e, Nonce(e), scs, Guard{Epoch: "e1", Halt: HaltKey(e.ID)}, nil, "", now)
	if err != nil {
		t.Fatal(err)
	}
	for i, g := range got {
		if g.Result != Ours {
			t.Fatalf("recipient %d: %+v, want ours", i, g)
		}
		key := FrequencyKey(e.Channel, scs[i].Addr, now)
		if rdb.HExists(ctx, key, scs[i].Addr).Val() == false {
			t.Fatalf("no mark for %s in %s", scs[i].Addr, key)
		}
		if left := rdb.PTTL(ctx, key).Val(); left < markTTL(e)-time.Minute {
			t.Fatalf("mark hash %s has TTL %v, want about %v", key, left, markTTL(e))
		}
	}
}

// A day's mark hash keeps a day of margin over the longest cap that judges it. Its TTL is renewed once an
// hour of that margin is used, not at every mark: a hash with more left is not written, one with less is
// renewed, by the single send's script and by the request's alike.
func TestMarkHashTTLRenewedOnceAnHourOfMarginIsUsed(t *testing.T) {
	t.Parallel()
	rdb, cl := newClaims(t, time.Hour)
	ctx := context.Background()
	now := time.Now()
	for _, ch := range []campaign.Channel{campaign.ChannelSMS, campaign.ChannelEmail} {
		c := &campaign.Campaign{ID: 43, Channel: ch, CreatedAt: now}
		full := markTTL(c)
		for _, tc := range []struct {
			addr string
			left time.Duration // the hash's TTL before the mark
			want time.Duration // at least this much after it
			most time.Duration // and at most this much
		}{
			{"fresh-" + string(ch), 0, full - time.Minute, full},
			{"half-hour-used-" + string(ch), full - 30*time.Minute, full - 31*time.Minute, full - 29*time.Minute},
			{"two-hours-used-" + string(ch), full - 2*time.Hour, full - time.Minute, full},
		} {
			key := FrequencyKey(ch, tc.addr, now)
			rdb.Del(ctx, key)
			if tc.left > 0 {
				rdb.HSet(ctx, key, "someone-else", "1|1")
				rdb.PExpire(ctx, key, tc.left)
			}
			sc := SendClaim{Key: ClaimKey(c.ID, tc.addr), Value: InFlightValue(now, "w"), Addr: tc.addr}
			g := Guard{Epoch: "e1", Halt: HaltKey(c.ID)}
			var err error
			if ch == campaign.ChannelEmail {
				_, _, err = cl.ClaimWindow(ctx, c, Nonce(c), []SendClaim{sc}, g, nil, "", now)
			} else {
				_, err = cl.ClaimSend(ctx, c, Nonce(c), sc, g, nil, "", now)
			}
			if err != nil {
				t.Fatal(err)
			}
			if left := rdb.PTTL(ctx, key).Val(); left < tc.want || left > tc.most {
				t.Errorf("%s: mark hash TTL %v after the mark (was %v), want %v to %v", tc.addr, left, tc.left, tc.want, tc.most)
			}
		}
	}
}

// A window's claims and the answers of the window before are usually one value each, sent once to the
// script; a call whose claims or answers carry values of their own sends each, and every claim and answer
// lands with its own value, an answer over another value still giving way to it.
func TestClaimWindowWithValuesOfTheirOwn(t *testing.T) {
	t.Parallel()
	rdb, cl := newClaims(t, time.Hour)
	ctx := context.Background()
	c := &campaign.Campaign{ID: 44, Channel: campaign.ChannelSMS, CreatedAt: time.Now(), FrequencyCap: time.Hour}
	nonce := Nonce(c)
	g := Guard{Epoch: "e1", Halt: HaltKey(c.ID), CheckHalt: true}
	now := time.Now()
	for _, tc := range []struct {
		name               string
		inflight, claiming [3]string
	}{
		{"shared", [3]string{"c:1:w1", "c:1:w1", "c:1:w1"}, [3]string{"c:2:w1", "c:2:w1", "c:2:w1"}},
		{"their own", [3]string{"c:1:w1", "c:1:w2", "c:1:w3"}, [3]string{"c:2:w1", "c:2:w2", "c:2:w3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			user := func(i int) string { return tc.name + "-" + string(rune('a'+i)) }
			var prev []Answer
			for i := range 3 {
				key := ClaimKey(c.ID, "prev-"+user(i))
				rdb.Set(ctx, key, nonce+"/"+tc.inflight[i], time.Hour)
				prev = append(prev, Answer{Key: key, InFlight: tc.inflight[i], Value: SentValue("SM"+user(i), 1)})
			}
			// The third answer's claim was taken over meanwhile: the answer gives way.
			rdb.Set(ctx, prev[2].Key, nonce+"/c:9:elsewhere", time.Hour)
			var scs []SendClaim
			for i := range 3 {
				scs = append(scs, SendClaim{Key: ClaimKey(c.ID, user(i)), Value: tc.claiming[i], Addr: "+90555" + user(i)})
			}
			got, pause, err := cl.ClaimWindow(ctx, c, nonce, scs, g, prev, "", now)
			if err != nil || pause != 0 {
				t.Fatalf("claim window: %v (pause %v)", err, pause)
			}
			for i, cl := range got {
				if cl.Result != Ours {
					t.Errorf("claim %d: %+v, want ours", i, cl)
				}
				if v := rdb.Get(ctx, scs[i].Key).Val(); v != nonce+"/"+tc.claiming[i] {
					t.Errorf("claim %d holds %q, want %q", i, v, nonce+"/"+tc.claiming[i])
				}
				if !rdb.HExists(ctx, FrequencyKey(c.Channel, scs[i].Addr, now), scs[i].Addr).Val() {
					t.Errorf("claim %d: no frequency mark", i)
				}
			}
			for i, a := range prev {
				want := nonce + "/" + a.Value
				if i == 2 {
					want = nonce + "/c:9:elsewhere"
				}
				if v := rdb.Get(ctx, a.Key).Val(); v != want {
					t.Errorf("answer %d: the claim holds %q, want %q", i, v, want)
				}
			}
		})
	}
}

// The frequency marks a claim finds decide it the same way whichever script takes it (a single send's,
// or a window's or a request's), and leave the same marks behind: no mark, another campaign's mark within
// the cap or older, the campaign's own mark (a batch run again), today and the day before, alone or
// together. A window is claimed with its recipients in one call, one address per case.
func TestMarksDecideClaimsAlikeInEveryScript(t *testing.T) {
	t.Parallel()
	rdb, cl := newClaims(t, time.Hour)
	ctx := context.Background()
	// Noon UTC: today's hash and yesterday's are both read with a cap of a day, only today's with an hour.
	now := time.Now().UTC().Truncate(24 * time.Hour).Add(12 * time.Hour)
	ms := func(d time.Duration) string { return strconv.FormatInt(now.Add(-d).UnixMilli(), 10) }
	type marks struct{ today, yesterday string }
	for _, capDur := range []time.Duration{24 * time.Hour, time.Hour} {
		c := &campaign.Campaign{ID: 45, Channel: campaign.ChannelSMS, CreatedAt: now, FrequencyCap: capDur}
		own := markOwner(c, Nonce(c)) + "|" + ms(10*time.Minute)
		recent := "77:other|" + ms(30*time.Minute)
		old := "77:other|" + ms(capDur+time.Hour)
		cases := []struct {
			name string
			m    marks
		}{
			{"no mark", marks{}},
			{"another's recent mark today", marks{today: recent}},
			{"another's recent mark yesterday", marks{yesterday: recent}},
			{"own mark today", marks{today: own}},
			{"own mark yesterday", marks{yesterday: own}},
			{"another's old mark today", marks{today: old}},
			{"another's old mark yesterday", marks{yesterday: old}},
			{"recent marks both days", marks{today: recent, yesterday: "78:other|" + ms(20*time.Minute)}},
			{"own today, another's recent yesterday", marks{today: own, yesterday: recent}},
			{"another's old today, own yesterday", marks{today: old, yesterday: own}},
			{"another's recent today, own yesterday", marks{today: recent, yesterday: own}},
		}
		type outcome struct {
			result           Result
			old              string
			today, yesterday string
		}
		// setup writes the case's marks for addr and returns its two day hashes.
		setup := func(addr string, m marks) (today, yesterday string) {
			today, yesterday = FrequencyKey(c.Channel, addr, now), FrequencyKey(c.Channel, addr, now.Add(-24*time.Hour))
			for key, v := range map[string]string{today: m.today, yesterday: m.yesterday} {
				rdb.HDel(ctx, key, addr)
				if v != "" {
					if err := rdb.HSet(ctx, key, addr, v).Err(); err != nil {
						t.Fatal(err)
					}
				}
			}
			return today, yesterday
		}
		read := func(addr, today, yesterday string, got Claimed) outcome {
			o := outcome{result: got.Result, old: got.Old}
			o.today, _ = rdb.HGet(ctx, today, addr).Result()
			o.yesterday, _ = rdb.HGet(ctx, yesterday, addr).Result()
			return o
		}
		g := Guard{Epoch: "e1", Halt: HaltKey(c.ID)}
		var window []SendClaim
		var want []outcome
		var keys [][2]string
		for i, tc := range cases {
			addr := fmt.Sprintf("+90555%07d", i+100*int(capDur/time.Hour))
			today, yesterday := setup(addr, tc.m)
			got, err := cl.ClaimSend(ctx, c, Nonce(c), SendClaim{Key: ClaimKey(c.ID, "single-"+addr), Value: InFlightValue(now, "w"), Addr: addr}, g, nil, "", now)
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, read(addr, today, yesterday, got))
			setup(addr, tc.m)
			window = append(window, SendClaim{Key: ClaimKey(c.ID, "window-"+addr), Value: InFlightValue(now, "w"), Addr: addr})
			keys = append(keys, [2]string{today, yesterday})
		}
		got, _, err := cl.ClaimWindow(ctx, c, Nonce(c), window, g, nil, "", now)
		if err != nil || len(got) != len(cases) {
			t.Fatalf("cap %v: window claim: %v %v", capDur, got, err)
		}
		for i, tc := range cases {
			o := read(window[i].Addr, keys[i][0], keys[i][1], got[i])
			// A new mark carries the time of the claim: the same in both.
			if o != want[i] {
				t.Errorf("cap %v, %s: window %+v, single send %+v", capDur, tc.name, o, want[i])
			}
		}
		// What the single send's script decided, spelled out for the cases that matter most.
		for i, tc := range cases {
			w := want[i]
			switch tc.name {
			case "no mark":
				if w.result != Ours || !strings.HasPrefix(w.today, markOwner(c, Nonce(c))+"|") {
					t.Errorf("cap %v, %s: %+v, want ours with a mark today", capDur, tc.name, w)
				}
			case "another's recent mark today", "recent marks both days":
				if w.result != Capped || w.old != recent || w.today != recent {
					t.Errorf("cap %v, %s: %+v, want capped by today's mark, left as it was", capDur, tc.name, w)
				}
			case "own mark yesterday", "own mark today":
				// The mark moves to this send (a resend of an unknown send: the cap runs from the latest).
				if w.result != Ours || w.today != markOwner(c, Nonce(c))+"|"+ms(0) {
					t.Errorf("cap %v, %s: %+v, want ours with a mark of this claim today", capDur, tc.name, w)
				}
			case "another's old mark today":
				if w.result != Ours || !strings.HasPrefix(w.today, markOwner(c, Nonce(c))+"|") {
					t.Errorf("cap %v, %s: %+v, want ours, today's mark now ours", capDur, tc.name, w)
				}
			}
		}
	}
}

// Once another run has fenced a lease to take it over, every claim script refuses a claim under that lease
// (ErrFenced) and writes no claim, and a claim under another lease is taken as before. An answer is still
// written (the message it records went out before). A fence under another epoch is refused.
func TestAFencedLeaseClaimsNobody(t *testing.T) {
	t.Parallel()
	rdb, cl := newClaims(t, time.Hour)
	ctx := context.Background()
	c := &campaign.Campaign{ID: 42, Channel: campaign.ChannelSMS, CreatedAt: time.Now()}
	nonce := Nonce(c)
	now := time.Now()
	mine := InFlightValue(now, "w1")
	old := Guard{Epoch: "e1", Fence: FenceKey("lease-a"), Halt: HaltKey(c.ID), CheckHalt: true}
	sc := func(user string) SendClaim {
		return SendClaim{Key: ClaimKey(c.ID, user), Value: mine, Addr: "+9055500000" + user}
	}
	if got, err := cl.ClaimSend(ctx, c, nonce, sc("1"), old, nil, "", now); err != nil || got.Result != Ours {
		t.Fatalf("claim before the takeover: %+v, %v", got, err)
	}
	if err := cl.Fence(ctx, "e0", "lease-a"); !errors.Is(err, ErrEpoch) {
		t.Fatalf("fence under another epoch: %v, want ErrEpoch", err)
	}
	if err := cl.Fence(ctx, "e1", "lease-a"); err != nil {
		t.Fatal(err)
	}
	answer := &Answer{Key: ClaimKey(c.ID, "1"), InFlight: mine, Value: SentValue("SM1", 1)}
	if _, err := cl.ClaimSend(ctx, c, nonce, sc("2"), old, answer, "", now); !errors.Is(err, ErrFenced) {
		t.Fatalf("ClaimSend under the fenced lease: %v, want ErrFenced", err)
	}
	if _, _, err := cl.ClaimWindow(ctx, c, nonce, []SendClaim{sc("2"), sc("3")}, old, nil, "", now); !errors.Is(err, ErrFenced) {
		t.Fatalf("ClaimWindow under the fenced lease: %v, want ErrFenced", err)
	}
	if _, _, err := cl.ClaimWindow(ctx, c, nonce, []SendClaim{sc("2")}, old, nil, "", now); !errors.Is(err, ErrFenced) {
		t.Fatalf("ClaimWindow under the fenced lease: %v, want ErrFenced", err)
	}
	if _, _, err := cl.Take(ctx, ClaimKey(c.ID, "2"), nonce, ReasonValue(Skipped, "x"), old); !errors.Is(err, ErrFenced) {
		t.Fatalf("Take under the fenced lease: %v, want ErrFenced", err)
	}
	for _, u := range []string{"2", "3"} {
		if n := rdb.Exists(ctx, ClaimKey(c.ID, u)).Val(); n != 0 {
			t.Fatalf("a refused claim of u%s was left written", u)
		}
	}
	if v := rdb.Get(ctx, ClaimKey(c.ID, "1")).Val(); v != nonce+"/"+SentValue("SM1", 1) {
		t.Fatalf("u1's answer under the fenced lease: claim %q, want the answer written", v)
	}
	if ttl := rdb.PTTL(ctx, FenceKey("lease-a")).Val(); ttl <= 0 || ttl > time.Hour {
		t.Fatalf("the fence's TTL is %v, want the claims' (1h)", ttl)
	}
	next := Guard{Epoch: "e1", Fence: FenceKey("lease-b"), Halt: HaltKey(c.ID), CheckHalt: true}
	if got, err := cl.ClaimSend(ctx, c, nonce, sc("2"), next, nil, "", now); err != nil || got.Result != Ours {
		t.Fatalf("claim under the lease that took over: %+v, %v; want ours", got, err)
	}
	if n := rdb.Exists(ctx, FenceKey("")).Val(); n != 0 {
		t.Fatal("a guard without a fence key wrote one")
	}
}

// ForgetUnanswered deletes what no answer will come to (unknown, a claim in flight older than the
// grace, a leftover of an earlier campaign) and keeps answers and claims in flight younger than the
// grace, which it returns.
func TestForgetUnansweredKeepsYoungClaimsInFlight(t *testing.T) {
	t.Parallel()
	rdb, cl := newClaims(t, time.Hour)
	ctx := context.Background()
	c := &campaign.Campaign{ID: 43, Channel: campaign.ChannelSMS, CreatedAt: time.Now()}
	n := Nonce(c) + "/"
	set := map[string]string{
		"young":   n + InFlightValue(time.Now().Add(-5*time.Second), "w1"),
		"old":     n + InFlightValue(time.Now().Add(-2*time.Minute), "w1"),
		"unknown": n + ReasonValue(Unknown, "a worker stopped"),
		"sent":    n + SentValue("SM1", 1),
		"foreign": "othernonce/" + SentValue("SM2", 1),
	}
	users := []string{"none"}
	for u, v := range set {
		rdb.Set(ctx, ClaimKey(c.ID, u), v, 0)
		users = append(users, u)
	}
	kept, err := cl.ForgetUnanswered(ctx, c, users, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(kept) != 1 || kept[0] != "young" {
		t.Fatalf("kept %v, want only the claim in flight taken 5 s ago", kept)
	}
	for u, want := range map[string]bool{"young": true, "old": false, "unknown": false, "sent": true, "foreign": false} {
		if got := rdb.Exists(ctx, ClaimKey(c.ID, u)).Val() == 1; got != want {
			t.Errorf("claim %s still there: %v, want %v", u, got, want)
		}
	}
}

// The fleet's in-flight grace only rises: the longest a worker noted stays.
func TestInFlightGraceKeepsTheLongest(t *testing.T) {
	t.Parallel()
	rdb, _ := newClaims(t, time.Hour)
	ctx := context.Background()
	if d, err := InFlightGrace(ctx, rdb); err != nil || d != 0 {
		t.Fatalf("before any: %v, %v; want 0", d, err)
	}
	for _, d := range []time.Duration{30 * time.Second, 90 * time.Second, time.Minute} {
		if err := NoteInFlightGrace(ctx, rdb, d); err != nil {
			t.Fatal(err)
		}
	}
	if d, err := InFlightGrace(ctx, rdb); err != nil || d != 90*time.Second {
		t.Fatalf("after 30 s, 90 s and 1 min: %v, %v; want 90 s", d, err)
	}
}
