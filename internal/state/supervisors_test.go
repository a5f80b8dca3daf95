package state

import (
	"context"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/testredis"
)

// Supervisors on one queue count each other by their looks: a new one counts at its first look, one that
// leaves stops counting at once, and one that stops looking stops counting once its last look is older than
// alive.
func TestSupervisorsCountEachOther(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	ctx := context.Background()
	const alive = 600 * time.Millisecond
	look := func(name string, want int) {
		t.Helper()
		n, err := Supervisors(ctx, rdb, name, alive)
		if err != nil {
			t.Fatal(err)
		}
		if n != want {
			t.Errorf("%s counts %d supervisors, want %d", name, n, want)
		}
	}
	look("a", 1)
	look("a", 1) // its own look again is not a second supervisor
	look("b", 2)
	look("c", 3)
	look("a", 3)
	if err := LeaveSupervisors(ctx, rdb, "c"); err != nil {
		t.Fatal(err)
	}
	look("a", 2)
	// b stops looking (killed): a and d go on looking, and b drops out once its look is alive old.
	deadline := time.Now().Add(alive + 400*time.Millisecond)
	for time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		if _, err := Supervisors(ctx, rdb, "a", alive); err != nil {
			t.Fatal(err)
		}
	}
	look("a", 1)
	if ttl := rdb.PTTL(ctx, SupervisorsKey).Val(); ttl <= 0 || ttl > 2*alive {
		t.Errorf("the set's TTL is %v, want within (0, %v]: it goes once no supervisor looks", ttl, 2*alive)
	}
}
