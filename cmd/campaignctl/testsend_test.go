package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/unsubscribe"
	"github.com/campaignctl/campaignctl/providers/sandbox"
)

// testSendEnv is badInputDB's database (customers a, b, c with MESAJ consent, pool "small" of 2 codes)
// with Twilio and SendGrid pointed at an in-process sandbox, and a one-click unsubscribe setup.
func testSendEnv(t *testing.T) (map[string]string, *sandbox.Server, func(sql string) int64, *pgxpool.Pool) {
	t.Helper()
	env, count := badInputDB(t)
	sb := sandbox.New(sandbox.Options{})
	srv := httptest.NewServer(sb)
	t.Cleanup(srv.Close)
	for k, v := range map[string]string{
		"TWILIO_ACCOUNT_SID": "ACe2e0000000000000000000000000000", "TWILIO_AUTH_TOKEN": "e2etoken", "TWILIO_FROM": "+905550000000",
		"TWILIO_BASE_URL": srv.URL, "SENDGRID_API_KEY": "SG.test-key", "SENDGRID_FROM": "kampanya@example.com",
		"SENDGRID_BASE_URL": srv.URL, "WEBHOOKS_PUBLIC_URL": "https://hooks.example.com", "UNSUBSCRIBE_SECRET": "test-send-secret-0123456789",
	} {
		env[k] = v
	}
	db, err := pgxpool.New(context.Background(), env["DATABASE_URL"])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	return env, sb, count, db
}

// nothingPlanned fails the test if a test send left a campaign, a recipient (a reserved code) or a used
// code behind.
func nothingPlanned(t *testing.T, count func(string) int64) {
	t.Helper()
	if n := count(`SELECT count(*) FROM campaigns`) + count(`SELECT count(*) FROM campaign_recipients`); n != 0 {
		t.Errorf("a test send wrote %d campaigns and recipients", n)
	}
	if n := count(`SELECT count(*) FROM promo_codes WHERE pool = 'small'`); n != 2 {
		t.Errorf("pool small holds %d codes after a test send, want its 2", n)
	}
}

func TestTestSendSMSReachesTheAddressOnceWithAPlaceholderCode(t *testing.T) {
	t.Parallel()
	env, sb, count, _ := testSendEnv(t)
	audience := writeFile(t, "a.sql", "SELECT user_id, phone, first_name FROM customers ORDER BY user_id")
	out, stderr, code := cli(t, env, "launch", "--name", "yaz", "--channel", "sms", "--audience", audience,
		"--message", testPrefix+"Merhaba {{.first_name}}, kodunuz {{.code}}", "--code-pool", "small",
		"--test-to", "0532 100 00 03", "--test-user", "b", "--yes", "--json")
	if code != 0 {
		t.Fatalf("test send: exit %d\n%s%s", code, out, stderr)
	}
	var res testSendResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("--json: %v\n%s", err, out)
	}
	msgs := sb.Messages()
	if len(msgs) != 1 {
		t.Fatalf("%d messages reached the sandbox, want 1: %+v", len(msgs), msgs)
	}
	m := msgs[0]
	if m.To != "+905321000003" || !strings.Contains(m.Body, "Merhaba Baran, kodunuz "+testCode) {
		t.Errorf("sent %q to %s; want the row of b with the placeholder code, to +905321000003", m.Body, m.To)
	}
	if !res.Test || res.MessageID != m.SID || res.UserID != "b" || strings.Contains(res.To, "1000003") || res.Code != testCode {
		t.Errorf("printed %+v; want the sandbox's SID %s and a masked address", res, m.SID)
	}
	nothingPlanned(t, count)
	if n := count(`SELECT count(*) FROM send_log WHERE campaign_id = 0 AND status = 'test' AND user_id = 'b' AND provider_message_id = '` + m.SID + `'`); n != 1 {
		t.Errorf("%d test entries in send_log, want 1", n)
	}

	// The first row without --test-user; a user_id that is not in the audience is named and nothing is sent.
	out, stderr, code = cli(t, env, "launch", "--name", "yaz", "--channel", "sms", "--audience", audience,
		"--message", testPrefix+"Merhaba {{.first_name}}", "--test-to", "+905321000001", "--yes")
	if code != 0 || !strings.Contains(out, "user_id a") || len(sb.Messages()) != 2 || !strings.Contains(sb.Messages()[1].Body, "Merhaba Ada") {
		t.Fatalf("first row: exit %d\n%s%s", code, out, stderr)
	}
	_, stderr, code = cli(t, env, "launch", "--name", "yaz", "--channel", "sms", "--audience", audience,
		"--message", testPrefix+"Merhaba {{.first_name}}", "--test-to", "+905321000001", "--test-user", "nobody-42", "--yes")
	if code != 2 || !strings.Contains(stderr, `"nobody-42"`) || len(sb.Messages()) != 2 {
		t.Fatalf("unknown --test-user: exit %d, %d messages, %s", code, len(sb.Messages()), stderr)
	}
	// One that is an e-mail address is masked where the error names it, as everywhere.
	_, stderr, code = cli(t, env, "launch", "--name", "yaz", "--channel", "sms", "--audience", audience,
		"--message", testPrefix+"Merhaba {{.first_name}}", "--test-to", "+905321000001", "--test-user", "ayse.nonexist@example.com", "--yes")
	if code != 2 || strings.Contains(stderr, "ayse.nonexist") || !strings.Contains(stderr, "a***@example.com") {
		t.Fatalf("unknown --test-user that is an e-mail address: exit %d, %s", code, stderr)
	}
	// A code pool the campaign would be refused for refuses its test too, before anything is sent.
	for _, pool := range []string{"nosuch", "BAD POOL!"} {
		_, stderr, code = cli(t, env, "launch", "--name", "yaz", "--channel", "sms", "--audience", audience,
			"--message", testPrefix+"Merhaba {{.first_name}} {{.code}}", "--code-pool", pool, "--test-to", "+905321000001", "--yes")
		if code != 2 || !strings.Contains(stderr, "code pool") || len(sb.Messages()) != 2 {
			t.Fatalf("--code-pool %q: exit %d, %d messages, %s", pool, code, len(sb.Messages()), stderr)
		}
	}
	nothingPlanned(t, count)
}

func TestTestSendRefusesAnInvalidAddress(t *testing.T) {
	t.Parallel()
	env, sb, count, _ := testSendEnv(t)
	audience := writeFile(t, "a.sql", "SELECT user_id, phone, first_name FROM customers")
	for _, c := range []struct{ channel, to string }{{"sms", "12ab"}, {"sms", "kampanya@example.com"}, {"email", "+905321000001"}, {"email", "not an e-mail"}} {
		args := []string{"launch", "--name", "yaz", "--channel", c.channel, "--audience", audience,
			"--message", testPrefix + "Merhaba {{.first_name}}", "--test-to", c.to, "--yes"}
		if c.channel == "email" {
			args = append(args, "--subject", "Merhaba") // an SMS has none
		}
		_, stderr, code := cli(t, env, args...)
		if code != 2 || !strings.Contains(stderr, "not a valid") {
			t.Errorf("%s --test-to %q: exit %d, %s", c.channel, c.to, code, stderr)
		}
	}
	if n := len(sb.Messages()); n != 0 {
		t.Errorf("%d messages sent to invalid addresses", n)
	}
	if n := count(`SELECT count(*) FROM send_log`); n != 0 {
		t.Errorf("%d send_log entries for refused tests", n)
	}
	nothingPlanned(t, count)
}

func TestTestSendNeedsConsentUnlessTransactional(t *testing.T) {
	t.Parallel()
	env, sb, count, db := testSendEnv(t)
	audience := writeFile(t, "a.sql", "SELECT user_id, phone, first_name FROM customers")
	_, stderr, code := cli(t, env, "launch", "--name", "yaz", "--channel", "sms", "--audience", audience,
		"--message", testPrefix+"Merhaba {{.first_name}}", "--test-to", "+905329999999", "--yes")
	if code != 2 || !strings.Contains(stderr, "no İYS consent") || len(sb.Messages()) != 0 {
		t.Fatalf("no consent: exit %d, %d sent, %s", code, len(sb.Messages()), stderr)
	}
	if _, err := db.Exec(context.Background(), `UPDATE iys_consents SET status = 'RET' WHERE recipient = '+905321000003'`); err != nil {
		t.Fatal(err)
	}
	_, stderr, code = cli(t, env, "launch", "--name", "yaz", "--channel", "sms", "--audience", audience,
		"--message", testPrefix+"Merhaba {{.first_name}}", "--test-to", "+905321000003", "--yes")
	if code != 2 || !strings.Contains(stderr, "RET") || len(sb.Messages()) != 0 {
		t.Fatalf("RET: exit %d, %d sent, %s", code, len(sb.Messages()), stderr)
	}
	out, stderr, code := cli(t, env, "launch", "--name", "yaz", "--channel", "sms", "--audience", audience, "--transactional",
		"--message", "Siparişiniz yola çıktı, {{.first_name}}", "--test-to", "+905329999999", "--yes")
	if code != 0 || len(sb.Messages()) != 1 || sb.Messages()[0].To != "+905329999999" {
		t.Fatalf("transactional: exit %d, %d sent\n%s%s", code, len(sb.Messages()), out, stderr)
	}
	nothingPlanned(t, count)
}

func TestTestSendEmailCarriesTheUnsubscribeHeaders(t *testing.T) {
	t.Parallel()
	env, sb, count, db := testSendEnv(t)
	for _, sql := range []string{
		`CREATE TABLE mail_customers (user_id text, email text, first_name text)`,
		`GRANT SELECT ON mail_customers TO campaignctl_audience`,
		`INSERT INTO mail_customers VALUES ('m1', 'ada@example.com', 'Ada')`,
		`INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date)
		 VALUES ('tester@example.com', 'EPOSTA', 'BIREYSEL', 'ONAY', 'HS_WEB', now())`,
	} {
		if _, err := db.Exec(context.Background(), sql); err != nil {
			t.Fatal(err)
		}
	}
	audience := writeFile(t, "m.sql", "SELECT user_id, email, first_name FROM mail_customers")
	html := writeFile(t, "m.html", `<p>Merhaba {{.first_name}}, kodunuz <b>{{.code}}</b> <a href="{{.unsubscribe_url}}">çık</a></p>`)
	out, stderr, code := cli(t, env, "launch", "--name", "mail", "--channel", "email", "--audience", audience, "--code-pool", "small",
		"--subject", "{{.first_name}}, size özel", "--message", "Merhaba {{.first_name}}, kodunuz {{.code}}", "--html", html,
		"--test-to", "Tester@Example.com", "--yes")
	if code != 0 {
		t.Fatalf("e-mail test send: exit %d\n%s%s", code, out, stderr)
	}
	msgs := sb.Messages()
	if len(msgs) != 1 {
		t.Fatalf("%d messages, want 1", len(msgs))
	}
	m := msgs[0]
	if m.To != "tester@example.com" || m.Subject != "Ada, size özel" || !strings.Contains(m.Body, testCode) || !strings.Contains(m.HTML, "<b>"+testCode+"</b>") {
		t.Errorf("sent %+v", m)
	}
	if lu := m.Headers["List-Unsubscribe"]; !strings.HasPrefix(lu, "<https://hooks.example.com/") || m.Headers["List-Unsubscribe-Post"] != "List-Unsubscribe=One-Click" || !strings.Contains(m.HTML, "https://hooks.example.com/") {
		t.Errorf("headers %v, HTML %s: want the one-click unsubscribe link a worker adds", m.Headers, m.HTML)
	}
	nothingPlanned(t, count)

	// The tester follows the link: it works, says it is a test's, and records nothing (the tester's own
	// consent stays). It was refused as "not valid", and webhooks blamed UNSUBSCRIBE_SECRET.
	link := strings.TrimSuffix(strings.TrimPrefix(m.Headers["List-Unsubscribe"], "<"), ">")
	if i := strings.Index(link, ">"); i >= 0 {
		link = link[:i]
	}
	signer, err := unsubscribe.New(env["UNSUBSCRIBE_SECRET"], env["WEBHOOKS_PUBLIC_URL"])
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	h := unsubscribeHandler(signer, campaign.NewStore(db), &refusalSink{pool: db, brand: "654321", log: log}, 0, log)
	for _, req := range []*http.Request{
		httptest.NewRequest(http.MethodGet, strings.TrimPrefix(link, env["WEBHOOKS_PUBLIC_URL"]), nil),
		httptest.NewRequest(http.MethodPost, strings.TrimPrefix(link, env["WEBHOOKS_PUBLIC_URL"]), strings.NewReader("List-Unsubscribe=One-Click")),
	} {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "Test message") {
			t.Errorf("%s of the test send's unsubscribe link %s: %d\n%s", req.Method, link, rec.Code, rec.Body.String())
		}
	}
	var status string
	var refusals int
	db.QueryRow(context.Background(), `SELECT status FROM iys_consents WHERE recipient = 'tester@example.com'`).Scan(&status) //nolint:errcheck
	db.QueryRow(context.Background(), `SELECT count(*) FROM refusals`).Scan(&refusals)                                        //nolint:errcheck
	if status != "ONAY" || refusals != 0 {
		t.Errorf("after the test link was used: the tester's consent %s, %d refusals; want ONAY and none", status, refusals)
	}
}

func TestTestSendEmailDryRunPreview(t *testing.T) {
	t.Parallel()
	env, sb, count, db := testSendEnv(t)
	for _, sql := range []string{
		`CREATE TABLE mail_customers (user_id text, email text, first_name text)`,
		`GRANT SELECT ON mail_customers TO campaignctl_audience`,
		`INSERT INTO mail_customers VALUES ('m1', 'ada@example.com', 'Ada')`,
		`INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date)
		 VALUES ('ada@example.com', 'EPOSTA', 'BIREYSEL', 'ONAY', 'HS_WEB', now())`,
	} {
		if _, err := db.Exec(context.Background(), sql); err != nil {
			t.Fatal(err)
		}
	}
	audience := writeFile(t, "m.sql", "SELECT user_id, email, first_name FROM mail_customers")
	html := writeFile(t, "m.html", `<p>Merhaba {{.first_name}}</p>`)
	dir := filepath.Join(t.TempDir(), "preview")
	out, stderr, code := cli(t, env, "launch", "--name", "mail", "--channel", "email", "--audience", audience,
		"--subject", "{{.first_name}}, size özel", "--message", "Merhaba {{.first_name}} metin", "--html", html,
		"--dry-run", "--preview-dir", dir)
	if code != 0 {
		t.Fatalf("dry run: exit %d\n%s%s", code, out, stderr)
	}
	for _, want := range []string{"from:    kampanya@example.com", "subject: Ada, size özel", "    Merhaba Ada metin"} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run output lacks %q:\n%s", want, out)
		}
	}
	for name, want := range map[string]string{"preview.html": "<p>Merhaba Ada</p>", "preview.txt": "Merhaba Ada metin"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", name, b, err, want)
		}
	}
	if len(sb.Messages()) != 0 || count(`SELECT count(*) FROM campaigns`) != 0 {
		t.Errorf("a dry run sent or wrote something")
	}
}

// A test send fails closed: with Redis unreachable (the provider's rate limit cannot be read) nothing
// goes out, and the command says why.
func TestTestSendSendsNothingWithoutRedis(t *testing.T) {
	t.Parallel()
	env, sb, count, _ := testSendEnv(t)
	env["REDIS_URL"] = "redis://127.0.0.1:1/0"
	audience := writeFile(t, "a.sql", "SELECT user_id, phone, first_name FROM customers")
	_, stderr, code := cli(t, env, "launch", "--name", "yaz", "--channel", "sms", "--audience", audience,
		"--message", testPrefix+"Merhaba {{.first_name}}", "--test-to", "+905321000001", "--yes")
	if code == 0 || !strings.Contains(strings.ToLower(stderr), "redis") {
		t.Fatalf("test send with Redis down: exit %d, %s; want a failure naming Redis", code, stderr)
	}
	if n := len(sb.Messages()); n != 0 {
		t.Fatalf("%d messages sent while Redis was unreachable", n)
	}
	if n := count(`SELECT count(*) FROM send_log`); n != 0 {
		t.Fatalf("%d send_log entries for a test that was not sent", n)
	}
	nothingPlanned(t, count)
}

// A test send the provider refuses for the account (a wrong auth token: 401, code 20003) says which
// settings to check, without printing the token.
func TestTestSendRefusedForTheAccountNamesTheSettings(t *testing.T) {
	t.Parallel()
	env, _, count, _ := testSendEnv(t)
	sb := sandbox.New(sandbox.Options{TwilioAccountSID: env["TWILIO_ACCOUNT_SID"], TwilioAuthToken: "righttoken"})
	srv := httptest.NewServer(sb)
	t.Cleanup(srv.Close)
	env["TWILIO_BASE_URL"], env["TWILIO_AUTH_TOKEN"] = srv.URL, "Wr0ngT0ken"
	audience := writeFile(t, "a.sql", "SELECT user_id, phone, first_name FROM customers")
	_, stderr, code := cli(t, env, "launch", "--name", "yaz", "--channel", "sms", "--audience", audience,
		"--message", testPrefix+"Merhaba {{.first_name}}", "--test-to", "+905321000001", "--yes")
	if code == 0 || !strings.Contains(stderr, "refuses the account") || !strings.Contains(stderr, "TWILIO_ACCOUNT_SID, TWILIO_AUTH_TOKEN, TWILIO_FROM") {
		t.Errorf("a test send with a wrong token: exit %d, %s; want the settings to check named", code, stderr)
	}
	if strings.Contains(stderr, "Wr0ngT0ken") {
		t.Errorf("the token was printed: %s", stderr)
	}
	if n := len(sb.Messages()); n != 0 {
		t.Errorf("%d messages accepted with a wrong token", n)
	}
	nothingPlanned(t, count)
}

// The test send's placeholder code can never be a pool's code: an import of it is refused and writes
// nothing. Before, "TEST-KOD" could be imported, given to a recipient, and shown to everyone a test went to.
func TestTheTestPlaceholderIsNoPoolsCode(t *testing.T) {
	t.Parallel()
	env, _ := badInputDB(t)
	file := filepath.Join(t.TempDir(), "codes.txt")
	if err := os.WriteFile(file, []byte(testCode+"\nKOD-0002\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, stderr, code := cli(t, env, "codes", "import", "--pool", "tk", file)
	if code != 2 || !strings.Contains(stderr, testCode) {
		t.Fatalf("codes import of the placeholder %q: exit %d\n%s%s\nwant it refused (exit 2), naming it", testCode, code, out, stderr)
	}
}

// A launch refused before it counted the pool's free codes (Postgres went away, say) does not report the
// pool as empty: it said "codes needed / free 10 / 0" for a pool with 5,882 free codes.
func TestARefusedLaunchShowsTheFreeCodesOnlyOnceCounted(t *testing.T) {
	t.Parallel()
	for _, counted := range []bool{false, true} {
		var errb strings.Builder
		a := &app{stderr: &errb}
		a.printRefused(campaign.Report{Name: "w1", Channel: campaign.ChannelSMS, Audience: 10, Eligible: 10, CodePool: "p7", CodesNeeded: 10, CodesFree: 5882 * map[bool]int64{false: 0, true: 1}[counted], CodesCounted: counted})
		if got := strings.Contains(errb.String(), "codes needed / free"); got != counted {
			t.Errorf("counted %v: the report shows the free codes: %v\n%s", counted, got, errb.String())
		}
	}
}
