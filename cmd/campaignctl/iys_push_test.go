package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/iys"
)

// A push that could not reach İYS is a failure of the run (exit 1, saying what happens next), not a
// success that left everything waiting.
func TestIYSPushFailsWhenIYSIsUnreachable(t *testing.T) {
	t.Parallel()
	env := withRefusal(t, "SM1", "+905321000001", "test")
	for k, v := range map[string]string{"IYS_BASE_URL": "http://127.0.0.1:1", "IYS_USERNAME": "u", "IYS_PASSWORD": "s3cret-pw", "IYS_CODE": "123456", "IYS_BRAND_CODE": "654321"} {
		env[k] = v
	}
	out, stderr, code := cli(t, env, "iys", "push")
	if code != 1 || !strings.Contains(stderr, "could not reach İYS") || !strings.Contains(out, "İYS took 0 RETs") || !strings.Contains(out, "1 were not taken") || strings.Contains(out+stderr, "s3cret-pw") {
		t.Fatalf("iys push with İYS unreachable: exit %d\n%s\n%s", code, out, stderr)
	}
	out, _, code = cli(t, env, "iys", "outbox", "--json")
	if code != 0 || !strings.Contains(out, `"waiting":1`) {
		t.Fatalf("outbox after a failed push: exit %d %s; want the RET still waiting", code, out)
	}
}

// iys outbox masks the addresses unless --with-address, in the evidence too: a refusal through an
// unsubscribe link named a user ID that is the person's e-mail address there, in full, beside the masked
// recipient.
func TestIYSOutboxMasksTheEvidenceToo(t *testing.T) {
	t.Parallel()
	env := withRefusal(t, "SM2", "+905321000002", "unsubscribe link of campaign 31, user zeynep.kaya@example.com, through the page")
	out, _, code := cli(t, env, "iys", "outbox", "--json")
	if code != 0 || !strings.Contains(out, "unsubscribe link of campaign 31") || strings.Contains(out, "zeynep.kaya") {
		t.Fatalf("iys outbox --json: exit %d\n%s\nwant the evidence kept with the address masked", code, out)
	}
	if out, _, _ = cli(t, env, "iys", "outbox", "--json", "--with-address"); !strings.Contains(out, "zeynep.kaya@example.com") || !strings.Contains(out, "+905321000002") {
		t.Errorf("iys outbox --with-address hides the address:\n%s", out)
	}
}

// withRefusal is badInputDB's environment with one refusal of an SMS number waiting in the İYS outbox, as an
// incoming "RET" records it (event ID sid, the evidence given).
func withRefusal(t *testing.T, sid, recipient, evidence string) map[string]string {
	t.Helper()
	env, _ := badInputDB(t)
	db, err := pgxpool.New(context.Background(), env["DATABASE_URL"])
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := iys.RecordRefusals(context.Background(), db, "", []iys.Refusal{{Via: iys.ViaTwilioInbound, EventID: sid, Kind: "inbound",
		Recipient: recipient, Type: "MESAJ", Evidence: evidence, At: time.Now()}}); err != nil {
		t.Fatal(err)
	}
	return env
}

// Only the RETs İYS refused for a reason that a person can mend are left to be registered by hand: not
// H175 (İYS never had the consent) nor H178 (İYS holds a later decision: the person gave consent there
// after refusing here). Before, H178 made iys push exit 1 saying to register them by hand, which would
// have undone the later consent.
func TestRefusalsLeftToBeRegisteredByHand(t *testing.T) {
	t.Parallel()
	if n := byHand(map[string]int{"H175": 2, "H178": 6}); n != 0 {
		t.Errorf("H175 and H178: %d to register by hand, want none", n)
	}
	if n := byHand(map[string]int{"H178": 1, "H467": 3, "H162": 1}); n != 4 {
		t.Errorf("H467 (over three business days) and H162 beside H178: %d by hand, want 4", n)
	}
}

// An İYS command stopped by İYS refusing the credentials names the settings to check: "run it again to go
// on", as for any other stop, could not help.
func TestIYSCredentialsRefusedNameTheSettings(t *testing.T) {
	t.Parallel()
	auth := iysRunError(&iys.APIError{Status: 401, Code: "H351", Message: "Kullanıcı kimlik bilgileri geçersiz"}, "pulled before the error is stored")
	if msg := auth.Error(); !strings.Contains(msg, "IYS_USERNAME and IYS_PASSWORD") || strings.Contains(msg, "run it again to go on") {
		t.Errorf("credentials refused: %q; want the settings named", msg)
	}
	var usage usageError
	if !errors.As(auth, &usage) {
		t.Errorf("credentials refused: %T, want a usage error (exit 2): the settings are the user's to fix", auth)
	}
	other := iysRunError(&iys.APIError{Status: 503, Message: "busy"}, "pulled before the error is stored")
	if msg := other.Error(); !strings.Contains(msg, "run it again to go on") {
		t.Errorf("İYS busy: %q; want to run it again", msg)
	}
	if errors.As(other, &usage) {
		t.Errorf("İYS busy is a usage error (exit 2); want a failure (exit 1)")
	}
}
