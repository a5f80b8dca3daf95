package worker

import (
	"context"
	"errors"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/providers"
)

// followingClient is a client whose new connections go wherever addr says at the moment they are dialed,
// as a client behind a DNS name or a proxy that a failover repoints. With check, every new connection runs
// the epoch check first, as campaignctl's own clients do (CheckEpochOnConnect).
func followingClient(t *testing.T, addr *atomic.Pointer[string], check bool) *redis.Client {
	t.Helper()
	opt := &redis.Options{
		Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, *addr.Load())
		},
		DialTimeout: time.Second, ReadTimeout: 2 * time.Second,
		// Idle connections to a master that died fail one after another before a new one is dialed.
		MaxRetries: 10, MinRetryBackoff: time.Millisecond, MaxRetryBackoff: 10 * time.Millisecond,
	}
	if check {
		opt.OnConnect = CheckEpochOnConnect(nil, nil)
	}
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// failOver kills master and promotes replica in its place, and points addr at it.
func failOver(t *testing.T, master *testredis.Server, replica *testredis.Replica, addr *atomic.Pointer[string]) {
	t.Helper()
	master.Kill()
	if err := replica.Promote(context.Background()); err != nil {
		t.Fatal(err)
	}
	a := replica.Addr()
	addr.Store(&a)
}

// A run dies in the middle of its chunk (u1 and u2 sent, u4 claimed) on a master whose replica lags: the
// claims of those sends never reach the replica. The master dies, the replica is promoted, and it still
// holds the epoch the dead run's lease recorded (replicated long before). The run that takes the chunk
// over must not read the missing claims as "never sent": the new master is not the one the epoch was
// issued on, so the epoch is renewed, the chunk is another epoch's, and its recipients become unknown.
// Nobody gets a second message.
func TestTakeoverAfterFailoverToALaggingReplicaSendsNobodyTwice(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		check bool
	}{{"the epoch read at batch start notices", false}, {"new connections notice", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := plan(t, 10) // eligible in batch 0: u1 u2 u4 u7 u8
			ctx := context.Background()
			master := testredis.StartServer(t)
			replica := master.StartReplica(t)
			var addr atomic.Pointer[string]
			a := master.Addr()
			addr.Store(&a)
			rdb := followingClient(t, &addr, tc.check)
			e0, err := Epoch(ctx, rdb)
			if err != nil {
				t.Fatal(err)
			}
			if err := replica.WaitSynced(ctx); err != nil {
				t.Fatal(err)
			}
			replica.Lag()

			cfg := Config{Store: f.store, Redis: rdb, Owner: "dead", LeaseTTL: 300 * time.Millisecond, SendWindow: 1,
				Providers: map[campaign.Channel]providers.Provider{campaign.ChannelSMS: f.provider}, ProviderRates: map[string]float64{}}
			dead := NewHandler(cfg)
			exited := make(chan struct{})
			f.provider.before = func(m providers.Message) {
				if m.To == phone(4) {
					runtime.Goexit() // killed while waiting for the provider: nothing more is written anywhere
				}
			}
			go func() {
				defer close(exited)
				dead.RunBatch(ctx, f.id, 0) //nolint:errcheck // it never returns
			}()
			<-exited
			f.provider.before = nil
			if got := f.provider.total(); got != 2 {
				t.Fatalf("the dead run sent %d messages before it died, want 2 (u1, u2)", got)
			}
			c := f.campaign(t)
			for _, u := range []string{"u1", "u2", "u4"} {
				if n, err := rdb.Exists(ctx, ClaimKey(c.ID, u)).Result(); err != nil || n != 1 {
					t.Fatalf("the dead run's claim of %s is not on the master (%d, %v)", u, n, err)
				}
			}

			failOver(t, master, replica, &addr)
			time.Sleep(cfg.LeaseTTL + 100*time.Millisecond) // the dead run's lease expires

			cfg.Owner, cfg.LeaseTTL = "takeover", 0
			if err := NewHandler(cfg).RunBatch(ctx, f.id, 0); err != nil {
				t.Fatal(err)
			}
			f.assertOnce(t)
			if got := f.provider.total(); got != 2 {
				t.Errorf("provider got %d messages in all, want only the dead run's 2", got)
			}
			for _, u := range []string{"u1", "u2", "u4", "u7", "u8"} {
				if st, _, _ := f.status(t, u); st != campaign.StatusUnknown {
					t.Errorf("%s (in the dead run's chunk, its claims lost in the failover): %s, want unknown", u, st)
				}
			}
			e1, err := Epoch(ctx, rdb)
			if err != nil || e1 == e0 {
				t.Fatalf("epoch after the failover: %q (%v), want a new one (was %q)", e1, err, e0)
			}
		})
	}
}

// A run that leased its chunk (and read the epoch) before a failover goes on claiming after it: its next
// claim reaches the new master, which lacks the claims the replica never received. Every connection to
// the new master is new, and a new connection renews the epoch before it carries anything, so that claim
// is refused (state.ErrEpoch) instead of being taken as a first one: it may be a recipient the dead master had
// already seen sent.
func TestClaimOnTheNewMasterUnderTheOldEpochIsRefused(t *testing.T) {
	t.Parallel()
	f := plan(t, 10)
	ctx := context.Background()
	c := f.campaign(t)
	master := testredis.StartServer(t)
	replica := master.StartReplica(t)
	var addr atomic.Pointer[string]
	a := master.Addr()
	addr.Store(&a)
	rdb := followingClient(t, &addr, true)
	cl := state.New(rdb, time.Hour)
	e0, err := Epoch(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	if err := replica.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	replica.Lag()
	g := state.Guard{Epoch: e0, Halt: HaltKey(c.ID), CheckHalt: true}
	nonce := Nonce(c)
	sc := state.SendClaim{Key: ClaimKey(c.ID, "u1"), Value: state.InFlightValue(time.Now(), "first"), Addr: phone(1)}
	got, err := cl.ClaimSend(ctx, c, nonce, sc, g, nil, "", time.Now())
	if err != nil || got.Result != state.Ours {
		t.Fatalf("claim on the master: %+v %v", got, err)
	}
	if err := cl.Settle(ctx, sc.Key, nonce, sc.Value, state.SentValue("SMfirst", 1)); err != nil {
		t.Fatal(err)
	}

	failOver(t, master, replica, &addr)
	// The first command after the failover already finds the epoch renewed.
	if v, err := rdb.Get(ctx, EpochKey).Result(); err != nil || v == e0 {
		t.Errorf("epoch on the new master before anyone asked for it: %q (%v); want it renewed (was %q)", v, err, e0)
	}
	sc.Value = state.InFlightValue(time.Now(), "second")
	got, err = cl.ClaimSend(ctx, c, nonce, sc, g, nil, "", time.Now())
	if !errors.Is(err, state.ErrEpoch) {
		t.Fatalf("claim of u1 (sent, its claim lost) on the new master under the old epoch: %+v %v; want state.ErrEpoch", got, err)
	}
	if n, _ := rdb.Exists(ctx, sc.Key).Result(); n != 0 {
		t.Fatal("the refused claim was written")
	}
}

// The epoch belongs to the master it was issued on: it stays while that master serves, is renewed on a
// promoted replica (even one that had everything: nothing proves it), on a server whose run_id or
// replication ID is not the recorded one, and when no server was recorded with it (an epoch written by an
// earlier version). Clients that check at once on a new master all get the same new epoch. A replica
// refuses the check, and a connection to it fails.
func TestEpochFollowsTheMaster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	master := testredis.StartServer(t)
	replica := master.StartReplica(t)
	mc := redis.NewClient(&redis.Options{Addr: master.Addr()})
	defer mc.Close()
	e1, err := Epoch(ctx, mc)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := Epoch(ctx, mc); err != nil || again != e1 {
		t.Fatalf("second read on the same master: %q (%v), want %q", again, err, e1)
	}
	if err := replica.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}

	rc := redis.NewClient(&redis.Options{Addr: replica.Addr()})
	defer rc.Close()
	if _, err := Epoch(ctx, rc); !errors.Is(err, ErrNotMaster) {
		t.Fatalf("epoch on a replica: %v, want ErrNotMaster", err)
	}
	checked := redis.NewClient(&redis.Options{Addr: replica.Addr(), OnConnect: CheckEpochOnConnect(nil, nil), MaxRetries: -1})
	defer checked.Close()
	if err := checked.Ping(ctx).Err(); !errors.Is(err, ErrNotMaster) {
		t.Fatalf("a checked connection to a replica: %v, want it refused with ErrNotMaster", err)
	}

	// Promoted with everything it had: clients check at once on their first connection.
	if err := replica.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	const n = 32
	got := make([]string, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := redis.NewClient(&redis.Options{Addr: replica.Addr(), OnConnect: CheckEpochOnConnect(nil, nil)})
			defer c.Close()
			<-start
			var err error
			if got[i], err = c.Get(ctx, EpochKey).Result(); err != nil {
				t.Error(err)
			}
		}()
	}
	close(start)
	wg.Wait()
	e2 := got[0]
	for i, e := range got {
		if e != e2 || e == e1 {
			t.Fatalf("client %d read epoch %q on the promoted replica; all read %v, want one new epoch (was %q)", i, e, got, e1)
		}
	}
	if again, err := Epoch(ctx, rc); err != nil || again != e2 {
		t.Fatalf("epoch on the promoted replica: %q (%v), want %q", again, err, e2)
	}

	repl, _ := replica.Info(ctx, "replication")
	srv, _ := replica.Info(ctx, "server")
	runID, replID := testredis.InfoField(srv, "run_id"), testredis.InfoField(repl, "master_replid")
	if v, _ := rc.Get(ctx, EpochServerKey).Result(); v != runID+"/"+replID {
		t.Fatalf("%s = %q, want %q", EpochServerKey, v, runID+"/"+replID)
	}
	prev := e2
	for _, tc := range []struct {
		name   string
		server *string // nil: deleted
	}{
		{"another server's run_id (a restart)", ptr("0000000000000000000000000000000000000000/" + replID)},
		{"another replication ID (demoted and promoted again)", ptr(runID + "/0000000000000000000000000000000000000000")},
		{"no server recorded (an earlier version's epoch)", nil},
	} {
		if tc.server == nil {
			err = rc.Del(ctx, EpochServerKey).Err()
		} else {
			err = rc.Set(ctx, EpochServerKey, *tc.server, 0).Err()
		}
		if err != nil {
			t.Fatal(err)
		}
		e, err := Epoch(ctx, rc)
		if err != nil || e == prev {
			t.Fatalf("%s: epoch %q (%v), want a new one (was %q)", tc.name, e, err, prev)
		}
		prev = e
	}
	// Data lost: a new epoch, as before.
	if err := replica.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if e, err := Epoch(ctx, rc); err != nil || e == prev || e == "" {
		t.Fatalf("after FLUSHALL: epoch %q (%v), want a new one", e, err)
	}
}

func ptr(s string) *string { return &s }
