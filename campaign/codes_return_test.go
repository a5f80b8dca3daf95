package campaign_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/codes"
	"github.com/campaignctl/campaignctl/internal/testdb"
)

// Invariant 4 (codes) as codes come back to the pool: released codes go out again only once nobody holds
// them, and the codes that may have reached someone (sent, unknown) never come back.

// recipientsOf returns the users of a campaign's batch.
func recipientsOf(t *testing.T, db *pgxpool.Pool, id int64, batch int) []string {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT user_id FROM campaign_recipients WHERE campaign_id = $1 AND batch = $2 ORDER BY user_id`, id, batch)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var u string
		if err := rows.Scan(&u); err != nil {
			t.Fatal(err)
		}
		out = append(out, u)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// Launches racing codes coming back to their pool: campaign A's recipients fail for good (their codes are
// released by Record, batch after batch) and campaign B is cancelled (CancelUnleased releases its codes)
// while C and D reserve. Released codes go out again, first, but never while still held: afterwards every
// code is held once or free, the free count is exact (a launch needing one more is refused, saying so),
// and a last launch takes every free code, the released ones included.
func TestLaunchRacingReleasesNeverSharesACode(t *testing.T) {
	t.Parallel()
	db, url := testdb.New(t)
	ctx := context.Background()
	const size, batchSize = 150, 50
	seedCrowd(t, db, 4*size+1)
	planners := newPlanners(t, url, 2)
	store := campaign.NewStore(newPool(t, url, 2))
	for round := 1; round <= 4; round++ {
		covered := round%2 == 1
		pool := fmt.Sprintf("rel%d", round)
		label := fmt.Sprintf("round %d (fresh codes cover the launches: %v)", round, covered)
		fresh := 2 * size
		if !covered {
			fresh = size + size/3 // both launches succeed only with released codes
		}
		addCodes(t, db, pool, 2*size+fresh)
		a, err := planners[0].Plan(ctx, crowdSpec(fmt.Sprintf("rel%d-a", round), pool, size))
		if err != nil {
			t.Fatal(err)
		}
		b, err := planners[0].Plan(ctx, crowdSpec(fmt.Sprintf("rel%d-b", round), pool, size))
		if err != nil {
			t.Fatal(err)
		}
		batches := make([][]string, size/batchSize)
		for i := range batches {
			batches[i] = recipientsOf(t, db, a.ID, i)
		}
		names := []string{fmt.Sprintf("rel%d-c", round), fmt.Sprintf("rel%d-d", round)}
		var failed, cancelled int64
		errs := together(
			func() error {
				for i, users := range batches {
					outs := make([]campaign.Outcome, len(users))
					for j, u := range users {
						outs[j] = campaign.Outcome{UserID: u, Status: campaign.StatusFailed, Reason: "twilio 21211: invalid 'To' phone number"}
					}
					moved, err := store.Record(ctx, a.ID, outs, campaign.Lease{Batch: i}, nil)
					if err != nil {
						return err
					}
					failed += moved[campaign.StatusFailed]
				}
				return nil
			},
			func() error {
				if _, err := store.Transition(ctx, b.ID, []campaign.State{campaign.StateRunning}, campaign.StateCancelled); err != nil {
					return err
				}
				n, err := store.CancelUnleased(ctx, b.ID)
				cancelled = n
				return err
			},
			func() error { _, err := planners[0].Plan(ctx, crowdSpec(names[0], pool, size)); return err },
			func() error { _, err := planners[1].Plan(ctx, crowdSpec(names[1], pool, size)); return err },
		)
		if errs[0] != nil || failed != size {
			t.Fatalf("%s: Record failed %d recipients (%v), want %d", label, failed, errs[0], size)
		}
		if errs[1] != nil || cancelled != size {
			t.Fatalf("%s: CancelUnleased skipped %d recipients (%v), want %d", label, cancelled, errs[1], size)
		}
		won := launchOutcome(t, db, label, names, errs[2:], size, nil)
		if covered && won != 2 || won == 0 {
			t.Errorf("%s: %d launches succeeded (%v)", label, won, errs[2:])
		}
		total := int64(2*size + fresh) // A's and B's codes all came back
		free, err := codes.Free(ctx, db, pool)
		if err != nil || free != total-int64(won*size) {
			t.Errorf("%s: %d codes free (%v), want %d", label, free, err, total-int64(won*size))
		}
		checkCodes(t, db)

		// The free count is exact: one code more is refused, saying how many are missing ...
		_, err = planners[1].Plan(ctx, crowdSpec(fmt.Sprintf("rel%d-e", round), pool, int(free)+1))
		var short *campaign.PoolShortError
		if !errors.As(err, &short) || short.Free != free || short.Needed != free+1 {
			t.Errorf("%s: a launch needing %d of %d free codes: %v; want refused, 1 code missing", label, free+1, free, err)
		}
		// ... and exactly that many are given out, released ones and fresh ones alike.
		if _, err := planners[1].Plan(ctx, crowdSpec(fmt.Sprintf("rel%d-f", round), pool, int(free))); err != nil {
			t.Errorf("%s: a launch needing the %d free codes: %v", label, free, err)
		}
		if n := count(t, db, `SELECT count(*) FROM released_codes WHERE pool = $1`, pool); n != 0 {
			t.Errorf("%s: %d released codes left after a launch took every free code", label, n)
		}
		if n := count(t, db, `SELECT count(*) FROM promo_codes p JOIN campaign_recipients r ON r.code_id = p.id WHERE p.pool = $1`, pool); n != int64(2*size+fresh) {
			t.Errorf("%s: %d of the pool's %d codes held after the last launch took every free one", label, n, 2*size+fresh)
		}
		checkCodes(t, db)
		if t.Failed() {
			t.FailNow()
		}
	}
}

// codeOf returns the code and code id a recipient holds ("" and 0 for none).
func codeOf(t *testing.T, db *pgxpool.Pool, id int64, user string) (string, int64) {
	t.Helper()
	var code *string
	var codeID *int64
	if err := db.QueryRow(context.Background(), `SELECT code, code_id FROM campaign_recipients WHERE campaign_id = $1 AND user_id = $2`,
		id, user).Scan(&code, &codeID); err != nil {
		t.Fatal(err)
	}
	if code == nil || codeID == nil {
		return "", 0
	}
	return *code, *codeID
}

// A sent recipient's code, and an unknown one's (the provider's answer was lost: the message may have gone
// out with the code), never return to the pool: not through a later outcome recorded for them (a
// redelivered batch), not through a delivery receipt, not through a cancel. A recipient cancelled before
// anything was sent is the one whose code goes back, and only its code is given out again.
func TestSentAndUnknownCodesNeverReturnToThePool(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	seedCrowd(t, db, 3)
	addCodes(t, db, "keep", 3)
	p := &campaign.Planner{Engine: db, Audience: db}
	store := campaign.NewStore(db)
	a, err := p.Plan(ctx, crowdSpec("keep-a", "keep", 3))
	if err != nil {
		t.Fatal(err)
	}
	const sent, unknown, never = "u00001", "u00002", "u00003"
	planned := map[string]string{}
	for _, u := range []string{sent, unknown, never} {
		planned[u], _ = codeOf(t, db, a.ID, u)
	}
	moved, err := store.Record(ctx, a.ID, []campaign.Outcome{
		{UserID: sent, Status: campaign.StatusSent, MessageID: "SM1"},
		{UserID: unknown, Status: campaign.StatusUnknown, Reason: "timeout after the request was written"},
	}, campaign.Lease{Batch: 0}, nil)
	if err != nil || moved[campaign.StatusSent] != 1 || moved[campaign.StatusUnknown] != 1 {
		t.Fatalf("record: %v, %v", moved, err)
	}
	// A redelivered batch reports them again, failed or skipped this time: nothing moves.
	for _, st := range []string{campaign.StatusFailed, campaign.StatusSkipped, campaign.StatusPending} {
		moved, err := store.Record(ctx, a.ID, []campaign.Outcome{{UserID: sent, Status: st, Reason: "twilio 21610"},
			{UserID: unknown, Status: st, Reason: "twilio 21610"}}, campaign.Lease{Batch: 0}, nil)
		if err != nil || len(moved) != 0 {
			t.Fatalf("a later %s outcome for the sent and the unknown recipient moved %v (%v)", st, moved, err)
		}
	}
	// The sent message bounced: it did go out, with its code.
	if _, err := store.RecordDeliveries(ctx, []campaign.Delivery{{Provider: "twilio", MessageID: "SM1", CampaignID: a.ID, UserID: sent, Status: "undelivered", Error: "30003"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Transition(ctx, a.ID, []campaign.State{campaign.StateRunning}, campaign.StateCancelled); err != nil {
		t.Fatal(err)
	}
	if n, err := store.CancelUnleased(ctx, a.ID); err != nil || n != 1 {
		t.Fatalf("cancel skipped %d recipients (%v), want 1 (the one never sent)", n, err)
	}
	for _, u := range []string{sent, unknown} {
		if got, _ := codeOf(t, db, a.ID, u); got != planned[u] {
			t.Errorf("%s holds %q after the cancel, want its code %q", u, got, planned[u])
		}
	}
	if got, _ := codeOf(t, db, a.ID, never); got != "" {
		t.Errorf("the cancelled recipient still holds %q", got)
	}
	if free, err := codes.Free(ctx, db, "keep"); err != nil || free != 1 {
		t.Errorf("%d codes free (%v), want 1: the cancelled recipient's", free, err)
	}
	checkCodes(t, db)

	// The next launches: two codes are refused (one is missing); one gets the cancelled recipient's code.
	refused, err := p.Plan(ctx, crowdSpec("keep-b", "keep", 2))
	var short *campaign.PoolShortError
	if !errors.As(err, &short) || short.Free != 1 {
		t.Fatalf("a launch needing 2 codes: %v; want refused with 1 code free", err)
	}
	// The report printed with the refusal still says what the launch would have been.
	if refused.Eligible != 2 || refused.Batches != 1 {
		t.Errorf("the refused launch's report: %d eligible in %d batches, want 2 in 1", refused.Eligible, refused.Batches)
	}
	b, err := p.Plan(ctx, crowdSpec("keep-c", "keep", 1))
	if err != nil {
		t.Fatal(err)
	}
	if b.ID != a.ID+1 {
		t.Errorf("the launch after a refused one got campaign ID %d, want %d: the refusal used up an ID", b.ID, a.ID+1)
	}
	if got, _ := codeOf(t, db, b.ID, "u00001"); got != planned[never] {
		t.Errorf("the next launch got %q, want the cancelled recipient's %q", got, planned[never])
	}
	checkCodes(t, db)
}

// A recipient whose outcome was unknown and who is sent again (resume --resend-unknown) keeps its code
// whatever comes next: the resend failing for good, a send-time skip, an unknown again, a cancel while
// the resend is pending. The first message may have reached the person with that code, so it may not go to
// anybody else.
//
// Open: Record releases the code of a resent recipient whose resend fails for good or is skipped, and
// CancelUnleased the code of one still pending; the fix belongs to those two statements (keep the code of
// a recipient with an unknown outcome in send_log, and release only the codes the update dropped).
func TestResentUnknownKeepsItsCode(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	seedCrowd(t, db, 5)
	addCodes(t, db, "resend", 5)
	p := &campaign.Planner{Engine: db, Audience: db}
	store := campaign.NewStore(db)
	a, err := p.Plan(ctx, crowdSpec("resend-a", "resend", 5))
	if err != nil {
		t.Fatal(err)
	}
	const failed, skipped, pending, again = "u00001", "u00002", "u00003", "u00004"
	users := []string{failed, skipped, pending, again}
	planned := map[string]string{}
	var outs []campaign.Outcome
	for _, u := range users {
		planned[u], _ = codeOf(t, db, a.ID, u)
		outs = append(outs, campaign.Outcome{UserID: u, Status: campaign.StatusUnknown, Reason: "timeout after the request was written"})
	}
	if moved, err := store.Record(ctx, a.ID, outs, campaign.Lease{Batch: 0}, nil); err != nil || moved[campaign.StatusUnknown] != 4 {
		t.Fatalf("record unknown: %v, %v", moved, err)
	}
	// resume --resend-unknown
	if n, err := store.Resend(ctx, a.ID, users); err != nil || n != 4 {
		t.Fatalf("resend moved %d (%v), want 4", n, err)
	}
	for _, u := range users {
		if got, _ := codeOf(t, db, a.ID, u); got != planned[u] {
			t.Fatalf("%s holds %q after the resend, want its code %q", u, got, planned[u])
		}
	}
	// The resends: one fails for good, one is skipped (consent revoked meanwhile), one is unknown again,
	// one is still pending when the campaign is cancelled. The first two stay unknown: their first
	// message may have gone out.
	if moved, err := store.Record(ctx, a.ID, []campaign.Outcome{
		{UserID: failed, Status: campaign.StatusFailed, Reason: "twilio 21610: unsubscribed recipient"},
		{UserID: skipped, Status: campaign.StatusSkipped, Reason: campaign.ReasonRevoked},
		{UserID: again, Status: campaign.StatusUnknown, Reason: "timeout after the request was written"},
	}, campaign.Lease{Batch: 0}, nil); err != nil || moved[campaign.StatusUnknown] != 3 || len(moved) != 1 {
		t.Fatalf("record the resends: %v, %v", moved, err)
	}
	if _, err := store.Transition(ctx, a.ID, []campaign.State{campaign.StateRunning}, campaign.StateCancelled); err != nil {
		t.Fatal(err)
	}
	if n, err := store.CancelUnleased(ctx, a.ID); err != nil || n != 2 {
		t.Fatalf("cancel skipped %d recipients (%v), want 2 (the resend still pending, and the one never sent)", n, err)
	}
	for _, u := range users {
		if got, _ := codeOf(t, db, a.ID, u); got != planned[u] {
			t.Errorf("%s (unknown, then sent again) holds %q at the end, want its code %q", u, got, planned[u])
		}
	}
	if n := count(t, db, `SELECT count(*) FROM released_codes rc JOIN promo_codes p ON p.id = rc.code_id WHERE p.code = ANY($1)`,
		[]string{planned[failed], planned[skipped], planned[pending], planned[again]}); n != 0 {
		t.Errorf("%d codes of recipients once unknown are back in the pool", n)
	}
	if free, err := codes.Free(ctx, db, "resend"); err != nil || free != 1 {
		t.Errorf("%d codes free (%v), want 1: the never-sent recipient's", free, err)
	}
	checkCodes(t, db)
}

// A recipient made unknown by another writer than Record (an operator's UPDATE, a binary of an earlier
// version that does not set the row's mark) is marked all the same (the trigger of migration 0013): resent,
// then failed for good or skipped, it keeps its code.
func TestUnknownWrittenByAnotherWriterKeepsItsCode(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	seedCrowd(t, db, 3)
	addCodes(t, db, "other-writer", 3)
	p := &campaign.Planner{Engine: db, Audience: db}
	store := campaign.NewStore(db)
	a, err := p.Plan(ctx, crowdSpec("other-writer", "other-writer", 3))
	if err != nil {
		t.Fatal(err)
	}
	const failed, skipped = "u00001", "u00002"
	users := []string{failed, skipped}
	planned := map[string]string{}
	for _, u := range users {
		planned[u], _ = codeOf(t, db, a.ID, u)
	}
	if _, err := db.Exec(ctx, `UPDATE campaign_recipients SET status = 'unknown', reason = 'set by hand'
		WHERE campaign_id = $1 AND user_id = ANY($2)`, a.ID, users); err != nil {
		t.Fatal(err)
	}
	if n := count(t, db, `SELECT count(*) FROM campaign_recipients WHERE campaign_id = $1 AND ever_unknown`, a.ID); n != 2 {
		t.Fatalf("%d of 2 recipients made unknown by hand carry the mark", n)
	}
	if n, err := store.Resend(ctx, a.ID, users); err != nil || n != 2 {
		t.Fatalf("resend moved %d (%v), want 2", n, err)
	}
	if moved, err := store.Record(ctx, a.ID, []campaign.Outcome{
		{UserID: failed, Status: campaign.StatusFailed, Reason: "twilio 21610: unsubscribed recipient"},
		{UserID: skipped, Status: campaign.StatusSkipped, Reason: campaign.ReasonRevoked},
	}, campaign.Lease{Batch: 0}, nil); err != nil || moved[campaign.StatusUnknown] != 2 || len(moved) != 1 {
		t.Fatalf("record the resends: %v, %v", moved, err)
	}
	for _, u := range users {
		if got, _ := codeOf(t, db, a.ID, u); got != planned[u] {
			t.Errorf("%s (unknown by hand, then resent) holds %q, want its code %q", u, got, planned[u])
		}
	}
	if n := count(t, db, `SELECT count(*) FROM released_codes rc JOIN promo_codes p ON p.id = rc.code_id WHERE p.code = ANY($1)`,
		[]string{planned[failed], planned[skipped]}); n != 0 {
		t.Errorf("%d codes of recipients once unknown are back in the pool", n)
	}
	checkCodes(t, db)
}

// A code listed as released while a recipient still holds it (only a faulty release can leave one: a
// recipient keeping its code, its code filed as released all the same) is not free: a launch does not give
// it out and does not fail on it with a constraint error; it drops it from the free codes, and the free
// count never counted it.
func TestReleasedCodeStillHeldIsNeverGivenOut(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	seedCrowd(t, db, 2)
	addCodes(t, db, "held", 3)
	p := &campaign.Planner{Engine: db, Audience: db}
	a, err := p.Plan(ctx, crowdSpec("held-a", "held", 2))
	if err != nil {
		t.Fatal(err)
	}
	code, codeID := codeOf(t, db, a.ID, "u00001")
	mustExec(t, db, `INSERT INTO released_codes (code_id, pool) VALUES ($1, 'held')`, codeID)
	if free, err := codes.Free(ctx, db, "held"); err != nil || free != 1 {
		t.Errorf("%d codes free (%v), want 1: the held code counted as free", free, err)
	}
	if stats, err := codes.Stats(ctx, db); err != nil || len(stats) != 1 || stats[0] != (codes.PoolStats{Pool: "held", Total: 3, Free: 1, Reserved: 2}) {
		t.Errorf("stats %+v (%v), want 3 codes, 1 free, 2 reserved", stats, err)
	}

	b, err := p.Plan(ctx, crowdSpec("held-b", "held", 1))
	if err != nil {
		t.Fatalf("a launch needing the one free code: %v", err)
	}
	if got, _ := codeOf(t, db, b.ID, "u00001"); got == code || got != "HELD-000003" {
		t.Errorf("the launch gave out %q, want the free HELD-000003 (not %q, still held)", got, code)
	}
	if n := count(t, db, `SELECT count(*) FROM released_codes`); n != 0 {
		t.Errorf("%d codes still listed as released, want the held one dropped", n)
	}
	_, err = p.Plan(ctx, crowdSpec("held-c", "held", 1))
	var short *campaign.PoolShortError
	if !errors.As(err, &short) || short.Free != 0 {
		t.Errorf("a launch on the used-up pool: %v; want refused with no code free", err)
	}
	checkCodes(t, db)
}

// A cancel racing the outcome of a chunk in flight: a worker leased batch 0's recipients and sent them,
// and their outcome comes back unknown (the provider's answer was lost) just as the campaign is cancelled.
// Whichever gets there first, the chunk's recipients end unknown and keep their codes (the cancel leaves
// leased recipients to their run), and only the recipients nobody leased are cancelled with their codes
// back in the pool.
func TestCancelRacingAnUnknownOutcomeKeepsItsCodes(t *testing.T) {
	t.Parallel()
	db, url := testdb.New(t)
	ctx := context.Background()
	const size, batchSize = 100, 50
	seedCrowd(t, db, size)
	planner := newPlanners(t, url, 1)[0]
	recorder, canceller := campaign.NewStore(newPool(t, url, 1)), campaign.NewStore(newPool(t, url, 1))
	for round := 1; round <= 6; round++ {
		pool := fmt.Sprintf("inflight%d", round)
		addCodes(t, db, pool, size)
		rep, err := planner.Plan(ctx, crowdSpec(fmt.Sprintf("inflight%d", round), pool, size))
		if err != nil {
			t.Fatal(err)
		}
		c, err := recorder.Get(ctx, rep.ID)
		if err != nil {
			t.Fatal(err)
		}
		sent := recipientsOf(t, db, rep.ID, 0)
		lease := campaign.Lease{Batch: 0, Token: fmt.Sprintf("run-%d", round), Epoch: "e", TTL: time.Hour}
		if ch, err := recorder.LeaseChunk(ctx, c, sent, lease); err != nil || len(ch.Leased) != batchSize {
			t.Fatalf("lease: %d leased (%v)", len(ch.Leased), err)
		}
		planned := map[string]string{}
		outs := make([]campaign.Outcome, len(sent))
		for i, u := range sent {
			planned[u], _ = codeOf(t, db, rep.ID, u)
			outs[i] = campaign.Outcome{UserID: u, Status: campaign.StatusUnknown, Reason: "timeout after the request was written"}
		}
		var moved map[string]int64
		var cancelled int64
		errs := together(
			func() (err error) { moved, err = recorder.Record(ctx, rep.ID, outs, lease, nil); return err },
			func() error {
				if _, err := canceller.Transition(ctx, rep.ID, []campaign.State{campaign.StateRunning}, campaign.StateCancelled); err != nil {
					return err
				}
				n, err := canceller.CancelUnleased(ctx, rep.ID)
				cancelled = n
				return err
			},
		)
		if errs[0] != nil || moved[campaign.StatusUnknown] != batchSize {
			t.Fatalf("round %d: the unknown outcome moved %v (%v), want %d unknown: did the cancel take recipients whose send was in flight?",
				round, moved, errs[0], batchSize)
		}
		if errs[1] != nil || cancelled != size-batchSize {
			t.Fatalf("round %d: cancel skipped %d (%v), want the %d recipients nobody leased", round, cancelled, errs[1], size-batchSize)
		}
		for _, u := range sent {
			if got, _ := codeOf(t, db, rep.ID, u); got != planned[u] {
				t.Errorf("round %d: %s (unknown) holds %q, want its code %q", round, u, got, planned[u])
			}
		}
		if free, err := codes.Free(ctx, db, pool); err != nil || free != size-batchSize {
			t.Errorf("round %d: %d codes free (%v), want %d: the cancelled recipients'", round, free, err, size-batchSize)
		}
		checkCodes(t, db)
		if t.Failed() {
			t.FailNow()
		}
	}
}
