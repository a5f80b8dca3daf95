package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/internal/testproc"
	"github.com/campaignctl/campaignctl/internal/testredis"
)

func TestRedisURLForms(t *testing.T) {
	t.Parallel()
	opt, err := parseSentinelURL("redis+sentinel://:s3cret@10.0.0.1:26379,10.0.0.2/mymaster/3?sentinel_password=sp")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(opt.SentinelAddrs, ",") != "10.0.0.1:26379,10.0.0.2:26379" || opt.MasterName != "mymaster" || opt.DB != 3 ||
		opt.Password != "s3cret" || opt.SentinelPassword != "sp" {
		t.Fatalf("parsed %+v", opt)
	}
	for _, raw := range []string{"redis+sentinel://h:26379/", "redis+sentinel://h:26379/m/x", "redis+sentinel://,h/m", "redis+cluster://a,b", "http://x"} {
		if _, _, err := redisClient(raw, nil); err == nil {
			t.Errorf("%s accepted", raw)
		}
	}
	if _, _, err := redisClient("redis://:topsecret@127.0.0.1:6379/x", nil); err == nil || strings.Contains(err.Error(), "topsecret") {
		t.Errorf("a bad URL: %v (the password must not be shown)", err)
	}
}

// A real Sentinel in front of a private master: REDIS_URL=redis+sentinel://... reaches the master, and the
// campaign's queue lands there.
func TestSentinelURLReachesTheMaster(t *testing.T) {
	t.Parallel()
	master := testredis.StartServer(t)
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		bin = "/usr/bin/redis-server"
	}
	dir := t.TempDir()
	port := freePortNum(t)
	conf := filepath.Join(dir, "sentinel.conf")
	host, mport, _ := net.SplitHostPort(master.Addr())
	os.WriteFile(conf, []byte(fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor campaigns %s %s 1\n", port, dir, host, mport)), 0o600) //nolint:errcheck
	cmd := exec.Command(bin, conf, "--sentinel")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() }) //nolint:errcheck
	sentinel := redis.NewSentinelClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port)})
	defer sentinel.Close()
	waitFor(t, 10*time.Second, func() bool {
		addr, err := sentinel.GetMasterAddrByName(context.Background(), "campaigns").Result()
		return err == nil && len(addr) == 2
	})

	env, id, _, _ := plannedEnv(t)
	env["REDIS_URL"] = fmt.Sprintf("redis+sentinel://127.0.0.1:%d/campaigns/0", port)
	out, stderr, code := cli(t, env, "resume", id)
	if code != 0 || !strings.Contains(out, "3 batches re-enqueued") {
		t.Fatalf("resume through Sentinel: exit %d, %s%s", code, out, stderr)
	}
	direct := redis.NewClient(&redis.Options{Addr: master.Addr()})
	defer direct.Close()
	if n, err := direct.LLen(context.Background(), "asynq:{campaigns}:pending").Result(); err != nil || n != 3 {
		t.Fatalf("the master holds %d pending batches (%v), want 3", n, err)
	}
}

func freePortNum(t *testing.T) int {
	t.Helper()
	port, err := testproc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}
