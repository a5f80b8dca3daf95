package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/providers"
)

// Twilio refuses u1 at creation with 21610 (opted out), with a long error text that is not ASCII (a
// localised message from an edge or a proxy). iys.RecordRefusals cut the evidence at byte 500, inside a
// rune: Postgres refused the invalid UTF-8 on every attempt, so the opt-out was never recorded nor queued
// for İYS, the worker retried it for as long as it ran, and held the address back all that time.
func TestAnOptOutWithALongNonASCIIMessageIsRecorded(t *testing.T) {
	t.Parallel()
	f := plan(t, 10)
	f.h.consentAttempt, f.h.consentPause = 500*time.Millisecond, 50*time.Millisecond
	msg := strings.Repeat("a", 485) + strings.Repeat("ğ", 20) // "twilio 21610: " is 14 bytes: byte 500 is inside a ğ
	f.provider.fail = func(_ int, m providers.Message) error {
		if m.To == phone(1) {
			return &providers.Error{Provider: "twilio", Status: 400, Code: 21610, Class: providers.Permanent, OptedOut: true, Message: msg}
		}
		return nil
	}
	f.runAll(t)
	if st, _, _ := f.status(t, "u1"); st != campaign.StatusFailed {
		t.Fatalf("u1 %s, want failed", st)
	}
	bg := context.Background()
	var refusals, outboxed int
	var consent string
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if err := f.db.QueryRow(bg, `SELECT (SELECT count(*) FROM refusals WHERE recipient = $1), (SELECT count(*) FROM iys_outbox WHERE recipient = $1),
			coalesce((SELECT status FROM iys_consents WHERE recipient = $1 AND type = 'MESAJ' LIMIT 1), '')`, phone(1)).Scan(&refusals, &outboxed, &consent); err != nil {
			t.Fatal(err)
		}
		if refusals > 0 || time.Now().After(end) {
			break
		}
	}
	f.h.heldMu.Lock()
	held := len(f.h.held)
	f.h.heldMu.Unlock()
	if refusals != 1 || consent != "RET" || outboxed != 1 {
		t.Fatalf("u1 opted out with Twilio (21610 at creation): after 5 s %d refusals recorded, %d RETs queued for İYS, consent %q, %d addresses still held back by this worker; want 1, 1, RET (the write fails on every attempt and is retried forever)", refusals, outboxed, consent, held)
	}
}

// A consent write Postgres refuses for what it holds fails the same way on every attempt: it is given up
// (and its hold let go) at once. A conflict, a timeout or a lost connection is tried again.
func TestAConsentWriteRefusedForItsDataIsGivenUp(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Code: "22021"}, true}, // invalid byte sequence
		{fmt.Errorf("record refusals: %w", &pgconn.PgError{Code: "23514"}), true},
		{&pgconn.PgError{Code: "40001"}, false}, // serialization failure
		{&pgconn.PgError{Code: "57014"}, false}, // statement timeout
		{context.DeadlineExceeded, false},
		{errors.New("dial tcp: connection refused"), false},
	} {
		if got := campaign.RefusedForGood(c.err); got != c.want {
			t.Errorf("campaign.RefusedForGood(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
