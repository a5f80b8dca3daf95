package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/worker"
)

// sentinelScheme is the REDIS_URL form for a Redis behind Sentinel:
//
//	redis+sentinel://[[user]:password@]host1:26379[,host2:26379...]/MASTER[/DB][?sentinel_password=...]
//
// The password is the master's; sentinel_password (and sentinel_username) authenticate to the sentinels
// when they require it. The client follows the master through failovers.
const sentinelScheme = "redis+sentinel"

// redisClient builds the client REDIS_URL names: redis:// and rediss:// (TLS) for one server or a managed
// endpoint, redis+sentinel:// for a Sentinel-managed master. Redis Cluster is not supported: the claim
// script reads and writes keys that Cluster would place on different slots.
//
// Every new connection checks the Redis epoch before it carries a command (worker.CheckEpochOnConnect):
// after a failover or a restart the epoch is renewed before anything is claimed on the new master, and a
// connection to a replica is refused. log (may be nil) is told when the epoch was renewed.
func redisClient(raw string, log *slog.Logger) (*redis.Client, string, error) {
	return newRedisClient(raw, epochCheck(log), false)
}

// epochCheck is the connection check of redisClient (worker.CheckEpochOnConnect), telling log.
func epochCheck(log *slog.Logger) func(next onConnect) onConnect {
	return func(next onConnect) onConnect { return worker.CheckEpochOnConnect(next, log) }
}

// haltRedisClient is redisClient for pause and cancel, whose contexts' deadlines bound each command's
// reads and writes too (by default only the retries stop there, and each read waits out the client's
// timeout): a frozen Redis holds them for the second they give it, not for a timeout per connection and
// retry.
func haltRedisClient(raw string, log *slog.Logger) (*redis.Client, string, error) {
	return newRedisClient(raw, epochCheck(log), true)
}

// queueRedisClient is redisClient for a command that queues work but takes no claim (launch): its
// connections are refused on a replica as well, but they neither create nor renew the epoch
// (worker.CheckMasterOnConnect), so a launch refused after it connected leaves Redis as it found it.
func queueRedisClient(raw string) (*redis.Client, string, error) {
	return newRedisClient(raw, worker.CheckMasterOnConnect, false)
}

type onConnect = func(context.Context, *redis.Conn) error

// newRedisClient builds the client of redisClient with the connection check check; bounded makes the
// contexts' deadlines bound the commands' reads and writes (haltRedisClient).
func newRedisClient(raw string, check func(next onConnect) onConnect, bounded bool) (*redis.Client, string, error) {
	if strings.HasPrefix(raw, sentinelScheme+"://") {
		opt, err := parseSentinelURL(raw)
		if err != nil {
			return nil, "", err
		}
		opt.OnConnect = check(opt.OnConnect)
		opt.ContextTimeoutEnabled = bounded
		return redis.NewFailoverClient(opt), "sentinels " + strings.Join(opt.SentinelAddrs, ",") + " master " + opt.MasterName, nil
	}
	if strings.HasPrefix(raw, "redis+cluster://") {
		return nil, "", fmt.Errorf("Redis Cluster is not supported (the claims need their keys on one node); use one server, a managed endpoint, or Sentinel (%s://host:26379/MASTER)", sentinelScheme)
	}
	opt, err := redis.ParseURL(raw)
	if err != nil {
		// the parser's error quotes the whole URL, password included
		return nil, "", fmt.Errorf("not a valid Redis URL (%s); use redis://[:password@]host:port/db, rediss:// for TLS, or %s://host:26379,host2:26379/MASTER/db", redact(raw), sentinelScheme)
	}
	opt.OnConnect = check(opt.OnConnect)
	opt.ContextTimeoutEnabled = bounded
	return redis.NewClient(opt), opt.Addr, nil
}

func parseSentinelURL(raw string) (*redis.FailoverOptions, error) {
	bad := func(why string) error {
		return fmt.Errorf("%s: %s; use %s://[:password@]host1:26379[,host2:26379]/MASTER[/DB]", redact(raw), why, sentinelScheme)
	}
	// url.Parse refuses a list of hosts, so the authority is taken apart by hand.
	rest := strings.TrimPrefix(raw, sentinelScheme+"://")
	authority, pathQuery, _ := strings.Cut(rest, "/")
	u, err := url.Parse("sentinel:///" + pathQuery)
	if err != nil {
		return nil, bad("not a URL")
	}
	hosts := authority
	if at := strings.LastIndex(authority, "@"); at >= 0 {
		hosts = authority[at+1:]
		ui, err := url.Parse("x://" + authority[:at+1] + "h")
		if err != nil || ui.User == nil {
			return nil, bad("the user or password is malformed")
		}
		u.User = ui.User
	}
	opt := &redis.FailoverOptions{}
	for _, h := range strings.Split(hosts, ",") {
		if h == "" {
			return nil, bad("a sentinel address is empty")
		}
		if !strings.Contains(h, ":") {
			h += ":26379"
		}
		opt.SentinelAddrs = append(opt.SentinelAddrs, h)
	}
	parts := strings.Split(strings.Trim(u.Path, "/"), "/")
	if len(parts) == 0 || parts[0] == "" || len(parts) > 2 {
		return nil, bad("the path must name the master, and may add the DB number")
	}
	opt.MasterName = parts[0]
	if len(parts) == 2 {
		if opt.DB, err = strconv.Atoi(parts[1]); err != nil || opt.DB < 0 {
			return nil, bad("the DB number must be a number")
		}
	}
	if u.User != nil {
		opt.Username = u.User.Username()
		opt.Password, _ = u.User.Password()
	}
	q := u.Query()
	opt.SentinelUsername, opt.SentinelPassword = q.Get("sentinel_username"), q.Get("sentinel_password")
	return opt, nil
}
