package testredis

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/internal/testproc"
)

// Server is a private redis-server process that belongs to one test, for the tests that must do to Redis
// what the shared server cannot take: freeze it, empty it. Its data lives only in memory (no RDB, no AOF)
// and in a directory of the test's own.
type Server struct {
	t       testing.TB
	addr    string
	logPath string
	cmd     *exec.Cmd
	exited  chan struct{} // closed when the process has been waited for
}

// StartServer starts a private redis-server on a free loopback port and returns once it answers PING.
// The binary is looked up in PATH, then at /usr/bin/redis-server; the test fails, saying what to install,
// when there is none.
// The process is killed (SIGKILL, also when frozen) and waited for when the test ends.
func StartServer(t testing.TB) *Server {
	t.Helper()
	return startServer(t)
}

// serverBinary is the redis-server binary; the test fails when there is none (tests never skip).
func serverBinary(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if _, serr := os.Stat("/usr/bin/redis-server"); serr != nil {
			t.Fatal("testredis: redis-server is not installed (not in PATH nor /usr/bin); install it (apt-get install redis-server, as scripts/test.sh does) to run this test")
		}
		bin = "/usr/bin/redis-server"
	}
	return bin
}

// startServer starts a private redis-server with extra arguments (e.g. --replicaof host port).
func startServer(t testing.TB, extra ...string) *Server {
	t.Helper()
	bin := serverBinary(t)
	dir := t.TempDir()
	// The free port is found by listening and closing, so another process may take it in between: try
	// a few ports before giving up.
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		s, err := start(t, bin, dir, attempt, extra...)
		if err == nil {
			return s
		}
		lastErr = err
	}
	t.Fatalf("testredis: %v", lastErr)
	return nil
}

func start(t testing.TB, bin, dir string, attempt int, extra ...string) (*Server, error) {
	port, err := testproc.FreePort()
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, fmt.Sprintf("redis-%d.log", attempt))
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	args := append([]string{"--bind", "127.0.0.1", "--port", strconv.Itoa(port),
		"--save", "", "--appendonly", "no", "--dir", dir, "--daemonize", "no"}, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	s := &Server{t: t, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), logPath: logPath, cmd: cmd, exited: make(chan struct{})}
	go func() {
		cmd.Wait() //nolint:errcheck // the exit status of a killed server says nothing
		logFile.Close()
		close(s.exited)
	}()
	t.Cleanup(s.stop)

	rdb := redis.NewClient(&redis.Options{Addr: s.addr, DialTimeout: time.Second, ReadTimeout: time.Second, MaxRetries: -1})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-s.exited:
			return nil, fmt.Errorf("redis-server on %s exited at start: %s", s.addr, testproc.Tail(s.logPath, 2000))
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			return s, nil
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, fmt.Errorf("redis-server on %s does not answer PING after 10s (%v): %s", s.addr, err, testproc.Tail(s.logPath, 2000))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// URL is the server's DB 0 as a redis:// URL, for REDIS_URL.
func (s *Server) URL() string { return "redis://" + s.addr + "/0" }

// Addr is host:port.
func (s *Server) Addr() string { return s.addr }

// Freeze stops the process with SIGSTOP: connections stay open and nothing is answered, as with a server
// stuck or cut off by the network. Call it from the test's goroutine.
func (s *Server) Freeze() { s.signal(syscall.SIGSTOP) }

// Thaw lets a frozen server run again with SIGCONT. Call it from the test's goroutine.
func (s *Server) Thaw() { s.signal(syscall.SIGCONT) }

// Flush empties every database of this private server with FLUSHALL, as a Redis restarted without
// persistence would be. It never talks to any other server (never to the shared one New leases from).
func (s *Server) Flush(ctx context.Context) error {
	rdb := redis.NewClient(&redis.Options{Addr: s.addr})
	defer rdb.Close()
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		return fmt.Errorf("testredis: FLUSHALL on private server %s: %w", s.addr, err)
	}
	return nil
}

func (s *Server) signal(sig os.Signal) {
	s.t.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("testredis: %v to redis-server %s: %v", sig, s.addr, err)
	}
}

// Kill ends the server with SIGKILL, as a crash or a lost machine would, and waits for it to exit: what
// it had not replicated is gone. Safe to call twice; the test's cleanup calls it too.
func (s *Server) Kill() { s.stop() }

// stop kills the server and waits for it; safe to call twice.
func (s *Server) stop() {
	s.cmd.Process.Kill() //nolint:errcheck // already gone is fine
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		s.t.Errorf("testredis: redis-server %s did not exit 10s after SIGKILL", s.addr)
	}
}
