package worker

import (
	"context"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/providers"
)

// The e-mail path: a request of 4 is refused as a whole (400) after 1.2 s, during which user3 refuses. The
// request is split; the first half's consents are read again (they are stale), and that must not make the
// second half's fresh: user3's is read again before its e-mail goes, and it goes to nobody who refused.
func TestASplitRequestsSecondHalfIsReadAgainToo(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	db, _, id, p, h := planEmailDB(t, 4, 10, rdb)
	ctx := context.Background()
	p.before = func(n int) {
		if n == 1 {
			if _, err := db.Exec(ctx, `UPDATE iys_consents SET status = 'RET', updated_at = now() WHERE recipient = 'user3@example.com'`); err != nil {
				t.Error(err)
			}
			time.Sleep(1200 * time.Millisecond)
		}
	}
	p.fail = func(n int) error {
		if n == 1 {
			return &providers.Error{Provider: "batch", Status: 400, Class: providers.Permanent, Message: "request refused as a whole"}
		}
		return nil
	}
	if err := h.RunBatch(ctx, id, 0); err != nil {
		t.Fatal(err)
	}
	if len(p.requests) < 3 {
		t.Fatalf("%d requests: the first was not split, this tests nothing", len(p.requests))
	}
	if n := len(p.accepted["user3@example.com"]); n != 0 {
		t.Fatalf("user3 refused (RET) 1.2 s before the second half of the split request went, and got %d e-mails", n)
	}
}
