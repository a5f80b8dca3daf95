package main

import (
	"context"
	"encoding/json"
	"html"
	"image/png"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/internal/testredis"
)

// uiCampaignName is the test campaign's name; uiReason, a failure reason as a provider might word it, holds
// HTML, to show the pages escape what they did not write.
const (
	uiCampaignName = "Yaz fırsatı 2026"
	uiFailReason   = `invalid_number <b>"x"</b> & co`
)

// uiLaunched launches a campaign to the 3 customers of badInputDB (no worker runs: it stays running
// with one batch queued) and gives it figures: a sent, a failed (invalid_number) and sends in send_log
// over the last seconds for the rate and the chart. It returns the env and the campaign's ID.
func uiLaunched(t *testing.T, sends int) (map[string]string, string) {
	t.Helper()
	env, _ := badInputDB(t)
	audience := writeFile(t, "a.sql", `SELECT user_id, phone, first_name FROM customers`)
	out, stderr, code := cli(t, env, "launch", "--name", uiCampaignName, "--channel", "sms", "--audience", audience,
		"--message", testPrefix+"Merhaba {{.first_name}}", "--yes", "--json")
	if code != 0 {
		t.Fatalf("launch: exit %d %s", code, stderr)
	}
	var rep struct{ ID int64 }
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.ID == 0 {
		t.Fatalf("launch --json: %v %s", err, out)
	}
	ctx := context.Background()
	db, err := pgxpool.New(ctx, env["DATABASE_URL"])
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range []string{
		`UPDATE campaign_recipients SET status = 'sent' WHERE campaign_id = $1 AND user_id = 'a'`,
		`UPDATE campaign_recipients SET status = 'failed', reason = $2 WHERE campaign_id = $1 AND user_id = 'b'`,
		`INSERT INTO send_log (campaign_id, user_id, status, at) VALUES ($1, 'b', 'failed', now() - interval '2 seconds')`,
	} {
		args := []any{rep.ID}
		if strings.Contains(q, "$2") {
			args = append(args, uiFailReason)
		}
		if _, err := db.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// Sends spread over the last four minutes, a few each second (the chart), the last ones within the rate
	// window.
	if _, err := db.Exec(ctx, `INSERT INTO send_log (campaign_id, user_id, status, at)
		SELECT $1, 'a', 'sent', now() - make_interval(secs => ((i * i) % 257) % 240) - interval '1 second' * 0.5
		FROM generate_series(1, $2::int) i`, rep.ID, sends); err != nil {
		t.Fatal(err)
	}
	return env, jsonNumber(rep.ID)
}

// uiState reads the campaign's state with campaignctl status --json.
func uiState(t *testing.T, env map[string]string, id string) string {
	t.Helper()
	out, stderr, code := cli(t, env, "status", id, "--json")
	var st struct{ State string }
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil {
		t.Fatalf("status %s: exit %d %s %s", id, code, out, stderr)
	}
	return st.State
}

func uiWant(t *testing.T, what, body string, want ...string) {
	t.Helper()
	for _, s := range want {
		if !strings.Contains(body, s) {
			t.Errorf("%s does not show %q:\n%s", what, s, tail(body, 4000))
		}
	}
}

func TestUICampaignsPages(t *testing.T) {
	t.Parallel()
	env, id := uiLaunched(t, 30)
	ui := uiStart(t, env, "--addr", "127.0.0.1:0")
	if !strings.Contains(ui.stderr.String(), "/campaigns") {
		t.Errorf("stderr does not give the campaigns URL: %s", ui.stderr)
	}

	code, hdr, body := uiDo(t, "GET", ui.base+"/campaigns", nil)
	if code != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /campaigns: %d %s %s", code, hdr.Get("Content-Type"), body)
	}
	uiWant(t, "the list", body, `href="/campaigns/`+id+`"`, uiCampaignName, "sms", "running",
		`<progress max="3" value="2">`, "2/3 (66.7%)", "<td class=\"n\">1</td><td class=\"n\">1</td><td class=\"n\">0</td><td class=\"n\">0</td>",
		"no_worker", "campaignctl worker", "/s</td>", `href="/"`)

	page := ui.base + "/campaigns/" + id
	code, _, body = uiDo(t, "GET", page, nil)
	if code != 200 {
		t.Fatalf("GET %s: %d %s", page, code, body)
	}
	uiWant(t, "the campaign page", body, uiCampaignName, "<th>Planned</th><td class=\"n\">3</td>", "<th>Pending</th><td class=\"n\">1</td>",
		"invalid_number &lt;b&gt;&#34;x&#34;&lt;/b&gt; &amp; co", "<svg", "<rect", "30 sent", "Batches in the queue", "<td>pending</td><td class=\"n\">1</td>",
		"Rate now", "ETA", `action="/campaigns/`+id+`/pause"`, `action="/campaigns/`+id+`/cancel"`, "return confirm(")
	if strings.Contains(body, "<b>\"x\"") {
		t.Errorf("the campaign page shows a failure reason unescaped")
	}
	if strings.Contains(body, "/resume\"") {
		t.Errorf("a running campaign shows a resume button")
	}
	if code, _, _ := uiDo(t, "GET", ui.base+"/campaigns/999999", nil); code != http.StatusNotFound {
		t.Errorf("GET an unknown campaign: %d, want 404", code)
	}

	// A cross-site form cannot pause it.
	if code, _, _ := uiDo(t, "POST", page+"/pause", map[string]string{"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}); code != http.StatusForbidden {
		t.Errorf("cross-site pause: %d, want 403", code)
	}
	if s := uiState(t, env, id); s != "running" {
		t.Fatalf("after a cross-site pause the campaign is %s", s)
	}
	// The page's pause button pauses it (the redirect lands on the page, which says so).
	code, _, body = uiDo(t, "POST", page+"/pause", map[string]string{"Origin": ui.base, "Sec-Fetch-Site": "same-origin"})
	if code != 200 || !strings.Contains(body, "Paused: no new send starts") || !strings.Contains(body, `/resume"`) || strings.Contains(body, `/pause"`) {
		t.Fatalf("pause from the page: %d %s", code, tail(body, 3000))
	}
	if s := uiState(t, env, id); s != "paused" {
		t.Fatalf("after pause from the page the campaign is %s, want paused", s)
	}
	// Pausing it again (a page left open) is done already, as on the command line.
	if code, _, body := uiDo(t, "POST", page+"/pause", nil); code != 200 || uiState(t, env, id) != "paused" {
		t.Errorf("pause a paused campaign: %d %s, want 200 and still paused", code, tail(body, 2000))
	}
	if code, _, body := uiDo(t, "POST", page+"/resume", nil); code != 200 || uiState(t, env, id) != "running" {
		t.Fatalf("resume from the page: %d %s; campaign %s", code, tail(body, 2000), uiState(t, env, id))
	}
	if code, _, _ := uiDo(t, "POST", page+"/explode", nil); code != http.StatusNotFound {
		t.Errorf("POST an unknown action: %d, want 404", code)
	}
}

func TestUICampaignsReadOnly(t *testing.T) {
	t.Parallel()
	env, id := uiLaunched(t, 5)
	ui := uiStart(t, env, "--addr", "127.0.0.1:0", "--read-only")
	page := ui.base + "/campaigns/" + id
	code, _, body := uiDo(t, "GET", page, nil)
	if code != 200 || !strings.Contains(body, "invalid_number") {
		t.Fatalf("GET %s read-only: %d %s", page, code, body)
	}
	if strings.Contains(body, "<form") || strings.Contains(body, "<button") {
		t.Errorf("the read-only page shows buttons:\n%s", tail(body, 3000))
	}
	for _, action := range []string{"pause", "cancel", "resume", "explode"} {
		if code, _, _ := uiDo(t, "POST", page+"/"+action, nil); code != http.StatusForbidden {
			t.Errorf("POST %s read-only: %d, want 403", action, code)
		}
	}
	if code, _, _ := uiDo(t, "DELETE", page, nil); code != http.StatusForbidden {
		t.Errorf("DELETE read-only: %d, want 403", code)
	}
	if s := uiState(t, env, id); s != "running" {
		t.Fatalf("after POSTs to the read-only UI the campaign is %s", s)
	}
	if code, _, body := uiDo(t, "GET", ui.base+"/campaigns", nil); code != 200 || !strings.Contains(body, "/campaigns/"+id) {
		t.Fatalf("GET /campaigns read-only: %d %s", code, body)
	}
}

// TestUICampaignsInChromium renders both campaign pages in headless Chromium and takes their screenshots
// (written to docs/ui-campaigns.png and docs/ui-campaign.png with UPDATE_UI_SCREENSHOT=1).
func TestUICampaignsInChromium(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("browser test skipped in -short mode")
	}
	chromium := uiChromium(t)
	env, id := uiLaunched(t, 600)
	ui := uiStart(t, env, "--addr", "127.0.0.1:0")
	for _, p := range []struct{ path, shot string }{{"/campaigns", "ui-campaigns.png"}, {"/campaigns/" + id, "ui-campaign.png"}} {
		text := uiText(uiBrowse(t, chromium, ui.base+p.path, "--dump-dom"))
		uiWant(t, p.path+" in Chromium", text, uiCampaignName, "running", "2/3 (66.7%)", "no_worker")
		if strings.Contains(p.path, id) {
			uiWant(t, p.path+" in Chromium", text, "invalid_number &lt;b&gt;\"x\"&lt;/b&gt; &amp; co", "Pause", "Cancel campaign", "600 sent")
		}
		shot := filepath.Join(t.TempDir(), p.shot)
		if os.Getenv("UPDATE_UI_SCREENSHOT") == "1" {
			shot = filepath.Join("..", "..", "docs", p.shot)
		}
		uiBrowse(t, chromium, ui.base+p.path, "--screenshot="+shot, "--window-size=1400,900")
		f, err := os.Open(shot)
		if err != nil {
			t.Fatalf("no screenshot: %v", err)
		}
		img, err := png.Decode(f)
		f.Close()
		if err != nil {
			t.Fatalf("screenshot %s is not a PNG: %v", shot, err)
		}
		if n := uiColours(img); n < 8 {
			t.Errorf("screenshot of %s has %d colours: a blank page", p.path, n)
		}
		t.Logf("screenshot: %s", shot)
	}
}

// Without Postgres the queue pages still work and the campaign pages say what is wrong.
func TestUICampaignsWithoutPostgres(t *testing.T) {
	t.Parallel()
	_, redisURL := testredis.New(t)
	ui := uiStart(t, map[string]string{"REDIS_URL": redisURL, "DATABASE_URL": "postgres://campaignctl@127.0.0.1:1/campaignctl"}, "--addr", "127.0.0.1:0")
	if code, _, body := uiDo(t, "GET", ui.base+"/campaigns", nil); code != http.StatusServiceUnavailable || !strings.Contains(body, "Postgres is not reachable at 127.0.0.1:1") {
		t.Errorf("GET /campaigns without Postgres: %d %s; want 503 naming the database", code, body)
	}
	if code, _, body := uiDo(t, "GET", ui.base+"/", nil); code != 200 || !strings.Contains(body, "<title>Asynq - Monitoring</title>") {
		t.Errorf("GET / without Postgres: %d %.300s", code, body)
	}
}

// With Redis gone after the start, the list still shows the campaigns from Postgres, and says so.
func TestUICampaignsWithoutRedis(t *testing.T) {
	t.Parallel()
	env, _ := uiLaunched(t, 0)
	srv := testredis.StartServer(t)
	env["REDIS_URL"] = srv.URL()
	ui := uiStart(t, env, "--addr", "127.0.0.1:0")
	srv.Kill()
	code, _, body := uiDo(t, "GET", ui.base+"/campaigns", nil)
	if code != http.StatusOK || !strings.Contains(body, html.EscapeString(uiCampaignName)) || !strings.Contains(body, "Redis is unreachable") {
		t.Fatalf("GET /campaigns with Redis down: %d %.600s; want the campaign from Postgres and a note", code, body)
	}
}
