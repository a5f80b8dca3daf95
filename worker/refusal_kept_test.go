package worker

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/providers"
)

// Order: an `iys import` holds the consents' turn while worker A (a liveness lock of its own) sends a
// commercial SMS campaign. The provider refuses u1 for want of consent (Netgsm 50) and u2 at creation with
// Twilio's 21610 (the person replied STOP). Both fail; A's consent writes wait for the turn in the
// background. Worker B looks for refusals left by stopped workers meanwhile: A's are A's own, and B takes
// none. Then A is killed outright (its lock's session ends, its background writes die unwritten), and only
// after that the import ends. Worker B, started after, writes both: u1's consent turns RET here, and u2's
// refusal is recorded and queued for İYS. Before, A's refusals lived only in A's memory and a kill lost
// them: nothing else carries them again (Twilio created no message, so no status callback follows).
func TestAProvidersRefusalOutlivesTheWorkerThatGotIt(t *testing.T) {
	t.Parallel()
	f, killA, endImport := refusedUnderAnImport(t, "Attempt to send to unsubscribed recipient")
	ctx := context.Background()
	if st, _, _ := f.status(t, "u1"); st != campaign.StatusFailed {
		t.Fatalf("u1 %s, want failed", st)
	}
	if st, _, _ := f.status(t, "u2"); st != campaign.StatusFailed {
		t.Fatalf("u2 %s, want failed", st)
	}
	b := f.secondWorker(t)
	if n, err := b.DrainRefusals(ctx, 20); err != nil || n != 0 {
		t.Fatalf("worker B wrote %d refusals of a live worker A (%v), want 0: A writes them itself", n, err)
	}
	if got := f.keptRefusals(t); got != 2 {
		t.Fatalf("%d refusals kept after B looked while A lives, want 2: B took a live worker's", got)
	}

	killA()
	endImport()
	if u1, refusals, _ := f.refusalsWritten(t); u1 != "ONAY" || refusals != 0 {
		t.Fatalf("before any worker wrote them: u1 %s, u2 %d refusals; want ONAY and 0 (the order did not happen: A wrote them before the kill)", u1, refusals)
	}

	n, err := b.DrainRefusals(ctx, 20)
	if err != nil {
		t.Fatal(err)
	}
	if u1, refusals, queued := f.refusalsWritten(t); n != 2 || u1 != "RET" || refusals != 1 || queued != 1 {
		t.Fatalf("after A was killed with two providers' refusals unwritten, B wrote %d (want 2): u1 (Netgsm 50) consent %s, want RET; u2 (Twilio 21610) %d refusals recorded, want 1, %d RETs queued for İYS, want 1",
			n, u1, refusals, queued)
	}
	if got := f.keptRefusals(t); got != 0 {
		t.Errorf("%d refusals still kept once written, want 0: every worker would write them again", got)
	}
	if n, err := b.DrainRefusals(ctx, 20); err != nil || n != 0 {
		t.Errorf("a second look wrote %d (%v), want 0", n, err)
	}
}

// refusedUnderAnImport plans a campaign and runs it on worker A (f.h, with a liveness lock of its own)
// while an import holds the consents: the provider refuses u1 for want of consent and u2 at creation
// (refuseTwo, with twilioText), and both refusals are kept in Postgres, their consents not written. killA
// ends A as kill -9 does (its background writes die, its lock goes with its connection); endImport ends
// the import.
func refusedUnderAnImport(t *testing.T, twilioText string) (f *fixture, killA, endImport func()) {
	t.Helper()
	f = plan(t, 10)
	f.refuseTwo(twilioText)
	la, stopA := startLiveness(t, f)
	f.h.cfg.Liveness = la
	waitUntil(t, 5*time.Second, "worker A's liveness lock held", la.Held)
	endImport = f.holdConsentsTurn(t)
	f.runAll(t)
	waitUntil(t, 5*time.Second, "both refusals kept in Postgres while the import holds the consents", func() bool { return f.keptRefusals(t) == 2 })
	killA = func() {
		t.Helper()
		f.h.endConsentWrites()
		f.h.consentPending.Wait()
		stopA()
		f.lockGone(t, la)
	}
	return f, killA, endImport
}

// lockGone waits until no session holds l's lock: its worker is gone, as after kill -9.
func (f *fixture) lockGone(t *testing.T, l *Liveness) {
	t.Helper()
	waitUntil(t, 5*time.Second, "the worker's liveness lock let go with its connection", func() bool {
		var held bool
		if err := f.db.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1
			AND classid::bigint = ($1::bigint >> 32) & 4294967295 AND objid::bigint = $1::bigint & 4294967295)`, l.Key()).Scan(&held); err != nil {
			t.Fatal(err)
		}
		return !held
	})
}

// Order: the provider refuses u1 for want of consent (Netgsm 50) and u2 at creation with Twilio's 21610
// (the person replied STOP), and worker A is killed right after the answers, before anything it leaves to
// the background has run: here its background work is dead from the start. The recipients end failed all
// the same (their claims hold the answers), and the refusals must not be lost with A: they are kept in
// Postgres before the answers go into the claims, and worker B writes them once A's lock is gone. Before,
// the refusal was first kept by a goroutine, and such a kill lost it: u2's number stayed ONAY, no refusal,
// nothing queued for İYS, and the next campaign planned it again.
func TestARefusalIsKeptBeforeTheAnswerReachesTheClaims(t *testing.T) {
	t.Parallel()
	f := plan(t, 10)
	f.refuseTwo("Attempt to send to unsubscribed recipient")
	la, stopA := startLiveness(t, f)
	f.h.cfg.Liveness = la
	waitUntil(t, 5*time.Second, "worker A's liveness lock held", la.Held)
	f.h.endConsentWrites()
	f.runAll(t)
	for _, u := range []string{"u1", "u2"} {
		if st, _, _ := f.status(t, u); st != campaign.StatusFailed {
			t.Fatalf("%s %s, want failed", u, st)
		}
	}
	if got := f.keptRefusals(t); got != 2 {
		t.Fatalf("%d refusals kept in Postgres once the answers were in, want 2: a kill now loses them", got)
	}
	stopA()
	f.lockGone(t, la)
	b := f.secondWorker(t)
	n, err := b.DrainRefusals(context.Background(), 20)
	if err != nil {
		t.Fatal(err)
	}
	if u1, refusals, queued := f.refusalsWritten(t); n != 2 || u1 != "RET" || refusals != 1 || queued != 1 {
		t.Fatalf("worker B wrote %d refusals (want 2): u1's consent %s (want RET), u2's refusals %d (want 1), RETs queued %d (want 1)", n, u1, refusals, queued)
	}
}

// secondWorker is worker B on f's campaign, with a liveness lock of its own.
func (f *fixture) secondWorker(t *testing.T) *Handler {
	t.Helper()
	b := f.handler(f.rdb)
	lb, _ := startLiveness(t, f)
	b.cfg.Liveness = lb
	waitUntil(t, 5*time.Second, "worker B's liveness lock held", lb.Held)
	return b
}

// refuseTwo makes f's provider refuse u1 for want of consent (Netgsm 50) and u2 at creation with Twilio's
// 21610, whose message is twilioText.
func (f *fixture) refuseTwo(twilioText string) {
	f.provider.fail = func(_ int, m providers.Message) error {
		switch m.To {
		case phone(1):
			return &providers.Error{Provider: "netgsm", Status: 200, Code: 50, Class: providers.Permanent, NoConsent: true, Message: "İYS kontrollü gönderim"}
		case phone(2):
			return &providers.Error{Provider: "twilio", Status: 400, Code: 21610, Class: providers.Permanent, OptedOut: true, Message: twilioText}
		}
		return nil
	}
}

// keptRefusals counts the refusals kept in f's database.
func (f *fixture) keptRefusals(t *testing.T) (n int) {
	t.Helper()
	if err := f.db.QueryRow(context.Background(), `SELECT count(*) FROM pending_provider_refusals`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// refusalsWritten reads what the two refusals of refuseTwo changed: u1's consent, u2's recorded refusals
// and the RETs queued for İYS.
func (f *fixture) refusalsWritten(t *testing.T) (u1 string, refusals, queued int) {
	t.Helper()
	if err := f.db.QueryRow(context.Background(), `SELECT (SELECT status FROM iys_consents WHERE recipient = $1),
		(SELECT count(*) FROM refusals WHERE recipient = $2), (SELECT count(*) FROM iys_outbox WHERE recipient = $2)`,
		phone(1), phone(2)).Scan(&u1, &refusals, &queued); err != nil {
		t.Fatal(err)
	}
	return u1, refusals, queued
}

// Order: worker A gets both refusals while an import holds the consents, and is killed. Worker B, started
// while the import still runs, takes them and its write times out. The import ends; B looks again (its
// 10 s loop) and writes both. Before, B's failed try left the refusals marked as its own, and B's live lock
// kept every worker, B included, from them for as long as B ran: the person went on getting messages.
func TestARefusalAWorkerFailedToWriteIsTakenAgain(t *testing.T) {
	t.Parallel()
	f, killA, endImport := refusedUnderAnImport(t, "Attempt to send to unsubscribed recipient")
	ctx := context.Background()
	killA()
	b := f.secondWorker(t)
	b.consentAttempt = 300 * time.Millisecond
	waitUntil(t, 5*time.Second, "B taking A's refusals and failing to write them while the import holds the consents", func() bool {
		n, err := b.DrainRefusals(ctx, 20)
		if n != 0 {
			t.Fatalf("B wrote %d refusals while the import holds the consents", n)
		}
		return err != nil
	})
	endImport()
	for end := time.Now().Add(refusalsEvery + 2*time.Second); ; time.Sleep(200 * time.Millisecond) {
		if _, err := b.DrainRefusals(ctx, 20); err != nil {
			t.Logf("B's look: %v", err)
		}
		if f.keptRefusals(t) == 0 {
			break
		}
		if time.Now().After(end) {
			u1, refusals, queued := f.refusalsWritten(t)
			t.Fatalf("%v after the import ended, B (alive) still has not written the refusals its failed try took: %d kept, u1 %s, u2 %d refusals, %d queued",
				refusalsEvery+2*time.Second, f.keptRefusals(t), u1, refusals, queued)
		}
	}
	if u1, refusals, queued := f.refusalsWritten(t); u1 != "RET" || refusals != 1 || queued != 1 {
		t.Fatalf("u1 %s, want RET; u2 %d refusals and %d RETs queued, want 1 and 1", u1, refusals, queued)
	}
}

// Order: Twilio's 21610 comes with a NUL in its message while an import holds the consents. The refusal is
// kept all the same (the NUL stored as U+FFFD), so that a stop before the import ends does not lose it.
// Before, Postgres refused the row, the keep was retried in silence forever, and a SIGTERM lost the refusal.
func TestARefusalWithTextPostgresRefusesIsKept(t *testing.T) {
	t.Parallel()
	f := plan(t, 10)
	f.refuseTwo("Attempt to send to unsubscribed recipient\x00\xfe")
	endImport := f.holdConsentsTurn(t)
	defer endImport()
	f.runAll(t)
	waitUntil(t, 5*time.Second, "both refusals kept, the one with a NUL and invalid UTF-8 in its text too", func() bool { return f.keptRefusals(t) == 2 })
	var reason string
	if err := f.db.QueryRow(context.Background(), `SELECT reason FROM pending_provider_refusals WHERE opted_out`).Scan(&reason); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(reason, "unsubscribed recipient\uFFFD") {
		t.Errorf("kept reason %q, want the provider's text with U+FFFD for what Postgres refuses", reason)
	}
}

// A kept refusal that names no address, or not one for each recipient (a row written by hand), is dropped
// with an error: it neither stops the look at the others nor takes the worker down.
func TestAKeptRefusalWithoutAddressesIsDropped(t *testing.T) {
	t.Parallel()
	f := plan(t, 10)
	ctx := context.Background()
	f.leftKept(t, []string{}, []string{})
	f.leftKept(t, []string{"u1", "u2"}, []string{phone(1)})
	f.leftKept(t, []string{"u2"}, []string{phone(2)})
	n, err := f.h.DrainRefusals(ctx, 20)
	if err != nil || n != 1 {
		t.Fatalf("wrote %d (%v), want the one whole refusal", n, err)
	}
	if got := f.keptRefusals(t); got != 0 {
		t.Errorf("%d kept after the look, want 0: the broken ones dropped, the whole one written", got)
	}
	if _, refusals, _ := f.refusalsWritten(t); refusals != 1 {
		t.Errorf("u2: %d refusals recorded, want 1", refusals)
	}
}

// A worker writes, as it starts, the refusals a worker that stopped left kept: Serve looks at once (and
// every refusalsEvery), not only when a test calls DrainRefusals.
func TestAStartingWorkerWritesTheRefusalsLeftKept(t *testing.T) {
	t.Parallel()
	f := plan(t, 10)
	f.leftKept(t, []string{"u2"}, []string{phone(2)})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, f.rdb, f.h, ServerConfig{Concurrency: 1, ShutdownTimeout: 5 * time.Second}) }()
	// The worker stops before the database and Redis go, whatever the test found.
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	waitUntil(t, 5*time.Second, "the starting worker writing the refusal left kept", func() bool {
		_, refusals, queued := f.refusalsWritten(t)
		return refusals == 1 && queued == 1 && f.keptRefusals(t) == 0
	})
}

// leftKept keeps a Twilio opt-out of users at addrs for f's campaign as a worker that stopped leaves it: no
// holder, its hold over.
func (f *fixture) leftKept(t *testing.T, users, addrs []string) {
	t.Helper()
	if _, err := f.db.Exec(context.Background(), `INSERT INTO pending_provider_refusals (campaign_id, user_ids, addresses, opted_out, reason, refused_at, taken_until)
		VALUES ($1, $2, $3, true, 'Attempt to send to unsubscribed recipient', now(), now() - interval '1 second')`, f.id, users, addrs); err != nil {
		t.Fatal(err)
	}
}
