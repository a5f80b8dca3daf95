package worker

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
)

// A launch whose Postgres goes away during the plan (a restart, a failover) said only "plan: classify
// audience: conn closed". The plan is one transaction: it says that nothing was written and to launch
// again. A statement Postgres refused is not taken for a lost connection.
func TestALaunchThatLostPostgresSaysNothingWasWritten(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	defer rdb.Close()
	_, err = Launch(context.Background(), LaunchOptions{Planner: &campaign.Planner{Engine: pool, Audience: pool}, Redis: rdb, Spec: fixtureSpec("gone")})
	if err == nil || !strings.Contains(err.Error(), "nothing was written or sent; launch again") {
		t.Fatalf("launch with Postgres gone: %v; want it to say nothing was written, and to launch again", err)
	}
	for _, tc := range []struct {
		err  error
		lost bool
	}{
		{errors.New("plan: classify audience: conn closed"), true},
		{&pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"}, true},
		{&pgconn.PgError{Code: "08006", Message: "connection failure"}, true},
		{&pgconn.PgError{Code: "42601", Message: "syntax error"}, false},
		{campaign.ErrInvalid, false},
	} {
		if got := lostPostgres(tc.err); got != tc.lost {
			t.Errorf("lostPostgres(%v) = %v, want %v", tc.err, got, tc.lost)
		}
	}
}
