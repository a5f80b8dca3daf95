package iys_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/iys"
	"github.com/campaignctl/campaignctl/providers/sandbox"
)

// Each run of an iys command is a new client. With the token kept in Postgres, later runs use it instead of
// asking İYS for one: İYS gives 10 tokens an hour and restarts the hour on an early request, and a cron of
// sync and push every 15 minutes ran into the limit, after which no sync or push got through. The kept
// token is sealed: the row holds neither it nor the password in clear, and a client with another password
// cannot use it. A refusal of new tokens (H084) is kept too: a later run does not ask before its hour ends.
func TestTokensAreKeptBetweenRuns(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.New(t)
	e := newEnv(t, sandbox.Options{IYSTokenPerHour: 2}, nil)
	ctx := context.Background()
	run := func() error {
		c := e.client(t, nil)
		c.KeepTokensIn(pool)
		_, err := c.Status(ctx, "BIREYSEL", "MESAJ", "+905321234567")
		if errors.Is(err, iys.ErrNoConsent) {
			return nil
		}
		return err
	}
	for i := range 5 {
		if err := run(); err != nil {
			t.Fatalf("run %d: %v", i+1, err)
		}
	}
	if n := e.s.IYSStats().TokenRequests; n != 1 {
		t.Fatalf("five runs asked İYS for %d tokens; want 1, kept for the others", n)
	}
	var sealed []byte
	if err := pool.QueryRow(ctx, `SELECT sealed FROM iys_tokens`).Scan(&sealed); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(sealed), testPassword) || strings.Contains(string(sealed), "eyJ") || strings.Contains(string(sealed), `"a"`) {
		t.Fatalf("the kept token is not sealed: %q", sealed)
	}

	// Another password (rotated) cannot open it: it asks İYS, here over the sandbox's limit of 2 an hour.
	other := func() error {
		c := e.client(t, func(cfg *iys.Config) { cfg.Password = testPassword + "-rotated" })
		c.KeepTokensIn(pool)
		_, err := c.Status(ctx, "BIREYSEL", "MESAJ", "+905321234567")
		return err
	}
	other() //nolint:errcheck // refused: the sandbox knows only the test password
	other() //nolint:errcheck
	before := e.s.IYSStats().TokenRequests
	if before < 2 {
		t.Fatalf("a client with another password asked for %d tokens in all; want it to ask, not use the kept one", before)
	}
	// Over the hour's limit now: a refusal (H084) is kept, and the next run does not ask again early.
	if e.s.IYSStats().ByCode["H084"] == 0 {
		other() //nolint:errcheck
	}
	if e.s.IYSStats().ByCode["H084"] == 0 {
		t.Skip("the sandbox did not refuse a token over its limit") // the limit counts by IP and hour
	}
	asked := e.s.IYSStats().TokenRequests
	if err := other(); err == nil || !strings.Contains(err.Error(), "H084") {
		t.Fatalf("a run after İYS's refusal of new tokens: %v; want the kept refusal", err)
	}
	if n := e.s.IYSStats().TokenRequests; n != asked {
		t.Fatalf("a run after İYS's refusal asked again (%d token requests, was %d): an early request restarts İYS's hour", n, asked)
	}
}
