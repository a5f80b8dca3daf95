package iys_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/iys"
	"github.com/campaignctl/campaignctl/providers/sandbox"
)

// docs/operations.md tells operators to size the pool with pool_max_conns in DATABASE_URL. With
// pool_max_conns=1 (a small cron Job behind a tight max_connections), the push's turn lock holds the
// pool's only connection and every query of the push then waits for a connection that never comes back:
// the cron run hung until the Job's deadline, and nothing was ever pushed or synced. The lock is held on a
// connection of its own.
func TestPushAndSyncWithAOneConnectionPoolEnd(t *testing.T) {
	const addr = "+905324444479"
	_, _, brand, base, plain := onayOnBothSides(t, addr)

	_, url := testdb.New(t)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	pool, err := pgxpool.New(context.Background(), url+sep+"pool_max_conns=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := iys.RecordRefusals(context.Background(), pool, brand, []iys.Refusal{{Via: iys.ViaTwilioInbound, EventID: "SM79", Kind: "inbound",
		Recipient: addr, Type: "MESAJ", Evidence: "RET", At: base}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := iys.Push(ctx, pool, plain, iys.PushOptions{}); err != nil {
		t.Errorf("push with pool_max_conns=1: %v", err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	if _, err := iys.Sync(ctx2, pool, newEnv(t, sandbox.Options{}, nil).client(t, nil)); err != nil {
		t.Errorf("sync with pool_max_conns=1: %v", err)
	}
}
