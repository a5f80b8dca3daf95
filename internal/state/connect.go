package state

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/redis/go-redis/v9"
)

// CheckEpochOnConnect returns a go-redis OnConnect hook that checks the Redis epoch (see Epoch) on every
// new connection, before the connection carries any command: when the master is not the one the epoch
// was issued on, the epoch is renewed there and then, so every claim taken on a new master after a
// failover is refused if its lease recorded the old epoch. A failover leaves the client no old connection
// to the new master (go-redis closes the connections to any other address when it learns of the switch,
// a dead master's connections fail, and Sentinel kills the promoted server's client connections), so
// every command the new master serves comes through a connection that was checked. A failed check fails
// the connection: nothing runs on a connection whose epoch could not be checked.
//
// Connections to a Sentinel (go-redis hands a failover client's hook to its Sentinel connections too) are
// left alone. next, when not nil, runs after the check. log, when not nil, is told when the epoch changed.
func CheckEpochOnConnect(next func(context.Context, *redis.Conn) error, log *slog.Logger) func(context.Context, *redis.Conn) error {
	return func(ctx context.Context, cn *redis.Conn) error {
		info, err := cn.Info(ctx, "server").Result()
		if err != nil {
			return fmt.Errorf("redis epoch check on connect: %w", err)
		}
		if !strings.Contains(info, "redis_mode:sentinel") {
			e, change, err := checkEpoch(ctx, cn)
			if err != nil {
				return err
			}
			if change == epochRenewed && log != nil {
				log.Warn("Redis has another master than the one its epoch was issued on (a failover, a restart, or an epoch of an earlier version): epoch renewed. Batches stop at their next claim and run again; recipients in the chunks of workers that died meanwhile become unknown. Run `campaignctl resume ID` for every running or paused campaign",
					"epoch", e)
			}
		}
		if next != nil {
			return next(ctx, cn)
		}
		return nil
	}
}

// CheckMasterOnConnect returns a go-redis OnConnect hook for a client that takes no claims (a launch, which
// only queues): every new connection checks that it reached the master, as CheckEpochOnConnect does, but
// it neither creates nor renews the epoch. So a command refused after it connected leaves Redis as it
// found it; the workers' own connections create or renew the epoch before any claim. Connections to a
// Sentinel are left alone. next, when not nil, runs after the check.
func CheckMasterOnConnect(next func(context.Context, *redis.Conn) error) func(context.Context, *redis.Conn) error {
	return func(ctx context.Context, cn *redis.Conn) error {
		info, err := cn.Info(ctx, "server", "replication").Result()
		if err != nil {
			return fmt.Errorf("redis role check on connect: %w", err)
		}
		if !strings.Contains(info, "redis_mode:sentinel") {
			if role := InfoField(info, "role"); role != "master" {
				return fmt.Errorf("redis role check: %w (role:%s)", ErrNotMaster, role)
			}
		}
		if next != nil {
			return next(ctx, cn)
		}
		return nil
	}
}

// InfoField is the value of field name in the text of Redis's INFO ("" when absent).
func InfoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}
