package testredis

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/internal/testproc"
)

// Replica is a private redis-server that replicates a private master through a link of the test's own
// (a TCP relay in the test process), so that the test can make it fall behind: after Lag, what the master
// writes no longer reaches it, while both still believe the link is up, as with a replica behind a slow
// network. When the master dies, the link closes and whatever the replica had not received is lost.
type Replica struct {
	*Server
	master *Server
	link   *relay
}

// StartReplica starts a private replica of s (REPLICAOF through the relay) and returns once it is in sync
// with s. It is killed when the test ends.
func (s *Server) StartReplica(t testing.TB) *Replica {
	t.Helper()
	link, err := newRelay(s.addr)
	if err != nil {
		t.Fatalf("testredis: relay to %s: %v", s.addr, err)
	}
	t.Cleanup(link.close)
	return s.startReplica(t, link.addr(), link)
}

// StartDirectReplica is StartReplica without the relay: the replica connects to s itself, as in
// production, for measuring what replication costs. It cannot Lag.
func (s *Server) StartDirectReplica(t testing.TB) *Replica {
	t.Helper()
	return s.startReplica(t, s.addr, nil)
}

func (s *Server) startReplica(t testing.TB, via string, link *relay) *Replica {
	t.Helper()
	ctx := context.Background()
	m := redis.NewClient(&redis.Options{Addr: s.addr})
	defer m.Close()
	// A new replica gets its first copy at once rather than after the default five-second wait.
	if err := m.ConfigSet(ctx, "repl-diskless-sync-delay", "0").Err(); err != nil {
		t.Fatalf("testredis: configure master %s: %v", s.addr, err)
	}
	host, port, _ := net.SplitHostPort(via)
	r := &Replica{Server: startServer(t, "--replicaof", host, port), master: s, link: link}
	if err := r.WaitSynced(ctx); err != nil {
		t.Fatalf("testredis: %v", err)
	}
	return r
}

// WaitSynced waits (up to 10 s) until the replica's link to its master is up and it has applied
// everything the master wrote so far.
func (r *Replica) WaitSynced(ctx context.Context) error {
	m := redis.NewClient(&redis.Options{Addr: r.master.addr})
	defer m.Close()
	rc := redis.NewClient(&redis.Options{Addr: r.addr})
	defer rc.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		mi, merr := m.Info(ctx, "replication").Result()
		ri, rerr := rc.Info(ctx, "replication").Result()
		if merr == nil && rerr == nil && infoField(ri, "master_link_status") == "up" &&
			infoField(ri, "slave_repl_offset") != "" && infoField(ri, "slave_repl_offset") == infoField(mi, "master_repl_offset") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replica %s not in sync with %s after 10s (master: %v %s; replica: %v %s)",
				r.addr, r.master.addr, merr, infoField(mi, "master_repl_offset"), rerr, infoField(ri, "slave_repl_offset"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Lag cuts the master's stream to the replica from now on: what the master writes after Lag never reaches
// the replica (the relay reads it and drops it), and the replica does not notice until the master goes
// away. It cannot be undone.
func (r *Replica) Lag() {
	if r.link == nil {
		r.t.Fatal("testredis: Lag on a replica started without a relay (StartDirectReplica)")
	}
	r.link.drop()
}

// Promote makes the server a master (REPLICAOF NO ONE), as a failover does to the replica it picks.
func (s *Server) Promote(ctx context.Context) error {
	c := redis.NewClient(&redis.Options{Addr: s.addr})
	defer c.Close()
	if err := c.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
		return fmt.Errorf("testredis: REPLICAOF NO ONE on %s: %w", s.addr, err)
	}
	return nil
}

// Info returns one INFO section of the server, read on a connection of its own.
func (s *Server) Info(ctx context.Context, section string) (string, error) {
	c := redis.NewClient(&redis.Options{Addr: s.addr})
	defer c.Close()
	return c.Info(ctx, section).Result()
}

// InfoField is the value of one field ("role", "master_replid", ...) in an INFO reply, "" when absent.
func InfoField(info, name string) string { return infoField(info, name) }

func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

// relay forwards TCP connections to a Redis server; after drop, what the server sends is read and
// thrown away, and no new connection gets through.
type relay struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	dropped bool
	conns   []net.Conn
}

func newRelay(target string) (*relay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &relay{ln: ln, target: target}
	go r.accept()
	return r, nil
}

func (r *relay) addr() string { return r.ln.Addr().String() }

func (r *relay) accept() {
	for {
		down, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.mu.Lock()
		dropped := r.dropped
		r.mu.Unlock()
		if dropped {
			down.Close()
			continue
		}
		up, err := net.DialTimeout("tcp", r.target, time.Second)
		if err != nil {
			down.Close()
			continue
		}
		r.mu.Lock()
		r.conns = append(r.conns, down, up)
		r.mu.Unlock()
		go func() { io.Copy(up, down); up.Close(); down.Close() }() //nolint:errcheck // either side closing ends both
		go r.forward(up, down)
	}
}

// forward copies what the server sends to the replica until drop; from then on it reads and discards it,
// and closes the replica's side when the server's side ends.
func (r *relay) forward(up, down net.Conn) {
	defer up.Close()
	defer down.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := up.Read(buf)
		if n > 0 {
			r.mu.Lock()
			dropped := r.dropped
			r.mu.Unlock()
			if !dropped {
				if _, werr := down.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

func (r *relay) drop() {
	r.mu.Lock()
	r.dropped = true
	r.mu.Unlock()
}

func (r *relay) close() {
	r.ln.Close()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		c.Close()
	}
}

// Sentinel is a private redis-sentinel monitoring one private master under a name, quick to act: the
// master is judged down after 200 ms of silence, and one Sentinel is its whole quorum.
type Sentinel struct {
	addr string
	cmd  *exec.Cmd
	done chan struct{}
}

// StartSentinel starts a Sentinel for master under name and returns once it knows the master and its
// replicas (those connected now). It is killed when the test ends.
func StartSentinel(t testing.TB, name string, master *Server, replicas int) *Sentinel {
	t.Helper()
	bin := serverBinary(t)
	dir := t.TempDir()
	port, err := testproc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	host, mport, _ := net.SplitHostPort(master.addr)
	conf := filepath.Join(dir, "sentinel.conf")
	cfg := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\n", port, dir) +
		fmt.Sprintf("sentinel monitor %s %s %s 1\n", name, host, mport) +
		fmt.Sprintf("sentinel down-after-milliseconds %s 200\n", name) +
		fmt.Sprintf("sentinel failover-timeout %s 5000\n", name) +
		fmt.Sprintf("sentinel parallel-syncs %s 1\n", name)
	if err := os.WriteFile(conf, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(dir, "sentinel.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, conf, "--sentinel")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		t.Fatalf("testredis: start sentinel: %v", err)
	}
	s := &Sentinel{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); logFile.Close(); close(s.done) }() //nolint:errcheck // a killed sentinel's status says nothing
	t.Cleanup(func() {
		cmd.Process.Kill() //nolint:errcheck // already gone is fine
		<-s.done
	})
	c := redis.NewSentinelClient(&redis.Options{Addr: s.addr})
	defer c.Close()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		addr, err := c.GetMasterAddrByName(ctx, name).Result()
		var known []map[string]string
		if err == nil {
			known, err = c.Replicas(ctx, name).Result()
		}
		cancel()
		if err == nil && len(addr) == 2 && len(known) >= replicas {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("testredis: sentinel %s does not know master %s with %d replicas after 15s (%v, %d known)", s.addr, name, replicas, err, len(known))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Addr is the Sentinel's host:port.
func (s *Sentinel) Addr() string { return s.addr }

// WaitMaster waits (up to timeout) until the Sentinel names addr as the master of name.
func (s *Sentinel) WaitMaster(ctx context.Context, name, addr string, timeout time.Duration) error {
	c := redis.NewSentinelClient(&redis.Options{Addr: s.addr})
	defer c.Close()
	deadline := time.Now().Add(timeout)
	var got []string
	var err error
	for time.Now().Before(deadline) {
		got, err = c.GetMasterAddrByName(ctx, name).Result()
		if err == nil && len(got) == 2 && net.JoinHostPort(got[0], got[1]) == addr {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("testredis: sentinel %s names %v (%v) as master of %s after %v, want %s", s.addr, got, err, name, timeout, addr)
}
