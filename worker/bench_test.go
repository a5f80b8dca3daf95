package worker

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
)

// Benchmarks of the send path's hot spots against the local Postgres and Redis (no provider: the
// scripted one answers at once). Run them with
//
//	go test ./worker -run '^$' -bench . -benchtime 2s
//
// scripts/bench.sh measures the whole engine with the sandbox and real worker processes.

// benchPlan plans n customers (about half are eligible, see planWith) in batches of 500, as launches do.
// benchBatchSize is the batch size of the benchmarks' campaigns, as a launch makes them.
const benchBatchSize = 500

func benchPlan(b *testing.B, n int) (*fixture, *campaign.Campaign, []campaign.Recipient) {
	b.Helper()
	f := planWith(b, n, func(s *campaign.Spec) { s.BatchSize = benchBatchSize })
	c, all := f.benchRecipients(b)
	return f, c, all
}

// benchAgain launches another campaign of f's audience in f's database, with a pool's worth of new codes,
// and makes it f's campaign: a benchmark that has used up a plan goes on in the same database and Redis DB
// rather than leasing new ones (there are 15 Redis DBs for every test process on the machine).
func (f *fixture) benchAgain(b *testing.B, round int) (*campaign.Campaign, []campaign.Recipient) {
	b.Helper()
	ctx := context.Background()
	if _, err := f.db.Exec(ctx, `INSERT INTO promo_codes (pool, code)
		SELECT 'p', $1 || i FROM generate_series(1, (SELECT count(*) FROM customers)) i`, fmt.Sprintf("R%d-", round)); err != nil {
		b.Fatal(err)
	}
	spec := fixtureSpec(fmt.Sprint("again-", round))
	spec.BatchSize = benchBatchSize
	rep, err := (&campaign.Planner{Engine: f.db, Audience: f.db}).Plan(ctx, spec)
	if err != nil {
		b.Fatal(err)
	}
	f.id, f.batches = rep.ID, rep.Batches
	return f.benchRecipients(b)
}

// benchRecipients reads f's campaign and its recipients, batch by batch.
func (f *fixture) benchRecipients(b *testing.B) (*campaign.Campaign, []campaign.Recipient) {
	b.Helper()
	ctx := context.Background()
	c, err := f.store.Get(ctx, f.id)
	if err != nil {
		b.Fatal(err)
	}
	var all []campaign.Recipient
	for batch := 0; batch < f.batches; batch++ {
		rs, err := f.store.LoadBatch(ctx, f.id, batch)
		if err != nil {
			b.Fatal(err)
		}
		all = append(all, rs...)
	}
	return c, all
}

// BenchmarkRunBatch runs whole batches of 500 through RunBatch with a provider that answers at once: the
// engine's own cost per recipient (chunk leases and consent reads, one claim script per message, outcome
// writes, counters).
func BenchmarkRunBatch(b *testing.B) {
	f, _, all := benchPlan(b, 40000)
	ctx := context.Background()
	batch, sent, rounds := 0, 0, 0
	var pgCPU time.Duration // the Postgres backends' CPU while batches ran (clock ticks: read it over many)
	for b.Loop() {
		if batch == f.batches {
			b.StopTimer()
			rounds++
			f.benchAgain(b, rounds)
			batch = 0
			b.StartTimer()
		}
		before := f.provider.total()
		b.StopTimer()
		cpu0 := backendCPU(b, f.db)
		b.StartTimer()
		if err := f.h.RunBatch(ctx, f.id, batch); err != nil {
			b.Fatalf("batch %d: %v", batch, err)
		}
		b.StopTimer()
		pgCPU += backendCPU(b, f.db) - cpu0
		b.StartTimer()
		sent += f.provider.total() - before
		batch++
	}
	if sent == 0 || len(all) == 0 {
		b.Fatal("nothing sent")
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(sent), "ns/recipient")
	b.ReportMetric(float64(pgCPU.Nanoseconds())/float64(sent), "pg-cpu-ns/recipient")
}

// BenchmarkClaimSend takes one recipient's claim and frequency mark while writing the previous send's
// answer: the one Redis round trip an SMS costs.
func BenchmarkClaimSend(b *testing.B) {
	f, c, all := benchPlan(b, 2000)
	ctx := context.Background()
	epoch, err := Epoch(ctx, f.rdb)
	if err != nil {
		b.Fatal(err)
	}
	g := state.Guard{Epoch: epoch, Halt: HaltKey(c.ID), CheckHalt: true}
	nonce := Nonce(c)
	var prev *state.Answer
	i := 0
	for b.Loop() {
		r := all[i%len(all)]
		key := fmt.Sprintf("%s:%d", ClaimKey(c.ID, r.UserID), i/len(all)) // a fresh claim every time round
		mine := state.InFlightValue(time.Now(), "bench")
		cl, err := f.h.state.ClaimSend(ctx, c, nonce, state.SendClaim{Key: key, Value: mine, Addr: r.Address}, g, prev, "limiter:pause:provider:test", time.Now())
		if err != nil || cl.Result != state.Ours {
			b.Fatalf("claim %d: %+v %v", i, cl, err)
		}
		prev = &state.Answer{Key: key, InFlight: mine, Value: state.SentValue("SM0123456789abcdef0123456789abcdef", 1)}
		i++
	}
}

// BenchmarkLeaseAndRecord leases chunks of 100 recipients (state, consents, consent snapshots) and records
// their outcomes as sent: the Postgres statements of one chunk. The figure to read is ns/recipient. With
// consents-changed, a consent changed after the launch (an İYS sync, a refusal), so each lease reads every
// recipient's consent again: the cost of checking consent at send time, beside the usual case where none
// changed and the launch's reading stands.
//
// The floor-* cases write the outcomes with bare statements instead of Record, to show how far Record is
// from the least any per-recipient record costs in this data model: floor-update-and-log updates each
// recipient's row (status, message ID, times, attempts) and appends its audit row, floor-update only
// updates the row. Compare their record-ns/recipient with consents-unchanged's.
func BenchmarkLeaseAndRecord(b *testing.B) {
	b.Run("consents-unchanged", func(b *testing.B) { benchLeaseAndRecord(b, false, recordOutcomes) })
	b.Run("consents-changed", func(b *testing.B) { benchLeaseAndRecord(b, true, recordOutcomes) })
	b.Run("floor-update-and-log", func(b *testing.B) { benchLeaseAndRecord(b, false, bareWrite(floorUpdateAndLog)) })
	b.Run("floor-update", func(b *testing.B) { benchLeaseAndRecord(b, false, bareWrite(floorUpdate)) })
}

// chunkWriter writes the outcomes (all sent) of a leased chunk of campaign c.
type chunkWriter func(ctx context.Context, f *fixture, c *campaign.Campaign, l campaign.Lease, outs []campaign.Outcome) error

func recordOutcomes(ctx context.Context, f *fixture, c *campaign.Campaign, l campaign.Lease, outs []campaign.Outcome) error {
	moved, err := f.store.Record(ctx, c.ID, outs, l, nil)
	if err == nil && moved[campaign.StatusSent] != int64(len(outs)) {
		err = fmt.Errorf("%v moved, not %d sent", moved, len(outs))
	}
	return err
}

// The bare statements of the floor-* cases: $1 the campaign, $2 the users, $3 their message IDs, $4 the batch.
const (
	floorUpdate = `WITH o AS (SELECT * FROM unnest($2::text[], $3::text[]) AS o(user_id, msgid))
		UPDATE campaign_recipients r SET status = 'sent', provider_message_id = o.msgid, sent_at = now(), updated_at = now(),
			attempts = r.attempts + 1
		FROM o WHERE r.campaign_id = $1 AND r.batch = $4 AND r.status = 'pending' AND r.user_id = o.user_id`
	floorUpdateAndLog = `WITH o AS (SELECT * FROM unnest($2::text[], $3::text[]) AS o(user_id, msgid)),
		upd AS (UPDATE campaign_recipients r SET status = 'sent', provider_message_id = o.msgid, sent_at = now(), updated_at = now(),
				attempts = r.attempts + 1
			FROM o WHERE r.campaign_id = $1 AND r.batch = $4 AND r.status = 'pending' AND r.user_id = o.user_id
			RETURNING r.user_id, r.status, r.provider_message_id)
		INSERT INTO send_log (campaign_id, user_id, status, provider_message_id, channel)
		SELECT $1, user_id, status, provider_message_id, 'sms' FROM upd`
)

func bareWrite(query string) chunkWriter {
	return func(ctx context.Context, f *fixture, c *campaign.Campaign, l campaign.Lease, outs []campaign.Outcome) error {
		users, ids := make([]string, len(outs)), make([]string, len(outs))
		for i, o := range outs {
			users[i], ids[i] = o.UserID, o.MessageID
		}
		tag, err := f.db.Exec(ctx, query, c.ID, users, ids, l.Batch)
		if err == nil && tag.RowsAffected() != int64(len(outs)) {
			err = fmt.Errorf("%d rows written, not %d", tag.RowsAffected(), len(outs))
		}
		return err
	}
}

func benchLeaseAndRecord(b *testing.B, consentsChanged bool, write chunkWriter) {
	const chunk = 100
	ctx := context.Background()
	var f *fixture
	var c *campaign.Campaign
	var all []campaign.Recipient
	next := 0
	recorded := 0
	var leaseTime, recordTime time.Duration
	var pgCPU time.Duration
	var cpuFrom time.Duration
	token := state.Token()
	rounds := 0
	for b.Loop() {
		if next+chunk > len(all) {
			b.StopTimer()
			if f == nil {
				f, c, all = benchPlan(b, 20000)
			} else {
				pgCPU += backendCPU(b, f.db) - cpuFrom
				rounds++
				c, all = f.benchAgain(b, rounds)
			}
			if consentsChanged {
				if _, err := f.db.Exec(ctx, `UPDATE iys_consents_version SET version = version + 1`); err != nil {
					b.Fatal(err)
				}
			}
			next = 0
			cpuFrom = backendCPU(b, f.db)
			b.StartTimer()
		}
		rs := all[next : next+chunk]
		batch := next / benchBatchSize // chunks never straddle a batch: benchBatchSize is a multiple of chunk
		next += chunk
		users := make([]string, len(rs))
		for i, r := range rs {
			users[i] = r.UserID
		}
		l := campaign.Lease{Batch: batch, Token: token, Epoch: "bench", TTL: time.Minute} // one run, chunk after chunk
		t0 := time.Now()
		got, err := f.store.LeaseChunk(ctx, c, users, l)
		leaseTime += time.Since(t0)
		if err != nil || len(got.Leased) != len(rs) {
			b.Fatalf("lease: %d of %d leased, %v", len(got.Leased), len(rs), err)
		}
		outs := make([]campaign.Outcome, len(rs))
		for i, u := range users {
			outs[i] = campaign.Outcome{UserID: u, Status: campaign.StatusSent, MessageID: "SM" + u, Segments: 1}
		}
		t0 = time.Now()
		err = write(ctx, f, c, l, outs)
		recordTime += time.Since(t0)
		if err != nil {
			b.Fatalf("record: %v", err)
		}
		recorded += len(rs)
	}
	pgCPU += backendCPU(b, f.db) - cpuFrom
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(recorded), "ns/recipient")
	b.ReportMetric(float64(leaseTime.Nanoseconds())/float64(recorded), "lease-ns/recipient")
	b.ReportMetric(float64(recordTime.Nanoseconds())/float64(recorded), "record-ns/recipient")
	b.ReportMetric(float64(pgCPU.Nanoseconds())/float64(recorded), "pg-cpu-ns/recipient")
}

// backendCPU is the CPU time the Postgres backends serving db's database have used so far (user and
// system, from /proc: the server must run on this machine). Unlike wall time, the backends' own CPU
// hardly moves with other work on the machine.
func backendCPU(b *testing.B, db *pgxpool.Pool) time.Duration {
	b.Helper()
	rows, err := db.Query(context.Background(), `SELECT pid FROM pg_stat_activity WHERE datname = current_database()`)
	if err != nil {
		b.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		b.Fatal(err)
	}
	var total time.Duration
	for _, pid := range pids {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue // gone since
		}
		// The fields after the command name (which may hold spaces) in parentheses; utime and stime are
		// the 14th and 15th of the whole line.
		f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
		utime, _ := strconv.ParseInt(f[11], 10, 64)
		stime, _ := strconv.ParseInt(f[12], 10, 64)
		total += time.Duration(utime+stime) * time.Second / clockTicks
	}
	return total
}

// clockTicks is the kernel's USER_HZ, the unit of /proc's CPU times (100 on Linux).
const clockTicks = 100
