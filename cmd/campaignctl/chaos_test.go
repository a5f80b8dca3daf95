package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/providers/sandbox"
)

// TestChaos is the proof of crash-safe delivery, run with the built binary. A campaign
// of CHAOS_RECIPIENTS eligible recipients (default 1500; scripts/chaos.sh runs 20,000) is sent by three
// worker processes through the sandbox, which answers 5 % 503 and 2 % 429, while the test
//
//   - SIGKILLs a random worker every 1–2 s and starts a replacement at once,
//   - freezes the test's private Redis (SIGSTOP) for 3 s,
//   - then empties that Redis (FLUSHALL: queues, claims, counters) and runs `campaignctl resume`,
//
// and waits until nothing is pending. Then, from the provider's side (the sandbox's log) and from
// Postgres: nobody got two messages, every `sent` recipient was accepted with their code, everyone the
// provider never accepted is `unknown` or `failed` with the provider's reason (nobody lost, nobody still
// pending), unknown is at most 1 % of the plan, nothing was accepted while Redis was frozen, and no code
// went to two numbers.
func TestChaos(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("chaos run skipped in -short mode")
	}
	n := chaosRecipients(t)
	began := time.Now()
	rate := max(50, n/15)      // TWILIO_RATE: 15 s at full speed at least (the 429 pauses slow it more)
	minKills := max(6, n/1000) // SIGKILLs before the flush: 6 at the default size, 20 at 20,000
	const freezeFor = 3 * time.Second
	// sweepGap bounds the wait for the sweep of the last killed worker's chunks: its liveness lock found
	// missing for 3 s, or its lease (3 × --provider-timeout 1s) expired, a sweep interval (1 s) and a margin.
	const sweepGap = 3*time.Second + time.Second + 2*time.Second

	db, dbURL := testdb.New(t)
	rs := testredis.StartServer(t)
	sandboxAddr := freeAddr(t)
	e := &e2eEnv{t: t, bin: binary(t), env: append(os.Environ(),
		"DATABASE_URL="+dbURL, "REDIS_URL="+rs.URL(),
		"TWILIO_ACCOUNT_SID=ACchaos000000000000000000000000000", "TWILIO_AUTH_TOKEN=chaostoken", "TWILIO_FROM=+905550000000",
		"TWILIO_BASE_URL=http://"+sandboxAddr, fmt.Sprintf("TWILIO_RATE=%d", rate), "SENDER_IDENTITY="+testSender,
	)}

	e.mustRun("migrate")
	users := chaosUsersFor(n)
	e.mustRun("demo", "seed", "--users", strconv.Itoa(users), "--pool", "demo")
	audience := filepath.Join(t.TempDir(), "audience.sql")
	if err := os.WriteFile(audience, []byte("SELECT user_id, phone, first_name FROM customers"), 0o600); err != nil {
		t.Fatal(err)
	}

	e.start("sandbox", "sandbox", "--addr", sandboxAddr, "--fail-503", "0.05", "--fail-429", "0.02")
	waitFor(t, 10*time.Second, func() bool {
		resp, err := http.Get("http://" + sandboxAddr + "/_sandbox/stats")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	chaosCheckFaults(t, sandboxAddr)

	workerArgs := []string{"worker", "--concurrency", "4"}
	if out, errs, _, _ := chaosExec(e, 30*time.Second, "worker", "--help"); strings.Contains(out+errs, "--provider-timeout") {
		workerArgs = append(workerArgs, "--provider-timeout", "1s")
	} else {
		t.Logf("NOTE: this campaignctl worker has no --provider-timeout flag yet; the workers run without it")
	}
	workers := newChaosWorkers(t, e, workerArgs)
	for range 3 {
		workers.start()
	}

	out := e.mustRun("launch", "--name", "chaos", "--channel", "sms", "--audience", audience, "--code-pool", "demo",
		"--message", testPrefix+"Merhaba {{.first_name}}, kodunuz {{.code}}", "--frequency-cap", "0", "--yes", "--json")
	var rep struct {
		ID       int64 `json:"id"`
		Eligible int64 `json:"eligible"`
		Batches  int   `json:"batches"`
		Enqueued int   `json:"enqueued"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.ID == 0 {
		t.Fatalf("launch --json: %v\n%s", err, out)
	}
	if rep.Eligible != int64(n) {
		t.Logf("NOTE: %d eligible, not the %d asked for: the demo seed rules changed (see chaosUsersFor)", rep.Eligible, n)
	}
	id := strconv.FormatInt(rep.ID, 10)
	t.Logf("campaign %s: %d users seeded, %d eligible, %d batches enqueued; TWILIO_RATE=%d/s; workers %v",
		id, users, rep.Eligible, rep.Enqueued, rate, workerArgs[1:])

	// The chaos: kills every 1–2 s, a freeze as soon as messages flow, then FLUSHALL and resume. Kills
	// stop at the flush: a batch whose worker was SIGKILLed after it waits for Asynq's lease to expire
	// (a minute or more), which would only slow the run, while the flush hands every batch back at once.
	// The deadline allows for the sandbox's 2 % 429s, each of which pauses every worker for a
	// second: throughput stays well below TWILIO_RATE (about 30/s here).
	// Progress is read from the sandbox (what was accepted, at once) and from status (what is recorded).
	hardStop := chaosDeadline(t, 2*time.Minute+time.Duration(n)*50*time.Millisecond)
	var (
		t0, t1        time.Time
		frozeDone     bool
		nextKill      = time.Now().Add(chaosInterval())
		st            chaosStatus
		lastPoll      time.Time
		accepted      int
		lastFlow      time.Time // when the sandbox's accepted count last grew
		finishedEarly bool
	)
	for {
		if time.Now().After(hardStop) {
			t.Fatalf("harness: the chaos phase did not end before the deadline (kills %d, frozen %v)", workers.kills, frozeDone)
		}
		workers.reap()
		if a, err := chaosAccepted(sandboxAddr); err == nil && a > accepted {
			accepted, lastFlow = a, time.Now()
		}
		if time.Since(lastPoll) >= time.Second {
			lastPoll = time.Now()
			if s, err := chaosStatusOf(e, id); err == nil {
				st = s
				if st.Planned > 0 && st.Pending == 0 {
					finishedEarly = true
					break
				}
			}
		}
		progress := float64(accepted) / float64(max(1, rep.Eligible))
		flowing := time.Since(lastFlow) < 300*time.Millisecond
		switch {
		case !frozeDone && (flowing || workers.kills >= minKills/2) && time.Since(workers.lastStart) >= time.Second:
			// Frozen while messages flow, so that the check means something; and a second after the last
			// replacement started, so that the freeze does not catch it at birth.
			rs.Freeze()
			t0 = time.Now() // first instant Redis is known frozen
			time.Sleep(freezeFor)
			t1 = time.Now() // last instant Redis is known frozen
			rs.Thaw()
			frozeDone = true
			t.Logf("Redis frozen from %s to %s (after %d kills, %d accepted so far)", t0.Format("15:04:05.000"), t1.Format("15:04:05.000"), workers.kills, accepted)
			nextKill = time.Now().Add(chaosInterval())
			continue
		case frozeDone && (workers.kills >= minKills || progress >= 0.8):
		case time.Now().After(nextKill):
			workers.killRandom()
			nextKill = time.Now().Add(chaosInterval())
			continue
		default:
			time.Sleep(100 * time.Millisecond)
			continue
		}
		break
	}
	if finishedEarly {
		t.Errorf("harness: the campaign finished before the chaos was complete (kills %d of %d, frozen %v, no flush): lower TWILIO_RATE or raise CHAOS_RECIPIENTS", workers.kills, minKills, frozeDone)
	} else {
		// The workers' sweepers settle a killed worker's chunk from its claims once its liveness lock has
		// been missing for 3 s (or its lease expired). A worker killed within those few seconds before Redis
		// loses its data leaves its chunks unknown (up to 25 recipients per batch it was sending): a double
		// fault the runbook describes. The flush waits until they are swept, as the scenario has it: kills,
		// then Redis lost; a fixed wait let a fast campaign end before the flush.
		// Half a second first: the session of a worker just killed takes a moment to end.
		time.Sleep(time.Until(workers.lastKill.Add(500 * time.Millisecond)))
		for end := workers.lastKill.Add(sweepGap); time.Now().Before(end) && chaosDeadChunks(t, db) > 0; {
			time.Sleep(50 * time.Millisecond)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := rs.Flush(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("Redis emptied (FLUSHALL) after %d kills; the sandbox had accepted %d, status said %d of %d pending", workers.kills, accepted, st.Pending, st.Planned)
		chaosResume(t, e, id)
	}

	// Drain: wait for nothing pending; a stall gets another (idempotent) resume.
	const stallAfter = 30 * time.Second
	lastPending, lastChange, resumes := int64(-1), time.Now(), 1
	for {
		workers.reap()
		s, err := chaosStatusOf(e, id)
		if err == nil {
			st = s
			if st.Pending == 0 {
				break
			}
			if st.Pending != lastPending {
				lastPending, lastChange = st.Pending, time.Now()
			}
		}
		if time.Now().After(hardStop) {
			t.Errorf("still %d of %d pending at the deadline (%v after the start); last status: %+v (err %v)",
				st.Pending, st.Planned, time.Since(began).Round(time.Second), st, err)
			break
		}
		if time.Since(lastChange) >= stallAfter {
			t.Logf("no progress for %v (%d pending): resume again", stallAfter, st.Pending)
			chaosResume(t, e, id)
			resumes++
			lastChange = time.Now()
		}
		time.Sleep(time.Second)
	}
	workers.stop()
	if out, errs, code, err := chaosExec(e, 30*time.Second, "status", id, "--json"); err == nil {
		t.Logf("final status (exit %d): %s%s", code, strings.TrimSpace(out), strings.TrimSpace(errs))
	}

	// What the provider accepted, and what Postgres says.
	msgs := chaosSandboxMessages(t, sandboxAddr)
	recips := chaosRecipientsOf(t, db, rep.ID)
	var freezes []chaosWindow
	if frozeDone {
		freezes = append(freezes, chaosWindow{from: t0, to: t1})
	}
	chaosCheck(t, chaosRun{n: n, msgs: msgs, recips: recips, freezes: freezes, unknownLimit: true,
		history: chaosHistoryOf(t, db, rep.ID, chaosDuplicateUsers(msgs, recips)),
		kills:   workers.kills, selfExits: len(workers.exits), resumes: resumes, began: began})
}

// chaosRecipients reads CHAOS_RECIPIENTS (default 1500).
func chaosRecipients(t *testing.T) int {
	v := os.Getenv("CHAOS_RECIPIENTS")
	if v == "" {
		return 1500
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 100 {
		t.Fatalf("CHAOS_RECIPIENTS=%q: give a number of recipients, at least 100", v)
	}
	return n
}

// chaosUsersFor is the number of demo customers whose seed has at least eligible SMS recipients: by the
// rules in internal/demo, user k has ONAY when k%100 < 85, and user k%1000 == 501 shares the phone of
// the user before (one of the two is excluded as a duplicate address).
func chaosUsersFor(eligible int) int {
	users, got := 0, 0
	for ; got < eligible; users++ {
		if users%100 < 85 && users%1000 != 501 {
			got++
		}
	}
	return users
}

func chaosInterval() time.Duration { return time.Second + rand.N(time.Second) }

// chaosDeadline is now+d, or a minute before go test's -timeout would panic (and skip every cleanup).
func chaosDeadline(t *testing.T, d time.Duration) time.Time {
	end := time.Now().Add(d)
	if td, ok := t.Deadline(); ok && td.Add(-time.Minute).Before(end) {
		end = td.Add(-time.Minute)
	}
	return end
}

// chaosExec runs a campaignctl command that must end within d; unlike e2eEnv.run it never fails the test,
// so that it can be used while Redis is frozen or gone.
func chaosExec(e *e2eEnv, d time.Duration, args ...string) (stdout, stderr string, code int, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.bin, args...)
	cmd.Env = e.env
	cmd.WaitDelay = 5 * time.Second
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	code = -1
	if cmd.ProcessState != nil {
		code = cmd.ProcessState.ExitCode()
	}
	if _, ok := err.(*exec.ExitError); ok && code > 0 {
		err = nil
	}
	return out.String(), errb.String(), code, err
}

// chaosStatus is the part of `status --json` the chaos test reads.
type chaosStatus struct {
	State   string `json:"state"`
	Planned int64  `json:"planned"`
	Pending int64  `json:"pending"`
	Sent    int64  `json:"sent"`
	Failed  int64  `json:"failed"`
	Skipped int64  `json:"skipped"`
	Unknown int64  `json:"unknown"`
	DLQ     int64  `json:"dlq"`
}

func chaosStatusOf(e *e2eEnv, id string) (chaosStatus, error) {
	out, errs, code, err := chaosExec(e, 15*time.Second, "status", id, "--json")
	if err != nil || code != 0 {
		return chaosStatus{}, fmt.Errorf("status: exit %d, %v: %s", code, err, strings.TrimSpace(errs))
	}
	var st chaosStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return chaosStatus{}, fmt.Errorf("status --json: %v: %s", err, out)
	}
	return st, nil
}

// chaosResume runs `resume ID`, which must succeed and say what it did.
func chaosResume(t *testing.T, e *e2eEnv, id string) {
	t.Helper()
	out, errs, code, err := chaosExec(e, time.Minute, "resume", id)
	switch {
	case err != nil || code != 0:
		t.Errorf("campaignctl resume %s: exit %d, %v\nstdout: %s\nstderr: %s", id, code, err, out, tail(errs, 2000))
	case strings.TrimSpace(out) == "":
		t.Errorf("campaignctl resume %s printed nothing on stdout; it must say what it found and did (stderr: %s)", id, tail(errs, 500))
	default:
		t.Logf("resume %s: %s", id, strings.TrimSpace(out))
	}
}

// chaosDeadChunks counts the chunks in hand of batch runs that died (their worker's liveness lock is gone,
// or their lease expired) and that no sweep has settled yet.
func chaosDeadChunks(t *testing.T, db *pgxpool.Pool) int {
	t.Helper()
	gone, err := campaign.NewStore(db).GoneHolders(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM campaign_batches
		WHERE lease_users <> '{}' AND (lease_until < now() OR lease_holder = ANY($1::bigint[]))`, gone).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// chaosCheckFaults makes sure the faults the sandbox was started with are in effect.
func chaosCheckFaults(t *testing.T, addr string) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + addr + "/_sandbox/faults")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var f sandbox.Faults
	if err := json.NewDecoder(resp.Body).Decode(&f); err != nil {
		t.Fatal(err)
	}
	if f.Rate503 != 0.05 || f.Rate429 != 0.02 {
		t.Fatalf("sandbox faults %+v, want 5%% 503 and 2%% 429", f)
	}
}

// chaosAccepted is the number of messages the sandbox accepted so far.
func chaosAccepted(addr string) (int, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/_sandbox/stats")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var st sandbox.Stats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return 0, err
	}
	return st.Accepted, nil
}

func chaosSandboxMessages(t *testing.T, addr string) []sandbox.Message {
	t.Helper()
	c := &http.Client{Timeout: time.Minute}
	resp, err := c.Get("http://" + addr + "/_sandbox/messages")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var msgs []sandbox.Message
	if err := json.NewDecoder(resp.Body).Decode(&msgs); err != nil {
		t.Fatal(err)
	}
	return msgs
}

type chaosRecipient struct {
	UserID, Address, Status, Code, Reason string
	// Delivery is what the receipts said ("" when none reached Postgres), DeliveryAt when.
	Delivery   string
	DeliveryAt time.Time
}

func chaosRecipientsOf(t *testing.T, db *pgxpool.Pool, id int64) []chaosRecipient {
	t.Helper()
	var out []chaosRecipient
	// The pool's connections may have been terminated by the test: a failed query is tried again.
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		if out, err = chaosQueryRecipients(db, id); err == nil {
			return out
		}
		time.Sleep(time.Second)
	}
	t.Fatal(err)
	return nil
}

func chaosQueryRecipients(db *pgxpool.Pool, id int64) ([]chaosRecipient, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rows, err := db.Query(ctx, `SELECT user_id, address, status, coalesce(code, ''), coalesce(reason, ''),
			coalesce(delivery, ''), coalesce(delivery_at, 'epoch')
		FROM campaign_recipients WHERE campaign_id = $1 ORDER BY user_id`, id)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []chaosRecipient
	for rows.Next() {
		var r chaosRecipient
		if err := rows.Scan(&r.UserID, &r.Address, &r.Status, &r.Code, &r.Reason, &r.Delivery, &r.DeliveryAt); err != nil {
			return nil, err
		}
		if r.Delivery == "" {
			r.DeliveryAt = time.Time{}
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// chaosLogEntry is one line of a recipient's audit (send_log): every outcome, lease settlement and resend.
type chaosLogEntry struct {
	Status, Reason, MessageID string
	At                        time.Time
}

func (e chaosLogEntry) String() string {
	s := e.At.Local().Format("15:04:05.000") + " " + e.Status
	if e.Reason != "" {
		s += " (" + e.Reason + ")"
	}
	if e.MessageID != "" {
		s += " " + e.MessageID
	}
	return s
}

// chaosHistoryOf returns the audit of the given users of campaign id, oldest first.
func chaosHistoryOf(t *testing.T, db *pgxpool.Pool, id int64, users []string) map[string][]chaosLogEntry {
	t.Helper()
	if len(users) == 0 {
		return nil
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		out, err := func() (map[string][]chaosLogEntry, error) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			rows, err := db.Query(ctx, `SELECT user_id, status, coalesce(reason, ''), coalesce(provider_message_id, ''), at
				FROM send_log WHERE campaign_id = $1 AND user_id = ANY($2) ORDER BY id`, id, users)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			out := map[string][]chaosLogEntry{}
			for rows.Next() {
				var u string
				var e chaosLogEntry
				if err := rows.Scan(&u, &e.Status, &e.Reason, &e.MessageID, &e.At); err != nil {
					return nil, err
				}
				out[u] = append(out[u], e)
			}
			return out, rows.Err()
		}()
		if err == nil {
			return out
		}
		lastErr = err
		time.Sleep(time.Second)
	}
	t.Fatal(lastErr)
	return nil
}

// chaosDuplicateUsers lists the planned users whose number the provider accepted more than once.
func chaosDuplicateUsers(msgs []sandbox.Message, recips []chaosRecipient) []string {
	count := map[string]int{}
	for _, m := range msgs {
		count[m.To]++
	}
	var out []string
	for _, rc := range recips {
		if count[rc.Address] > 1 {
			out = append(out, rc.UserID)
		}
	}
	return out
}

// chaosWindow is a span during which Redis was known frozen.
type chaosWindow struct{ from, to time.Time }

type chaosRun struct {
	n       int
	msgs    []sandbox.Message
	recips  []chaosRecipient
	freezes []chaosWindow
	// unknownLimit holds unknown to 1 % of the plan (the fixed scenario; a random schedule's held answers
	// and resets may make more).
	unknownLimit bool
	// history is the audit of every duplicated recipient, by user.
	history map[string][]chaosLogEntry
	// resends are the `resume --resend-unknown` runs, with the claims seen just before each.
	resends []*chaosResend
	// steps are the faults applied, as they were applied, for the reports.
	steps                     []chaosApplied
	kills, selfExits, resumes int
	began                     time.Time
}

// chaosResend is one `resume --resend-unknown` run.
type chaosResend struct {
	start, end time.Time
	// claims are the campaign's claims (user → value without its nonce) read just before the command ran.
	claims map[string]string
	out    string
}

// chaosApplied is one schedule step as it was applied.
type chaosApplied struct {
	at   time.Time
	what string
}

// chaosCheck asserts the invariants from the provider's log and Postgres, with up to ten examples each.
func chaosCheck(t *testing.T, r chaosRun) {
	t.Helper()
	const examples = 10
	report := func(what string, list []string) {
		t.Helper()
		if len(list) == 0 {
			return
		}
		t.Errorf("%s: %d, e.g.\n  %s", what, len(list), strings.Join(list[:min(len(list), examples)], "\n  "))
	}
	perTo := map[string][]sandbox.Message{}
	for _, m := range r.msgs {
		perTo[m.To] = append(perTo[m.To], m)
	}
	planned := map[string]chaosRecipient{}
	count := map[string]int{}
	for _, rc := range r.recips {
		planned[rc.Address] = rc
		count[rc.Status]++
	}

	// a. Nobody got two messages; nobody outside the plan got one. The one exception is the documented
	//    cost of `resume --resend-unknown`: an unknown recipient the provider had in fact accepted, resent
	//    while nothing (no receipt that reached the receiver, no sent outcome, no sent claim) said so.
	var dups, costs, strangers, briefs []string
	classes := map[string]int{}
	extra := 0
	for to, ms := range perTo {
		if len(ms) > 1 {
			extra += len(ms) - 1
			rc := planned[to]
			v := chaosJudge(ms, r.history[rc.UserID], r.resends, rc.UserID)
			line := chaosDuplicateReport(to, rc, ms, r, v.why)
			if v.cost {
				costs = append(costs, line)
			} else {
				dups = append(dups, line)
			}
			classes[v.class]++
			briefs = append(briefs, fmt.Sprintf("%s %s: PG %s, delivery %q; %s", rc.UserID, to, rc.Status, rc.Delivery, v.class))
		}
		if _, ok := planned[to]; !ok {
			strangers = append(strangers, fmt.Sprintf("%s accepted %d times, not in the plan", to, len(ms)))
		}
	}
	sort.Strings(dups)
	sort.Strings(costs)
	report(fmt.Sprintf("a. recipients accepted more than once by the provider (%d extra messages in all, %d recipients resent without evidence counted apart)", extra, len(costs)), dups)
	if len(costs) > 0 {
		t.Logf("a'. %d recipients accepted twice because `resume --resend-unknown` resent them while no evidence of the first acceptance existed (the documented cost of --resend-unknown, not a double send by the engine), e.g.\n  %s",
			len(costs), strings.Join(costs[:min(len(costs), examples)], "\n  "))
	}
	report("a. messages to numbers outside the plan", strangers)
	if len(briefs) > 0 {
		var tally []string
		for c, k := range classes {
			tally = append(tally, fmt.Sprintf("%5d  %s", k, c))
		}
		sort.Sort(sort.Reverse(sort.StringSlice(tally)))
		sort.Strings(briefs)
		const most = 200
		t.Logf("duplicates by kind:\n%s\nevery duplicate (up to %d):\n  %s", strings.Join(tally, "\n"), most, strings.Join(briefs[:min(len(briefs), most)], "\n  "))
	}

	// b. Every `sent` was accepted, with its code in the body.
	// c. Everyone never accepted is unknown, or failed with the provider's reason; nobody is pending; and
	//    nobody who was accepted is recorded failed or skipped (their code would go back to the pool).
	var sentNotAccepted, lostOrWrong, acceptedButNot, pending []string
	for _, rc := range r.recips {
		ms := perTo[rc.Address]
		switch {
		case rc.Status == "pending":
			pending = append(pending, fmt.Sprintf("%s %s pending (accepted %d times)", rc.UserID, rc.Address, len(ms)))
		case rc.Status == "sent":
			ok := false
			for _, m := range ms {
				ok = ok || (rc.Code != "" && strings.Contains(m.Body, rc.Code))
			}
			if !ok {
				sentNotAccepted = append(sentNotAccepted, fmt.Sprintf("%s %s sent with code %q, accepted %d times without it", rc.UserID, rc.Address, rc.Code, len(ms)))
			}
		case len(ms) == 0:
			if rc.Status != "unknown" && !(rc.Status == "failed" && strings.Contains(rc.Reason, "twilio")) {
				lostOrWrong = append(lostOrWrong, fmt.Sprintf("%s %s never accepted, PG status %s reason %q", rc.UserID, rc.Address, rc.Status, rc.Reason))
			}
		case rc.Status != "unknown":
			acceptedButNot = append(acceptedButNot, fmt.Sprintf("%s %s accepted at %s, PG status %s reason %q", rc.UserID, rc.Address, ms[0].At.Format("15:04:05.000"), rc.Status, rc.Reason))
		}
	}
	report("b. recipients `sent` in Postgres that the provider never accepted with their code", sentNotAccepted)
	report("c. recipients never accepted and not `unknown` nor `failed` with a provider reason", lostOrWrong)
	report("c. recipients accepted by the provider but recorded failed or skipped", acceptedButNot)
	report("c. recipients still pending", pending)

	// d. unknown ≤ 1 % of the plan.
	if unknown := count["unknown"]; r.unknownLimit && unknown*100 > len(r.recips) {
		t.Errorf("d. %d unknown of %d planned (%.2f%%), more than 1%%", unknown, len(r.recips), 100*float64(unknown)/float64(max(1, len(r.recips))))
	}

	// e. Nothing accepted while Redis was frozen (one second of grace for requests already on the wire).
	for _, w := range r.freezes {
		from := w.from.Add(time.Second)
		var during []string
		for _, m := range r.msgs {
			if m.At.After(from) && m.At.Before(w.to) {
				during = append(during, fmt.Sprintf("%s at %s", m.To, m.At.Local().Format("15:04:05.000")))
			}
		}
		report(fmt.Sprintf("e. messages accepted while Redis was frozen (%s–%s)", from.Local().Format("15:04:05.000"), w.to.Local().Format("15:04:05.000")), during)
		// The check only means something if messages flowed up to the freeze; and they should flow again
		// after it by themselves.
		before, after := 0, 0
		for _, m := range r.msgs {
			if m.At.After(w.from.Add(-2*time.Second)) && m.At.Before(w.from) {
				before++
			}
			if m.At.After(w.to) && m.At.Before(w.to.Add(5*time.Second)) {
				after++
			}
		}
		t.Logf("freeze %s–%s: %d messages accepted in the 2 s before it, %d in the 5 s after the thaw",
			w.from.Local().Format("15:04:05.000"), w.to.Local().Format("15:04:05.000"), before, after)
		if before == 0 {
			t.Logf("WARNING: nothing was being sent just before this freeze; check e. proved little for it")
		}
	}

	// f. No code went to two numbers.
	codeRE := regexp.MustCompile(`kodunuz (\S+)$`)
	codeTo := map[string]map[string]bool{}
	var noCode, shared []string
	for _, m := range r.msgs {
		mm := codeRE.FindStringSubmatch(m.Body)
		if mm == nil {
			noCode = append(noCode, fmt.Sprintf("%s: %q", m.To, m.Body))
			continue
		}
		if codeTo[mm[1]] == nil {
			codeTo[mm[1]] = map[string]bool{}
		}
		codeTo[mm[1]][m.To] = true
	}
	for code, tos := range codeTo {
		if len(tos) > 1 {
			shared = append(shared, fmt.Sprintf("%s to %d numbers", code, len(tos)))
		}
	}
	report("f. accepted messages without a code", noCode)
	report("f. codes accepted in messages to more than one number", shared)

	// Not an invariant of its own, but what the receipts are for: a recipient left unknown although a
	// receipt of its message reached the receiver should have become sent.
	unknownAccepted := 0
	var unknownReceipted []string
	for _, rc := range r.recips {
		if rc.Status != "unknown" || len(perTo[rc.Address]) == 0 {
			continue
		}
		unknownAccepted++
		for _, m := range perTo[rc.Address] {
			if !m.ReceiptAt.IsZero() {
				unknownReceipted = append(unknownReceipted, fmt.Sprintf("%s %s unknown (delivery column %q), receipt %q of %s answered at %s",
					rc.UserID, rc.Address, rc.Delivery, m.Receipt, m.SID, m.ReceiptAt.Local().Format("15:04:05.000")))
				break
			}
		}
	}
	if len(unknownReceipted) > 0 {
		sort.Strings(unknownReceipted)
		t.Logf("NOTE: %d recipients are unknown although a receipt of their message reached the receiver, e.g.\n  %s",
			len(unknownReceipted), strings.Join(unknownReceipted[:min(len(unknownReceipted), examples)], "\n  "))
	}
	if r.selfExits > 0 {
		t.Errorf("%d worker processes exited without being killed (see their logs below)", r.selfExits)
	}
	t.Logf("chaos summary: recipients %d planned %d sent %d unknown %d failed %d skipped %d pending %d (%d of the unknown were in fact accepted, %d of them with a receipt); provider accepted %d messages to %d numbers, duplicates %d (%d extra; %d of them resent without evidence); kills %d, self-exits %d, resumes %d; elapsed %v",
		r.n, len(r.recips), count["sent"], count["unknown"], count["failed"], count["skipped"], count["pending"], unknownAccepted, len(unknownReceipted),
		len(r.msgs), len(perTo), len(dups)+len(costs), extra, len(costs), r.kills, r.selfExits, r.resumes, time.Since(r.began).Round(time.Second))
}

// chaosVerdict is what chaosJudge found about one recipient accepted more than once.
type chaosVerdict struct {
	// cost is true when every repeat is the documented cost of --resend-unknown.
	cost bool
	// class names the kind, for a tally: the evidence that existed (or "no resend between"), how the
	// earlier acceptance was answered and what recorded the recipient unknown.
	class string
	why   string
}

// chaosJudge decides whether the repeated acceptances ms of one recipient (userID; its audit hist) are the
// documented cost of `resume --resend-unknown` or a double send, and says why. Each acceptance after the
// first is the cost only if a resend of the recipient was logged between it and the one before, and
// nothing said at the moment of that resend that an earlier acceptance had happened: no receipt of it
// answered by the receiver, no sent outcome in the audit, no sent claim in Redis just before the resend
// command ran.
func chaosJudge(ms []sandbox.Message, hist []chaosLogEntry, resends []*chaosResend, userID string) chaosVerdict {
	ms = slices.Clone(ms)
	slices.SortStableFunc(ms, func(a, b sandbox.Message) int { return a.At.Compare(b.At) })
	var whys []string
	for k := 1; k < len(ms); k++ {
		prev, cur := ms[k-1].At, ms[k].At
		answer := "answered"
		if ms[k-1].Hung {
			answer = "held"
		}
		var resendAt time.Time
		for _, e := range hist {
			if e.Status == "pending" && strings.Contains(e.Reason, "--resend-unknown") && e.At.After(prev) && e.At.Before(cur) {
				resendAt = e.At
			}
		}
		if resendAt.IsZero() {
			return chaosVerdict{
				class: fmt.Sprintf("double send, no resend-unknown between the acceptances; the earlier one %s, then %s", answer, chaosLastOutcome(hist, cur)),
				why: fmt.Sprintf("accepted again at %s with no resend-unknown of it since the acceptance at %s: a double send",
					cur.Local().Format("15:04:05.000"), prev.Local().Format("15:04:05.000")),
			}
		}
		var evidence, kinds []string
		for _, m := range ms[:k] {
			if !m.ReceiptAt.IsZero() && m.ReceiptAt.Before(resendAt) {
				evidence = append(evidence, fmt.Sprintf("receipt %q of %s (accepted %s) answered by the receiver at %s",
					m.Receipt, m.SID, m.At.Local().Format("15:04:05.000"), m.ReceiptAt.Local().Format("15:04:05.000")))
				kinds = append(kinds, "a receipt")
			}
		}
		for _, e := range hist {
			if e.Status == "sent" && e.At.Before(resendAt) {
				evidence = append(evidence, "recorded sent at "+e.String())
				kinds = append(kinds, "a sent outcome")
			}
		}
		var before *chaosResend
		for _, r := range resends {
			if !r.start.After(resendAt) && (before == nil || r.start.After(before.start)) {
				before = r
			}
		}
		if before != nil && strings.HasPrefix(before.claims[userID], "s") {
			evidence = append(evidence, fmt.Sprintf("its claim said sent (%s) just before the resend command of %s",
				before.claims[userID], before.start.Local().Format("15:04:05.000")))
			kinds = append(kinds, "a sent claim")
		}
		if len(evidence) > 0 {
			slices.Sort(kinds)
			return chaosVerdict{
				class: fmt.Sprintf("double send, resent by --resend-unknown despite %s; the earlier acceptance %s, recorded unknown by %s",
					strings.Join(slices.Compact(kinds), " and "), answer, chaosLastOutcome(hist, resendAt)),
				why: fmt.Sprintf("resent by --resend-unknown at %s although %s: a double send",
					resendAt.Local().Format("15:04:05.000"), strings.Join(evidence, "; ")),
			}
		}
		whys = append(whys, fmt.Sprintf("resent at %s with no receipt, sent outcome nor sent claim of the acceptance at %s",
			resendAt.Local().Format("15:04:05.000"), prev.Local().Format("15:04:05.000")))
	}
	return chaosVerdict{cost: true, class: "cost of --resend-unknown: resent with no evidence of the earlier acceptance", why: strings.Join(whys, "; ")}
}

// chaosLastOutcome names, for a tally, the last outcome in hist before at: what recorded the recipient.
func chaosLastOutcome(hist []chaosLogEntry, at time.Time) string {
	last := chaosLogEntry{Status: "nothing"}
	for _, e := range hist {
		if e.At.Before(at) && e.Status != "pending" {
			last = e
		}
	}
	switch r := last.Reason; {
	case last.Status != "unknown":
		return "a " + last.Status + " outcome"
	case strings.Contains(r, "Timeout") || strings.Contains(r, "deadline exceeded"):
		return "the provider timeout"
	case strings.Contains(r, "stopped after claiming"):
		return "the sweep of a dead worker's chunk"
	case strings.Contains(r, "lost its data") || strings.Contains(r, "epoch"):
		return "Redis losing its data"
	default:
		return fmt.Sprintf("%.60q", r)
	}
}

// chaosDuplicateReport is everything known about a recipient the provider accepted more than once.
func chaosDuplicateReport(to string, rc chaosRecipient, ms []sandbox.Message, r chaosRun, why string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s (%s) accepted %d times; PG status %s, reason %q, delivery %q", to, rc.UserID, len(ms), rc.Status, rc.Reason, rc.Delivery)
	if !rc.DeliveryAt.IsZero() {
		fmt.Fprintf(&b, " at %s", rc.DeliveryAt.Local().Format("15:04:05.000"))
	}
	fmt.Fprintf(&b, "; %s", why)
	for _, m := range ms {
		fmt.Fprintf(&b, "\n      accepted %s %s", m.At.Local().Format("15:04:05.000"), m.SID)
		if m.Hung {
			b.WriteString(" (answer held)")
		}
		if !m.ReceiptAt.IsZero() {
			fmt.Fprintf(&b, ", receipt %q answered at %s", m.Receipt, m.ReceiptAt.Local().Format("15:04:05.000"))
		} else {
			b.WriteString(", no receipt answered")
		}
	}
	for _, e := range r.history[rc.UserID] {
		fmt.Fprintf(&b, "\n      audit %s", e)
	}
	for _, rs := range r.resends {
		if v, ok := rs.claims[rc.UserID]; ok {
			fmt.Fprintf(&b, "\n      claim before the resend of %s: %s", rs.start.Local().Format("15:04:05.000"), v)
		}
	}
	for _, st := range r.steps {
		near := false
		for _, m := range ms {
			near = near || (st.at.After(m.At.Add(-3*time.Second)) && st.at.Before(m.At.Add(time.Second)))
		}
		if near {
			fmt.Fprintf(&b, "\n      step %s %s", st.at.Local().Format("15:04:05.000"), st.what)
		}
	}
	return b.String()
}

// chaosWorkers runs the worker processes of a chaos test. It is used from the test's goroutine only.
type chaosWorkers struct {
	t         *testing.T
	e         *e2eEnv
	args      []string
	dir       string
	all, live []*chaosWorker
	kills     int
	exits     []string
	lastStart time.Time
	lastKill  time.Time
	// hold keeps replacements from starting; owed counts those held back.
	hold bool
	owed int
	// tolerateRefusals counts a worker that exits before it started (Redis or Postgres out just then) in
	// refusals instead of exits.
	tolerateRefusals bool
	refusals         []string
}

type chaosWorker struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed once the process has exited and been waited for
	fate    string        // "" while it runs as expected
}

func newChaosWorkers(t *testing.T, e *e2eEnv, args []string) *chaosWorkers {
	w := &chaosWorkers{t: t, e: e, args: args, dir: t.TempDir()}
	t.Cleanup(func() {
		for _, p := range w.all {
			p.cmd.Process.Kill() //nolint:errcheck // gone already is fine
			select {
			case <-p.done:
			case <-time.After(10 * time.Second):
				t.Errorf("%s did not exit 10s after SIGKILL", p.name)
			}
		}
		if t.Failed() {
			for _, p := range w.all {
				b, _ := os.ReadFile(p.logPath)
				fate := p.fate
				if fate == "" {
					fate = "ran to the end"
				}
				t.Logf("%s (%s), last of %s:\n%s", p.name, fate, p.logPath, tail(string(b), 1500))
			}
		}
	})
	return w
}

func (w *chaosWorkers) start() {
	w.t.Helper()
	p := &chaosWorker{name: fmt.Sprintf("worker-%02d", len(w.all)+1), done: make(chan struct{})}
	p.logPath = filepath.Join(w.dir, p.name+".log")
	f, err := os.Create(p.logPath)
	if err != nil {
		w.t.Fatal(err)
	}
	p.cmd = exec.Command(w.e.bin, w.args...)
	p.cmd.Env = w.e.env
	p.cmd.Stdout, p.cmd.Stderr = f, f
	if err := p.cmd.Start(); err != nil {
		f.Close()
		w.t.Fatal(err)
	}
	go func() {
		p.cmd.Wait() //nolint:errcheck // the exit is read from ProcessState
		f.Close()
		close(p.done)
	}()
	w.all = append(w.all, p)
	w.live = append(w.live, p)
	w.lastStart = time.Now()
}

// killRandom SIGKILLs one live worker, waits for it to be gone and starts its replacement at once.
func (w *chaosWorkers) killRandom() {
	w.t.Helper()
	w.kill(rand.N(len(w.live)))
}

// kill SIGKILLs the live worker at slot i (modulo the live count; they are in the order started), waits
// for it to be gone and starts its replacement, at once unless replacements are held. It returns the name
// of the worker killed.
func (w *chaosWorkers) kill(i int) string {
	w.t.Helper()
	if len(w.live) == 0 {
		return "none (no worker running)"
	}
	i %= len(w.live)
	p := w.live[i]
	p.fate = "SIGKILLed by the test"
	p.cmd.Process.Kill() //nolint:errcheck // if it just died, reap reports it next
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		w.t.Fatalf("%s did not exit 10s after SIGKILL", p.name)
	}
	w.live = append(w.live[:i], w.live[i+1:]...)
	w.kills++
	w.lastKill = time.Now()
	w.replace()
	return p.name
}

// replace starts a worker now, or once replacements are no longer held.
func (w *chaosWorkers) replace() {
	w.t.Helper()
	if w.hold {
		w.owed++
		return
	}
	w.start()
}

// holdReplacements keeps replacements from starting (a worker that starts while Redis is frozen
// refuses to run) until releaseReplacements starts the ones owed.
func (w *chaosWorkers) holdReplacements() { w.hold = true }

func (w *chaosWorkers) releaseReplacements() {
	w.t.Helper()
	w.hold = false
	for ; w.owed > 0; w.owed-- {
		w.start()
	}
}

// reap notices workers that exited on their own, records them and starts replacements. A worker that
// exited before it said "worker started" refused to start (Redis or Postgres out at that moment): with
// tolerateRefusals that is counted apart, not as a crash.
func (w *chaosWorkers) reap() {
	w.t.Helper()
	for i := 0; i < len(w.live); i++ {
		p := w.live[i]
		select {
		case <-p.done:
		default:
			continue
		}
		b, _ := os.ReadFile(p.logPath)
		if w.tolerateRefusals && !strings.Contains(string(b), "worker started") {
			p.fate = "refused to start: " + p.cmd.ProcessState.String()
			w.refusals = append(w.refusals, p.name)
			w.t.Logf("%s %s (%s); starting a replacement", p.name, p.fate, strings.TrimSpace(tail(string(b), 300)))
		} else {
			p.fate = "exited by itself: " + p.cmd.ProcessState.String()
			w.exits = append(w.exits, p.name)
			w.t.Logf("%s %s; starting a replacement", p.name, p.fate)
		}
		w.live = append(w.live[:i], w.live[i+1:]...)
		i--
		w.replace()
	}
}

// stop sends SIGTERM to every live worker and waits for them (SIGKILL after 45 s).
func (w *chaosWorkers) stop() {
	w.t.Helper()
	for _, p := range w.live {
		p.cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck // gone already is fine
	}
	deadline := time.Now().Add(45 * time.Second)
	for _, p := range w.live {
		select {
		case <-p.done:
			if code := p.cmd.ProcessState.ExitCode(); code != 0 {
				w.t.Logf("%s exited with %d after SIGTERM", p.name, code)
			}
			p.fate = "stopped with SIGTERM: " + p.cmd.ProcessState.String()
		case <-time.After(time.Until(deadline)):
			w.t.Errorf("%s still running 45s after SIGTERM; killing it", p.name)
			p.fate = "did not stop on SIGTERM"
			p.cmd.Process.Kill() //nolint:errcheck
			<-p.done
		}
	}
	w.live = nil
}
