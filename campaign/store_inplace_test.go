package campaign_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testdb"
)

// outcomeColumns are the recipient columns that recording an outcome or a receipt writes.
var outcomeColumns = []string{"status", "reason", "last_error", "provider_message_id", "segments", "attempts", "sent_at",
	"updated_at", "delivery", "delivery_error", "delivery_at"}

// No index of campaign_recipients names a column an outcome or a receipt writes (as a key, in an
// expression or in a predicate), and the table leaves room on its pages: the outcomes of a chunk are
// written in place (heap-only tuples), without a new entry in any index.
func TestNoRecipientIndexNamesAnOutcomeColumn(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	rows, err := db.Query(ctx, `
		SELECT i.indexrelid::regclass::text, a.attname
		FROM pg_index i
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum > 0
		WHERE i.indrelid = 'campaign_recipients'::regclass
		  AND (a.attnum = ANY(i.indkey)
		       OR pg_get_expr(i.indexprs, i.indrelid) ~ ('\m' || a.attname || '\M')
		       OR pg_get_expr(i.indpred, i.indrelid) ~ ('\m' || a.attname || '\M'))`)
	if err != nil {
		t.Fatal(err)
	}
	indexed := map[string][]string{}
	for rows.Next() {
		var idx, col string
		if err := rows.Scan(&idx, &col); err != nil {
			t.Fatal(err)
		}
		indexed[col] = append(indexed[col], idx)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(indexed) == 0 {
		t.Fatal("found no indexed column at all: the query is wrong")
	}
	for _, col := range outcomeColumns {
		if idx := indexed[col]; len(idx) > 0 {
			t.Errorf("column %s is named by index %s: every outcome would write a new row version and index entries", col, strings.Join(idx, ", "))
		}
	}
	var opts []string
	if err := db.QueryRow(ctx, `SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = 'campaign_recipients'::regclass`).Scan(&opts); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(opts, ","), "fillfactor=45") {
		t.Errorf("campaign_recipients options %v, want fillfactor=45 (room for each row's outcome on its page)", opts)
	}
}

// launchCrowd launches an SMS to the first n users of the crowd (seedCrowd) with codes of pool p, in

// planned launches sp on db (the audience's database too) and returns the campaign as Get reads it.
func planned(t *testing.T, db *pgxpool.Pool, sp campaign.Spec) *campaign.Campaign {
	t.Helper()
	ctx := context.Background()
	rep, err := (&campaign.Planner{Engine: db, Audience: db}).Plan(ctx, sp)
	if err != nil {
		t.Fatal(err)
	}
	c, err := campaign.NewStore(db).Get(ctx, rep.ID)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// batches of batch, and returns it running.
func launchCrowd(t *testing.T, db *pgxpool.Pool, name string, n, batch int) *campaign.Campaign {
	t.Helper()
	ctx := context.Background()
	sp := crowdSpec(name, "p", n)
	sp.BatchSize = batch
	c := planned(t, db, sp)
	store := campaign.NewStore(db)
	if c.State != campaign.StateRunning {
		if _, err := store.Transition(ctx, c.ID, []campaign.State{c.State}, campaign.StateRunning); err != nil {
			t.Fatal(err)
		}
		c.State = campaign.StateRunning
	}
	return c
}

// recordBatch records status for every pending recipient of batch, each with a message ID of its own.
func recordBatch(t *testing.T, store *campaign.Store, c *campaign.Campaign, batch int, status string) {
	t.Helper()
	ctx := context.Background()
	rs, err := store.LoadBatch(ctx, c.ID, batch)
	if err != nil {
		t.Fatal(err)
	}
	var outs []campaign.Outcome
	for _, r := range rs {
		outs = append(outs, campaign.Outcome{UserID: r.UserID, Status: status, MessageID: "SM" + r.UserID})
	}
	if _, err := store.Record(ctx, c.ID, outs, campaign.Lease{Batch: batch}, nil); err != nil {
		t.Fatal(err)
	}
}

// The outcomes of a batch's chunks, recorded as the worker records them (a lease, then the chunk's
// outcomes), are all heap-only updates: Postgres rewrote no index for them.
func TestOutcomesAreWrittenInPlace(t *testing.T) {
	t.Parallel()
	db, url := testdb.New(t)
	ctx := context.Background()
	const n = 300
	seedCrowd(t, db, n)
	addCodes(t, db, "p", n)
	c := launchCrowd(t, db, "in-place", n, n)
	// One connection for the store, so that its statistics can be flushed before they are read.
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	one, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	store := campaign.NewStore(one)
	recipients, err := store.LoadBatch(ctx, c.ID, 0)
	if err != nil || len(recipients) != n {
		t.Fatalf("batch 0 holds %d recipients (%v), want %d", len(recipients), err, n)
	}
	flushed := func() (upd, hot int64) {
		t.Helper()
		if _, err := one.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
			t.Fatal(err)
		}
		if err := one.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'campaign_recipients'::regclass`).Scan(&upd, &hot); err != nil {
			t.Fatal(err)
		}
		return upd, hot
	}
	upd0, hot0 := flushed()

	l := campaign.Lease{Batch: 0, Token: "run-1", Epoch: "e", TTL: time.Minute}
	for start := 0; start < n; start += 100 {
		chunk := recipients[start : start+100]
		users := make([]string, len(chunk))
		outcomes := make([]campaign.Outcome, len(chunk))
		for i, r := range chunk {
			users[i] = r.UserID
			outcomes[i] = campaign.Outcome{UserID: r.UserID, Status: campaign.StatusSent, MessageID: fmt.Sprintf("SM%032d", start+i), Segments: 1}
		}
		if _, err := store.LeaseChunk(ctx, c, users, l); err != nil {
			t.Fatal(err)
		}
		moved, err := store.Record(ctx, c.ID, outcomes, l, nil)
		if err != nil || moved[campaign.StatusSent] != int64(len(chunk)) {
			t.Fatalf("record chunk at %d: moved %v (%v)", start, moved, err)
		}
	}
	var upd, hot int64
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if upd, hot = flushed(); upd-upd0 >= n || time.Now().After(deadline) {
			break
		}
	}
	if upd-upd0 != n {
		t.Fatalf("%d recipient updates counted, want %d", upd-upd0, n)
	}
	// All of them, but for the odd page whose rows grew by more than the room left (these rows are small,
	// so their outcomes make them grow by half).
	if hot-hot0 < n*9/10 {
		t.Errorf("%d of %d outcomes written in place (heap-only); the rest wrote a new row version and index entries", hot-hot0, n)
	}
	// The send is found by its message ID and by time, as the dropped indexes found it.
	applied, err := store.RecordDeliveries(ctx, []campaign.Delivery{{Provider: "twilio", MessageID: fmt.Sprintf("SM%032d", 7), Status: campaign.DeliveryDelivered}})
	changed := applied.Changed
	if err != nil || changed != 1 {
		t.Fatalf("a receipt naming only the message ID changed %d (%v), want its recipient", changed, err)
	}
}

// A batch is settled once it has no pending recipient; the campaign completes when none of its batches
// has one, whichever batch run asks, even one whose own batch was settled long ago; a recipient made
// pending again (by Resend, or by hand) keeps its campaign from completing until it is sent.
func TestCompletionFollowsThePendingRecipientsOfEveryBatch(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	seedCrowd(t, db, 6)
	addCodes(t, db, "p", 6)
	c := launchCrowd(t, db, "settle", 6, 2)
	store := campaign.NewStore(db)
	batches, err := store.PendingBatches(ctx, c.ID, false)
	if err != nil || fmt.Sprint(batches) != "[0 1 2]" {
		t.Fatalf("pending batches %v (%v), want [0 1 2]", batches, err)
	}
	record := func(batch int, status string) { t.Helper(); recordBatch(t, store, c, batch, status) }
	settled := func() string {
		t.Helper()
		var s string
		if err := db.QueryRow(ctx, `SELECT string_agg(batch::text, ' ' ORDER BY batch) FILTER (WHERE settled) FROM campaign_batches WHERE campaign_id = $1`, c.ID).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	// complete is the check at the end of a run of batches[0] (CloseBatch), or resume's (CompleteIfDone).
	complete := func(want bool, batches ...int) {
		t.Helper()
		var done bool
		var err error
		if len(batches) == 0 {
			done, err = store.CompleteIfDone(ctx, c.ID)
		} else {
			done, _, err = store.CloseBatch(ctx, c.ID, batches[0])
		}
		if err != nil || done != want {
			t.Fatalf("complete after batches %v: %v (%v), want %v", batches, done, err, want)
		}
	}

	record(0, campaign.StatusSent)
	complete(false, 0)
	if s := settled(); s != "0" {
		t.Fatalf("settled batches %q, want 0", s)
	}
	// Batch 2's outcomes come in, but its run never asks (the run that recorded them died): the next
	// batch's run still completes the campaign.
	record(2, campaign.StatusSent)
	complete(false, 0)
	record(1, campaign.StatusUnknown)
	complete(true, 1)
	if s := settled(); s != "0 1" {
		t.Fatalf("settled batches %q after completion, want 0 1 (2 has nothing pending, and was not asked about)", s)
	}
	if batches, err := store.PendingBatches(ctx, c.ID, false); err != nil || len(batches) != 0 {
		t.Fatalf("pending batches %v (%v) of a completed campaign, want none", batches, err)
	}

	// resume --resend-unknown: the campaign runs again, batch 1's unknown recipients are pending.
	if _, err := store.Transition(ctx, c.ID, []campaign.State{campaign.StateCompleted}, campaign.StateRunning); err != nil {
		t.Fatal(err)
	}
	unknown, err := store.Unknown(ctx, c.ID)
	if err != nil || len(unknown) != 2 {
		t.Fatalf("unknown %v (%v), want batch 1's two", unknown, err)
	}
	if n, err := store.Resend(ctx, c.ID, unknown); err != nil || n != 2 {
		t.Fatalf("resend moved %d (%v), want 2", n, err)
	}
	if s := settled(); s != "0" {
		t.Fatalf("settled batches %q after the resend, want 0", s)
	}
	if batches, err := store.PendingBatches(ctx, c.ID, false); err != nil || fmt.Sprint(batches) != "[1]" {
		t.Fatalf("pending batches %v (%v) after the resend, want [1]", batches, err)
	}
	complete(false, 0)
	complete(false)
	// The run of batch 1 that was sending when the resend happened never loaded them: it must come back.
	if _, open, err := store.CloseBatch(ctx, c.ID, 1); err != nil || !open {
		t.Fatalf("batch 1 after the resend: open %v (%v), want open", open, err)
	}
	record(1, campaign.StatusSent)
	if done, open, err := store.CloseBatch(ctx, c.ID, 1); err != nil || open || !done {
		t.Fatalf("batch 1 once sent: open %v, completed %v (%v), want closed and the campaign completed", open, done, err)
	}

	// An operator makes a recipient of batch 0 pending by hand: the trigger takes the batch's mark away.
	if _, err := store.Transition(ctx, c.ID, []campaign.State{campaign.StateCompleted}, campaign.StateRunning); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `UPDATE campaign_recipients SET status = 'pending' WHERE campaign_id = $1 AND user_id = (
		SELECT min(user_id) FROM campaign_recipients WHERE campaign_id = $1 AND batch = 0)`, c.ID)
	if s := settled(); s != "1 2" {
		t.Fatalf("settled batches %q after a recipient of batch 0 was made pending by hand, want 1 2", s)
	}
	complete(false, 1)
	record(0, campaign.StatusSent)
	complete(true, 0)
}

// A recipient that was unknown and that a receipt proves sent counts for a later launch's frequency cap,
// as one sent outright does; one sent before the cap's window does not.
func TestFrequencyCapCountsSendsProvedByReceipts(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	seedCrowd(t, db, 4)
	addCodes(t, db, "p", 4)
	rep := launchCrowd(t, db, "first", 4, 4)
	store := campaign.NewStore(db)
	outs := []campaign.Outcome{
		{UserID: "u00001", Status: campaign.StatusSent, MessageID: "SM1"},
		{UserID: "u00002", Status: campaign.StatusUnknown, Reason: "timeout"},
		{UserID: "u00003", Status: campaign.StatusUnknown, Reason: "timeout"},
		{UserID: "u00004", Status: campaign.StatusSent, MessageID: "SM4"},
	}
	if _, err := store.Record(ctx, rep.ID, outs, campaign.Lease{Batch: 0}, nil); err != nil {
		t.Fatal(err)
	}
	// u00002's receipt proves its send; u00003 stays unknown; u00004 was sent two days ago.
	if res, err := store.RecordDeliveries(ctx, []campaign.Delivery{{Provider: "twilio", CampaignID: rep.ID, UserID: "u00002", MessageID: "SM2", Status: campaign.DeliveryDelivered}}); err != nil || res.Changed != 1 {
		t.Fatalf("receipt changed %d (%v)", res.Changed, err)
	}
	mustExec(t, db, `UPDATE campaign_recipients SET sent_at = now() - interval '2 days' WHERE user_id = 'u00004'`)
	mustExec(t, db, `UPDATE send_log SET at = now() - interval '2 days' WHERE user_id = 'u00004'`)
	if n := count(t, db, `SELECT count(*) FROM send_log WHERE user_id = 'u00002' AND status = 'sent' AND provider_message_id = 'SM2'`); n != 1 {
		t.Fatalf("%d audit entries of u00002's proved send, want 1", n)
	}

	addCodes(t, db, "p", 4)
	second := crowdSpec("second", "p", 4)
	second.FrequencyCap = 24 * time.Hour
	rep2, err := (&campaign.Planner{Engine: db, Audience: db}).Plan(ctx, second)
	if err != nil {
		t.Fatal(err)
	}
	if got := rep2.Excluded[campaign.ReasonFrequencyCap]; got != 2 || rep2.Eligible != 2 {
		t.Fatalf("second launch: %d capped, %d eligible; want u00001 and u00002 capped, u00003 and u00004 eligible", got, rep2.Eligible)
	}
}

// A receipt that names only the message ID finds its audit entry through send_log_message (the hash of the
// ID), not by reading the log: the plan of RecordDeliveries' own statement, with sequential scans made as
// dear as the planner allows, reads the index.
func TestReceiptByMessageIDUsesTheAuditIndex(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // EXPLAIN writes nothing
	if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `PREPARE receipts AS `+campaign.RecordDeliveriesSQL); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, `EXPLAIN EXECUTE receipts('{twilio}', '{SM1}', '{0}', '{""}', '{delivered}', '{""}', '{""}', ARRAY[now()], '{""}', '{0}')`)
	if err != nil {
		t.Fatal(err)
	}
	var plan []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, line)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// The index searched by the ID's hash, not read whole (its predicate alone would let the planner do that).
	searched := false
	for i, line := range plan {
		if strings.Contains(line, " send_log_message ") && i+1 < len(plan) &&
			strings.Contains(plan[i+1], "Index Cond: (hashtext(provider_message_id) = hashtext(") {
			searched = true
		}
	}
	if !searched {
		t.Fatalf("a receipt naming only the message ID does not search send_log_message by its hash:\n%s", strings.Join(plan, "\n"))
	}
}

// A send whose receipts name their recipient (a Twilio callback URL with campaign_id and user_id, SendGrid's
// custom_args) is audited as such and left out of the message-ID index; one whose receipts may name only
// the message ID stays in it, and such a receipt still finds its recipient.
func TestOnlySendsWithUnkeyedReceiptsAreIndexedByMessageID(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	seedCrowd(t, db, 3)
	addCodes(t, db, "keyed", 3)
	store := campaign.NewStore(db)
	a, err := (&campaign.Planner{Engine: db, Audience: db}).Plan(ctx, crowdSpec("keyed", "keyed", 3))
	if err != nil {
		t.Fatal(err)
	}
	const keyed, unkeyed = "u00001", "u00002"
	if moved, err := store.Record(ctx, a.ID, []campaign.Outcome{
		{UserID: keyed, Status: campaign.StatusSent, MessageID: "SMkeyed", Segments: 1, ReceiptKeyed: true},
		{UserID: unkeyed, Status: campaign.StatusSent, MessageID: "SMunkeyed", Segments: 1},
	}, campaign.Lease{Batch: 0}, nil); err != nil || moved[campaign.StatusSent] != 2 {
		t.Fatalf("record: %v, %v", moved, err)
	}
	for user, want := range map[string]bool{keyed: true, unkeyed: false} {
		var got bool
		if err := db.QueryRow(ctx, `SELECT receipt_keyed FROM send_log WHERE campaign_id = $1 AND user_id = $2 AND status = 'sent'`,
			a.ID, user).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s's audit entry: receipt_keyed %v, want %v", user, got, want)
		}
	}
	// The index holds the unkeyed send's entry only (its predicate), and is what finds it.
	var indexed int64
	if err := db.QueryRow(ctx, `SELECT count(*) FROM send_log WHERE campaign_id = $1
		AND provider_message_id IS NOT NULL AND NOT receipt_keyed`, a.ID).Scan(&indexed); err != nil {
		t.Fatal(err)
	}
	if indexed != 1 {
		t.Errorf("%d audit entries of the campaign fall under the message-ID index, want 1 (the unkeyed send's)", indexed)
	}
	n, err := changed(store.RecordDeliveries(ctx, []campaign.Delivery{
		{Provider: "twilio", MessageID: "SMunkeyed", Status: "delivered"},
		{Provider: "twilio", MessageID: "SMkeyed", CampaignID: a.ID, UserID: keyed, Status: "delivered"},
	}))
	if err != nil || n != 2 {
		t.Fatalf("receipts changed %d recipients (%v), want 2: the one by message ID alone and the one by its keys", n, err)
	}
}

// A completion that commits just before resume --resend-unknown moves the unknown recipients back to
// pending (a batch run ending, another resume) does not strand them: Resend runs the campaign again.
func TestResendAfterACompletionRunsTheCampaignAgain(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	seedCrowd(t, db, 4)
	addCodes(t, db, "p", 4)
	c := launchCrowd(t, db, "reopen", 4, 2)
	store := campaign.NewStore(db)
	recordBatch(t, store, c, 0, campaign.StatusUnknown)
	recordBatch(t, store, c, 1, campaign.StatusSent)
	unknown, err := store.Unknown(ctx, c.ID)
	if err != nil || len(unknown) != 2 {
		t.Fatalf("unknown %v (%v), want batch 0's two", unknown, err)
	}
	// The resume read the campaign running; the last batch run's check completes it first.
	if done, _, err := store.CloseBatch(ctx, c.ID, 1); err != nil || !done {
		t.Fatalf("close batch 1: completed %v (%v), want completed", done, err)
	}
	if n, err := store.Resend(ctx, c.ID, unknown); err != nil || n != 2 {
		t.Fatalf("resend moved %d (%v), want 2", n, err)
	}
	got, err := store.Get(ctx, c.ID)
	if err != nil || got.State != campaign.StateRunning || got.FinishedAt != nil {
		t.Fatalf("campaign after the resend: %+v (%v), want running again", got, err)
	}
	if batches, err := store.PendingBatches(ctx, c.ID, false); err != nil || fmt.Sprint(batches) != "[0]" {
		t.Fatalf("pending batches %v (%v), want [0]", batches, err)
	}
}

// A frequency cap of 0 is none: a launch excludes nobody for a message another campaign sent, not even
// one sent while the launch plans. Before, the cap's window was "since now() minus 0 s", and now() is when
// the launch's transaction began: everyone another running campaign sent to during the planning was
// excluded (13,019 of 424,500 in an outside check).
func TestAFrequencyCapOfZeroExcludesNobody(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	seedCrowd(t, db, 4)
	addCodes(t, db, "p", 4)
	rep := launchCrowd(t, db, "first", 4, 4)
	outs := []campaign.Outcome{{UserID: "u00001", Status: campaign.StatusSent, MessageID: "SM1"}, {UserID: "u00002", Status: campaign.StatusSent, MessageID: "SM2"}}
	if _, err := campaign.NewStore(db).Record(ctx, rep.ID, outs, campaign.Lease{Batch: 0}, nil); err != nil {
		t.Fatal(err)
	}
	// Sent while the second launch plans: after its transaction began.
	mustExec(t, db, `UPDATE campaign_recipients SET sent_at = now() + interval '2 seconds' WHERE campaign_id = $1 AND status = 'sent'`, rep.ID)
	mustExec(t, db, `UPDATE send_log SET at = now() + interval '2 seconds' WHERE campaign_id = $1 AND status = 'sent'`, rep.ID)

	addCodes(t, db, "p", 4)
	second := crowdSpec("second", "p", 4)
	second.FrequencyCap = 0
	rep2, err := (&campaign.Planner{Engine: db, Audience: db}).Plan(ctx, second)
	if err != nil {
		t.Fatal(err)
	}
	if got := rep2.Excluded[campaign.ReasonFrequencyCap]; got != 0 || rep2.Eligible != 4 {
		t.Fatalf("a launch with a cap of 0: %d capped, %d eligible; want none capped, all 4 eligible", got, rep2.Eligible)
	}
	// With a cap, the same sends count.
	addCodes(t, db, "p", 4)
	capped := crowdSpec("third", "p", 4)
	capped.FrequencyCap = time.Hour
	rep3, err := (&campaign.Planner{Engine: db, Audience: db}).Plan(ctx, capped)
	if err != nil {
		t.Fatal(err)
	}
	if got := rep3.Excluded[campaign.ReasonFrequencyCap]; got != 2 {
		t.Fatalf("a launch with a cap of 1 h: %d capped, want the 2 sent", got)
	}
}

// The frequency cap is about commercial messages: a transactional campaign's sends hold back no later
// launch (nor the marks a Redis that lost its data gets back), and a transactional launch is held back by
// no promotion. Before, an order notice excluded the next promotion for a day, and the reverse.
func TestTransactionalSendsAreOutsideTheFrequencyCap(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	seedCrowd(t, db, 4)
	addCodes(t, db, "p", 4)
	plan := func(name string, transactional bool) campaign.Report {
		t.Helper()
		sp := crowdSpec(name, "p", 4)
		sp.FrequencyCap = time.Hour
		if transactional {
			sp.CodePool, sp.Transactional, sp.Message = "", true, `Merhaba {{.first_name}}, siparişiniz yolda`
		}
		rep, err := (&campaign.Planner{Engine: db, Audience: db}).Plan(ctx, sp)
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	send := func(id int64, users ...string) {
		t.Helper()
		var outs []campaign.Outcome
		for _, u := range users {
			outs = append(outs, campaign.Outcome{UserID: u, Status: campaign.StatusSent, MessageID: "SM-" + u})
		}
		if _, err := campaign.NewStore(db).Record(ctx, id, outs, campaign.Lease{Batch: 0}, nil); err != nil {
			t.Fatal(err)
		}
	}
	notice := plan("notice", true)
	send(notice.ID, "u00001", "u00002")
	promo := plan("promo", false)
	if got := promo.Excluded[campaign.ReasonFrequencyCap]; got != 0 || promo.Eligible != 4 {
		t.Errorf("a promotion after an order notice: %d capped, %d eligible; want all 4 eligible", got, promo.Eligible)
	}
	var marks []string
	if _, err := campaign.NewStore(db).RecentSends(ctx, func(rs campaign.RecentSend) error {
		marks = append(marks, fmt.Sprint(rs.CampaignID))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(marks) != 0 {
		t.Errorf("the marks a Redis that lost its data gets back come from campaigns %v; want none from the notice", marks)
	}
	send(promo.ID, "u00003")
	second := plan("notice-2", true)
	if got := second.Excluded[campaign.ReasonFrequencyCap]; got != 0 || second.Eligible != 4 {
		t.Errorf("an order notice after a promotion: %d capped, %d eligible; want all 4 eligible", got, second.Eligible)
	}
}
