// Package testpg runs a private Postgres server for one test: its own data directory and port, for the
// tests that must do to Postgres what the shared server cannot take (crash it, restart it). The shared
// server (internal/testdb) is never touched.
//
// The server is tuned so that a crash takes back what an asynchronous commit left in Postgres' memory
// (HoldWAL): nothing but the test's own sessions writes the WAL out (no autovacuum, no background
// writer, no checkpoint in the test's time).
package testpg

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testproc"
)

// installHint is what a test that cannot find or run the server says to do.
const installHint = "install the PostgreSQL server (apt-get install postgresql, which puts initdb and pg_ctl in " +
	"/usr/lib/postgresql/<version>/bin), or point TEST_PG_BIN at the directory that holds them"

// settings make a crash lose exactly what was never written out of the WAL buffers: the WAL writer
// waits as long as it may between rounds (and is held by HoldWAL), the background writer writes no data
// page (writing one flushes the WAL up to it), and neither autovacuum nor a checkpoint comes in a test's
// time. Everything else is Postgres' default, fsync included.
var settings = []string{
	"listen_addresses = '127.0.0.1'",
	"max_connections = 40",
	"shared_buffers = 32MB",
	"wal_writer_delay = 10s",
	"bgwriter_lru_maxpages = 0",
	"autovacuum = off",
	"checkpoint_timeout = 1h",
	"max_wal_size = 1GB",
	"logging_collector = off",
	"log_min_messages = warning",
}

// Server is a private Postgres server that belongs to one test. Its methods are for the test's goroutine.
type Server struct {
	t    testing.TB
	bin  string // the directory of initdb, pg_ctl and postgres
	dir  string // everything of the server: data, socket, log
	data string
	port int
	cred *syscall.Credential // the OS user the server runs as (nil: the test's own)

	mu       sync.Mutex
	proc     *exec.Cmd     // the postmaster, while it runs
	exited   chan struct{} // closed once proc has been waited for
	walPID   int           // the WAL writer, while HoldWAL holds it
	logFile  *os.File
	restarts int
}

// Start initialises a data directory in a new temporary directory and starts a server on a free loopback
// port, returning once it accepts connections. Postgres refuses to run as root: a test running as root
// runs it as the OS user postgres (the directory is given to that user). The server is stopped and its
// directory removed when the test ends. The test fails, with what to install, when there is no server.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{t: t, bin: binDir(t)}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("testpg: Postgres does not run as root and there is no OS user postgres to run it as (%v); %s", err, installHint)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}
	}
	// Not t.TempDir: its parent is the test's own, which the postgres user may not enter.
	dir, err := os.MkdirTemp("", "campaignctl-testpg-")
	if err != nil {
		t.Fatalf("testpg: %v", err)
	}
	s.dir, s.data = dir, filepath.Join(dir, "data")
	t.Cleanup(func() {
		s.stop()
		os.RemoveAll(s.dir) //nolint:errcheck // a temporary directory
	})
	if s.cred != nil {
		if err := os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			t.Fatalf("testpg: give %s to the postgres user: %v", dir, err)
		}
	}
	if out, err := s.command("initdb", "-D", s.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-instructions").CombinedOutput(); err != nil {
		t.Fatalf("testpg: initdb: %v\n%s", err, out)
	}
	if s.port, err = testproc.FreePort(); err != nil {
		t.Fatalf("testpg: %v", err)
	}
	conf := append([]string{"port = " + strconv.Itoa(s.port), "unix_socket_directories = '" + s.dir + "'"}, settings...)
	f, err := os.OpenFile(filepath.Join(s.data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString("\n# testpg\n" + strings.Join(conf, "\n") + "\n")
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		t.Fatalf("testpg: postgresql.conf: %v", err)
	}
	s.start()
	return s
}

// binDir finds initdb and pg_ctl: TEST_PG_BIN, then pg_config --bindir, then the newest
// /usr/lib/postgresql/<version>/bin.
func binDir(t testing.TB) string {
	t.Helper()
	has := func(dir string) bool {
		for _, b := range []string{"initdb", "pg_ctl", "postgres"} {
			if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
				return false
			}
		}
		return true
	}
	if d := os.Getenv("TEST_PG_BIN"); d != "" {
		if !has(d) {
			t.Fatalf("testpg: TEST_PG_BIN=%s holds no initdb, pg_ctl and postgres; %s", d, installHint)
		}
		return d
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if d := strings.TrimSpace(string(out)); has(d) {
			return d
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if has(d) {
			return d
		}
	}
	t.Fatalf("testpg: no initdb and pg_ctl found; %s", installHint)
	return ""
}

// version is the major version in /usr/lib/postgresql/<version>/bin.
func version(dir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return v
}

// command is one of the server's programs, run as the server's OS user.
func (s *Server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	cmd.Dir = s.dir
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	return cmd
}

// start runs the postmaster as a child of the test and waits until it accepts connections (after a
// crash, once its recovery is over).
func (s *Server) start() {
	s.t.Helper()
	logPath := filepath.Join(s.dir, fmt.Sprintf("postgres-%d.log", s.restarts))
	s.restarts++
	logFile, err := os.Create(logPath)
	if err != nil {
		s.t.Fatalf("testpg: %v", err)
	}
	cmd := s.command("postgres", "-D", s.data)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		s.t.Fatalf("testpg: start postgres: %v; %s", err, installHint)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait() //nolint:errcheck // a crashed server's status says nothing
		close(exited)
	}()
	s.mu.Lock()
	s.proc, s.exited, s.logFile = cmd, exited, logFile
	s.mu.Unlock()

	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-exited:
			s.t.Fatalf("testpg: postgres exited at start: %s", testproc.Tail(logPath, 3000))
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c, err := pgx.Connect(ctx, s.URL("postgres"))
		if err == nil {
			c.Close(ctx)
			cancel()
			return
		}
		cancel()
		if time.Now().After(deadline) {
			s.t.Fatalf("testpg: postgres on port %d does not accept connections after 60s (%v): %s", s.port, err, testproc.Tail(logPath, 3000))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// URL is the server's database db, for pgx (and DATABASE_URL).
func (s *Server) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, db)
}

// Migrated creates the database name, migrates it to the engine's schema and returns a pool on it (closed
// when the test ends) and its URL.
func (s *Server) Migrated(name string) (*pgxpool.Pool, string) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		s.t.Fatalf("testpg: %v", err)
	}
	_, err = admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	admin.Close(ctx)
	if err != nil {
		s.t.Fatalf("testpg: create database %s: %v", name, err)
	}
	url := s.URL(name)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		s.t.Fatalf("testpg: %v", err)
	}
	s.t.Cleanup(pool.Close)
	if _, err := campaign.Migrate(ctx, pool); err != nil {
		s.t.Fatalf("testpg: migrate %s: %v", name, err)
	}
	return pool, url
}

// HoldWAL stops the server's WAL writer (SIGSTOP) until the next Crash: from then on what a commit with
// synchronous_commit off writes stays in the server's WAL buffers, and a crash takes it back, while a
// durable commit still writes (and flushes) the WAL itself, up to its own commit record.
func (s *Server) HoldWAL() {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		s.t.Fatalf("testpg: hold the WAL writer: %v", err)
	}
	defer c.Close(ctx)
	var pid int
	if err := c.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'`).Scan(&pid); err != nil {
		s.t.Fatalf("testpg: find the WAL writer: %v", err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		s.t.Fatalf("testpg: SIGSTOP the WAL writer %d: %v", pid, err)
	}
	s.mu.Lock()
	s.walPID = pid
	s.mu.Unlock()
}

// Crash stops the server as a crash would: `pg_ctl stop -m immediate` (every process quits at once,
// nothing is written out or checkpointed; the next start recovers from the WAL on disk). A WAL writer
// held by HoldWAL is killed, so it never writes the buffers out. Connections of the test's pools fail
// until Restart.
func (s *Server) Crash() {
	s.t.Helper()
	s.mu.Lock()
	exited, wal := s.exited, s.walPID
	s.walPID = 0
	s.mu.Unlock()
	if exited == nil {
		s.t.Fatal("testpg: Crash of a server that is not running")
	}
	out, err := s.command("pg_ctl", "stop", "-D", s.data, "-m", "immediate", "-W").CombinedOutput()
	if err != nil {
		s.t.Fatalf("testpg: pg_ctl stop -m immediate: %v\n%s", err, out)
	}
	if wal != 0 {
		// Stopped, it cannot act on the postmaster's SIGQUIT; killed, it writes nothing.
		syscall.Kill(wal, syscall.SIGKILL) //nolint:errcheck // it may be gone already
	}
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		s.t.Fatalf("testpg: postgres still running 30s after pg_ctl stop -m immediate")
	}
	s.mu.Lock()
	s.proc, s.exited = nil, nil
	s.logFile.Close()
	s.mu.Unlock()
}

// Restart starts the server again after Crash; it returns once the server has recovered and accepts
// connections.
func (s *Server) Restart() {
	s.t.Helper()
	s.start()
}

// stop ends the server for good (the test's cleanup).
func (s *Server) stop() {
	s.mu.Lock()
	proc, exited, wal := s.proc, s.exited, s.walPID
	s.proc, s.exited, s.walPID = nil, nil, 0
	s.mu.Unlock()
	if proc == nil {
		return
	}
	proc.Process.Signal(syscall.SIGQUIT) //nolint:errcheck // immediate shutdown
	if wal != 0 {
		syscall.Kill(wal, syscall.SIGKILL) //nolint:errcheck
	}
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		proc.Process.Kill() //nolint:errcheck
		<-exited
	}
	s.logFile.Close()
}

// Log returns the end of the server's current log, for a test's failure message.
func (s *Server) Log() string {
	return testproc.Tail(filepath.Join(s.dir, fmt.Sprintf("postgres-%d.log", s.restarts-1)), 3000)
}
