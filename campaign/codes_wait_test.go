package campaign_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/codes"
	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/internal/testlog"
)

// A launch that finds a code import or generate writing codes says that it waits for it, instead of
// waiting without a word (an import of a million codes takes some 20 s, on any pool), and goes on once it
// is done.
func TestALaunchSaysItWaitsForACodeWriter(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	seedAudience(t, db, 10)
	ctx := context.Background()
	writer, err := db.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Release()
	if _, err := writer.Exec(ctx, `SELECT pg_advisory_lock($1)`, codes.WriteLockKey); err != nil {
		t.Fatal(err)
	}
	logs := &testlog.Buffer{}
	p := &campaign.Planner{Engine: db, Audience: db, Log: slog.New(slog.NewTextHandler(logs, nil))}
	done := make(chan error, 1)
	go func() {
		_, err := p.Plan(ctx, spec("waits"))
		done <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "waiting for another writer of codes") {
		if time.Now().After(deadline) {
			t.Fatalf("the launch said nothing of the code writer it waits for: %s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("the launch went on while a code writer held the lock: %v", err)
	default:
	}
	if _, err := writer.Exec(ctx, `SELECT pg_advisory_unlock($1)`, codes.WriteLockKey); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the launch after the writer: %v", err)
	}
}
