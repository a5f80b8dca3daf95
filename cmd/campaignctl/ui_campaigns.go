package main

import (
	"context"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/worker"
)

// uiRateWindow is how far back the campaign pages count outcomes for the rate now (and the ETA at it).
const uiRateWindow = 10 * time.Second

// uiChartWindow is how far back the campaign page charts the sends per second.
const uiChartWindow = 5 * time.Minute

// uiCancelWait bounds how long a cancel from the page waits for workers to let go of their batches: a
// browser should not hang for the CLI's minute; what is still held is closed by the workers and shown.
const uiCancelWait = 10 * time.Second

// uiCampaigns serves the campaign pages of `campaignctl ui`: /campaigns lists them, /campaigns/{id} shows
// one with its pause, resume and cancel buttons. It reads the engine database, opened on the first
// request (the queue pages work without Postgres), and the UI's Redis.
type uiCampaigns struct {
	open     func(context.Context) (*pgxpool.Pool, error)
	redis    *redis.Client
	readOnly bool
	log      *slog.Logger

	mu   sync.Mutex
	pool *pgxpool.Pool
}

// register adds the campaign routes to mux. Their fallbacks keep every /campaigns path away from
// asynqmon, and refuse any change in read-only mode with 403.
func (u *uiCampaigns) register(mux *http.ServeMux) {
	mux.HandleFunc("GET /campaigns", u.list)
	mux.HandleFunc("GET /campaigns/{id}", u.show)
	mux.HandleFunc("POST /campaigns/{id}/{action}", u.act)
	fallback := func(w http.ResponseWriter, r *http.Request) {
		if u.readOnly && r.Method != http.MethodGet && r.Method != http.MethodHead {
			http.Error(w, "403 Forbidden: this UI is read-only (--read-only)", http.StatusForbidden)
			return
		}
		http.NotFound(w, r)
	}
	mux.HandleFunc("/campaigns", fallback)
	mux.HandleFunc("/campaigns/", fallback)
}

// Close releases the engine database, if it was opened.
func (u *uiCampaigns) Close() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.pool != nil {
		u.pool.Close()
	}
}

// db opens the engine database once; a failure is retried on the next request, so that the page works
// as soon as Postgres does.
func (u *uiCampaigns) db(ctx context.Context) (*pgxpool.Pool, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.pool == nil {
		pool, err := u.open(ctx)
		if err != nil {
			return nil, err
		}
		u.pool = pool
	}
	return u.pool, nil
}

// uiRow is one campaign as the pages show it.
type uiRow struct {
	worker.CampaignStatus
	Done    int64
	Percent float64
	// Rate is the outcomes per second over uiRateWindow, and ETA the time left at it; both empty unless
	// the campaign is running and sending.
	Rate, ETA string
}

func uiRowOf(ctx context.Context, pool *pgxpool.Pool, s worker.CampaignStatus) (uiRow, error) {
	r := uiRow{CampaignStatus: s, Done: s.Planned - s.Pending}
	if s.Planned > 0 {
		r.Percent = float64(r.Done) * 100 / float64(s.Planned)
	}
	if s.State != campaign.StateRunning || s.Pending == 0 {
		return r, nil
	}
	// The window's entries of send_log, found through its BRIN index on at and then filtered by campaign;
	// only for the running campaigns.
	var n int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM send_log WHERE campaign_id = $1 AND at > now() - $2::interval
		AND status IN ($3, $4, $5, $6)`, s.ID, uiRateWindow.String(), campaign.StatusSent, campaign.StatusFailed,
		campaign.StatusSkipped, campaign.StatusUnknown).Scan(&n); err != nil {
		return r, fmt.Errorf("rate of campaign %d: %w", s.ID, err)
	}
	if n > 0 {
		rate := float64(n) / uiRateWindow.Seconds()
		r.Rate = strconv.FormatFloat(rate, 'f', 1, 64) + "/s"
		r.ETA = eta(s.Pending, rate)
	}
	return r, nil
}

func (u *uiCampaigns) list(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	pool, err := u.db(ctx)
	if err != nil {
		u.fail(w, err)
		return
	}
	all, err := worker.ListStatus(ctx, worker.StatusOptions{Store: campaign.NewStore(pool), Redis: u.redis})
	note := ""
	if err != nil && u.redis.Ping(ctx).Err() != nil {
		// As campaignctl status: the campaigns' state is in Postgres, and the page says what is missing.
		all, err = worker.ListStatus(ctx, worker.StatusOptions{Store: campaign.NewStore(pool)})
		note = "Redis is unreachable: the figures are Postgres's alone (no DLQ count, no waiting reason), and nothing is sent until it is back."
	}
	if err != nil {
		u.fail(w, err)
		return
	}
	rows := make([]uiRow, 0, len(all))
	for _, s := range all {
		row, err := uiRowOf(ctx, pool, s)
		if err != nil {
			u.fail(w, err)
			return
		}
		rows = append(rows, row)
	}
	u.render(w, http.StatusOK, "list", map[string]any{"Title": "Campaigns", "Rows": rows, "Note": note})
}

// uiPage is what the campaign page shows.
type uiPage struct {
	Title    string
	Row      uiRow
	Failed   []uiReason
	Skipped  []uiReason
	Chart    uiChart
	Batches  []uiReason
	ReadOnly bool
	Note     string
	// Pausable, Resumable and Cancellable say which buttons the campaign's state allows.
	Pausable, Resumable, Cancellable bool
}

// uiReason is a count with its label: a failure or skip reason, or a queue state.
type uiReason struct {
	Name  string
	Count int64
}

func (u *uiCampaigns) show(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	id, err := parseID(r.PathValue("id"))
	if err != nil {
		http.NotFound(w, r)
		return
	}
	pool, err := u.db(ctx)
	if err != nil {
		u.fail(w, err)
		return
	}
	s, err := worker.Status(ctx, worker.StatusOptions{Store: campaign.NewStore(pool), Redis: u.redis, CampaignID: id})
	if err != nil {
		u.fail(w, err)
		return
	}
	row, err := uiRowOf(ctx, pool, s)
	if err != nil {
		u.fail(w, err)
		return
	}
	chart, err := uiSendsChart(ctx, pool, id, time.Now())
	if err != nil {
		u.fail(w, err)
		return
	}
	batches, err := uiBatchStates(u.redis, id)
	if err != nil {
		u.fail(w, err)
		return
	}
	p := uiPage{Title: fmt.Sprintf("Campaign %d: %s", s.ID, s.Name), Row: row, Failed: uiSorted(s.FailedByReason),
		Skipped: uiSorted(s.SkippedByReason), Chart: chart, Batches: batches, ReadOnly: u.readOnly,
		Note:        uiNotes[r.URL.Query().Get("done")],
		Pausable:    s.State == campaign.StateRunning || s.State == campaign.StateScheduled,
		Resumable:   s.State == campaign.StatePaused,
		Cancellable: s.State == campaign.StateRunning || s.State == campaign.StateScheduled || s.State == campaign.StatePaused}
	u.render(w, http.StatusOK, "campaign", p)
}

// uiNotes are the lines the campaign page shows after an action redirected to it (?done=ACTION); any
// other value shows nothing, so that a link cannot put words on the page.
var uiNotes = map[string]string{
	"pause":  "Paused: no new send starts on any worker.",
	"resume": "Resumed: its batches are queued again.",
	"cancel": "Cancelled: nothing more is sent; unsent recipients are skipped and their codes went back to the pool.",
	// The action is recorded in Postgres, but this UI could not write the halt mark to Redis.
	"pause-late": "Paused in Postgres, but this UI could not reach Redis to stop the sends at once: each worker stops at its next chunk, " +
		"after the sends of the chunk it holds. Press Pause again once Redis is reachable from here to stop them at once.",
	"cancel-late": "Cancelled in Postgres, but this UI could not reach Redis to stop the sends at once: each worker stops at its next chunk, " +
		"after the sends of the chunk it holds; then unsent recipients are skipped and their codes go back to the pool.",
}

// uiActions are the actions a campaign page's buttons post.
var uiActions = map[string]bool{"pause": true, "resume": true, "cancel": true}

func (u *uiCampaigns) act(w http.ResponseWriter, r *http.Request) {
	if u.readOnly {
		http.Error(w, "403 Forbidden: this UI is read-only (--read-only)", http.StatusForbidden)
		return
	}
	// A closed tab must not stop an action half-way (a cancel recorded, its batches not closed yet).
	ctx, stop := context.WithTimeout(context.WithoutCancel(r.Context()), uiCancelWait+30*time.Second)
	defer stop()
	id, err := parseID(r.PathValue("id"))
	if err != nil {
		http.NotFound(w, r)
		return
	}
	action := r.PathValue("action")
	if !uiActions[action] {
		http.NotFound(w, r)
		return
	}
	pool, err := u.db(ctx)
	if err != nil {
		u.fail(w, err)
		return
	}
	store := campaign.NewStore(pool)
	halted := true // whether the halt mark of a pause or cancel is in Redis
	switch action {
	case "pause":
		var rep worker.PauseReport
		rep, err = worker.Pause(ctx, worker.PauseOptions{Store: store, Redis: u.redis, CampaignID: id, Logger: u.log})
		halted = rep.Halted
	case "resume":
		_, err = worker.Resume(ctx, worker.ResumeOptions{Store: store, Redis: u.redis, CampaignID: id})
	case "cancel":
		host, _ := os.Hostname()
		var rep worker.CancelReport
		rep, err = worker.Cancel(ctx, worker.CancelOptions{Store: store, Redis: u.redis, CampaignID: id, Wait: uiCancelWait,
			Owner: fmt.Sprintf("%s:%d:ui-cancel", host, os.Getpid()), Logger: u.log})
		halted = rep.Halted
	}
	if err != nil {
		u.fail(w, err)
		return
	}
	done := action
	if !halted {
		done += "-late"
	}
	u.log.Info("campaign changed from the ui", "campaign_id", id, "action", action, "halted_in_redis", halted)
	http.Redirect(w, r, fmt.Sprintf("/campaigns/%d?done=%s", id, done), http.StatusSeeOther)
}

// fail answers an error as a page: 404 for an unknown campaign, 409 for an action its state (or its
// consents' age) refuses, 503 otherwise (Postgres or Redis unreachable, mostly).
func (u *uiCampaigns) fail(w http.ResponseWriter, err error) {
	code := http.StatusServiceUnavailable
	switch {
	case errors.Is(err, campaign.ErrNotFound):
		code = http.StatusNotFound
	case errors.Is(err, campaign.ErrWrongState), errors.Is(err, campaign.ErrConsentStale):
		code = http.StatusConflict
	default:
		u.log.Error("ui campaign page", "err", err)
	}
	u.render(w, code, "error", map[string]any{"Title": http.StatusText(code), "Err": err.Error()})
}

func (u *uiCampaigns) render(w http.ResponseWriter, code int, name string, data any) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	if err := uiTemplates.ExecuteTemplate(w, name, data); err != nil {
		u.log.Error("ui template", "template", name, "err", err)
	}
}

func uiSorted(m map[string]int64) []uiReason {
	out := make([]uiReason, 0, len(m))
	for k, v := range m {
		out = append(out, uiReason{k, v})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// uiChart is an inline SVG bar chart of sends per second.
type uiChart struct {
	Width, Height int
	Bars          []uiBar
	Max           int64
	Total         int64
	From, To      string
}

type uiBar struct {
	X, Y, W, H float64
	Title      string
}

// uiSendsChart charts the campaign's accepted sends per second over uiChartWindow up to now, from
// send_log grouped by second.
func uiSendsChart(ctx context.Context, pool *pgxpool.Pool, id int64, now time.Time) (uiChart, error) {
	const width, height = 900, 160
	now = now.UTC().Truncate(time.Second)
	from := now.Add(-uiChartWindow)
	rows, err := pool.Query(ctx, `SELECT date_trunc('second', at) AS s, count(*) FROM send_log
		WHERE campaign_id = $1 AND status = $2 AND at > $3 GROUP BY s ORDER BY s`, id, campaign.StatusSent, from)
	if err != nil {
		return uiChart{}, fmt.Errorf("sends per second: %w", err)
	}
	defer rows.Close()
	perSec := map[int]int64{}
	c := uiChart{Width: width, Height: height, From: from.Format("15:04:05"), To: now.Format("15:04:05 UTC")}
	for rows.Next() {
		var at time.Time
		var n int64
		if err := rows.Scan(&at, &n); err != nil {
			return uiChart{}, fmt.Errorf("sends per second: %w", err)
		}
		i := int(at.Sub(from) / time.Second)
		perSec[i] += n
		c.Total += n
		c.Max = max(c.Max, perSec[i])
	}
	if err := rows.Err(); err != nil {
		return uiChart{}, fmt.Errorf("sends per second: %w", err)
	}
	slots := int(uiChartWindow / time.Second)
	w := float64(width) / float64(slots)
	for i, n := range perSec {
		h := float64(n) / float64(c.Max) * (height - 4)
		c.Bars = append(c.Bars, uiBar{X: float64(i) * w, Y: height - h, W: max(w-0.5, 1), H: h,
			Title: fmt.Sprintf("%s: %d sent", from.Add(time.Duration(i)*time.Second).Format("15:04:05"), n)})
	}
	sort.Slice(c.Bars, func(i, j int) bool { return c.Bars[i].X < c.Bars[j].X })
	return c, nil
}

// uiBatchStates counts the campaign's batch tasks in the queue by state, from the asynq Inspector (task
// IDs are "campaign:batch"). It pages through the whole queue: fine for a page a person opens.
func uiBatchStates(rdb *redis.Client, id int64) ([]uiReason, error) {
	insp := asynq.NewInspectorFromRedisClient(rdb)
	prefix := strconv.FormatInt(id, 10) + ":"
	const pageSize = 1000
	states := []struct {
		name string
		list func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error)
	}{
		{"pending", insp.ListPendingTasks}, {"active", insp.ListActiveTasks}, {"scheduled", insp.ListScheduledTasks},
		{"retry", insp.ListRetryTasks}, {"archived (DLQ)", insp.ListArchivedTasks},
	}
	out := make([]uiReason, 0, len(states))
	for _, st := range states {
		var n int64
		for page := 1; ; page++ {
			tasks, err := st.list(worker.Queue, asynq.Page(page), asynq.PageSize(pageSize))
			if err != nil {
				if errors.Is(err, asynq.ErrQueueNotFound) || strings.Contains(err.Error(), "does not exist") {
					break
				}
				return nil, fmt.Errorf("read the queue: %w", err)
			}
			for _, t := range tasks {
				if strings.HasPrefix(t.ID, prefix) {
					n++
				}
			}
			if len(tasks) < pageSize {
				break
			}
		}
		out = append(out, uiReason{st.name, n})
	}
	return out, nil
}

var uiTemplates = template.Must(template.New("").Funcs(template.FuncMap{
	"pct":  func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) + "%" },
	"when": func(t *time.Time) string { return t.Format("2006-01-02 15:04:05 UTC") },
	"f1":   func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) },
}).Parse(`
{{define "head"}}<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{.Title}} · campaignctl</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1f2328;background:#f6f8fa}
header{background:#24292f;color:#fff;padding:10px 24px;display:flex;gap:20px;align-items:center}
header a{color:#fff;text-decoration:none}header strong{font-size:16px}
main{padding:16px 24px}h1{font-size:20px;margin:8px 0 16px}h2{font-size:15px;margin:20px 0 8px}
table{border-collapse:collapse;background:#fff;border:1px solid #d0d7de}
th,td{padding:6px 10px;border-bottom:1px solid #d0d7de;text-align:left;vertical-align:top}
th{background:#eef1f4;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}
progress{width:140px;height:12px;vertical-align:middle}td.p{white-space:nowrap}
.state{padding:1px 7px;border-radius:10px;background:#ddf4ff;font-size:12px}
.wait{color:#9a6700;max-width:360px}.muted{color:#656d76}
.note{background:#dafbe1;border:1px solid #4ac26b;padding:8px 12px;margin-bottom:12px}
.err{background:#ffebe9;border:1px solid #ff8182;padding:8px 12px}
.grid{display:flex;gap:24px;flex-wrap:wrap;align-items:flex-start}
form{display:inline}button{padding:6px 14px;margin-right:8px;border:1px solid #d0d7de;border-radius:6px;background:#f6f8fa;cursor:pointer}
button.danger{color:#cf222e}svg{background:#fff;border:1px solid #d0d7de}
</style></head><body>
<header><strong>campaignctl</strong><a href="/campaigns">Campaigns</a><a href="/">Queues (asynqmon)</a></header>
<main>{{end}}

{{define "foot"}}</main></body></html>{{end}}

{{define "counts"}}<td class="n">{{.Sent}}</td><td class="n">{{.Failed}}</td><td class="n">{{.Skipped}}</td><td class="n">{{.Unknown}}</td>{{end}}

{{define "list"}}{{template "head" .}}
<h1>Campaigns</h1>
{{with .Note}}<div class="note">{{.}}</div>{{end}}
{{if .Rows}}<table>
<tr><th>ID</th><th>Name</th><th>Channel</th><th>State</th><th>Progress</th><th>Sent</th><th>Failed</th><th>Skipped</th><th>Unknown</th><th>Rate</th><th>ETA</th><th>Waiting</th></tr>
{{range .Rows}}<tr>
<td class="n"><a href="/campaigns/{{.ID}}">{{.ID}}</a></td><td><a href="/campaigns/{{.ID}}">{{.Name}}</a></td><td>{{.Channel}}</td>
<td><span class="state">{{.State}}</span></td>
<td class="p"><progress max="{{.Planned}}" value="{{.Done}}"></progress> {{.Done}}/{{.Planned}} ({{pct .Percent}})</td>
{{template "counts" .}}
<td class="n">{{.Rate}}</td><td>{{.ETA}}</td>
<td class="wait">{{with .Waiting}}<b>{{.Reason}}</b>: {{.Detail}}{{end}}</td>
</tr>{{end}}
</table>{{else}}<p class="muted">No campaign yet: campaignctl launch makes one.</p>{{end}}
{{template "foot"}}{{end}}

{{define "campaign"}}{{template "head" .}}
{{with .Note}}<div class="note">{{.}}</div>{{end}}
{{with .Row}}<h1>Campaign {{.ID}}: {{.Name}} <span class="state">{{.State}}</span></h1>
<div class="grid"><table>
<tr><th>Channel</th><td>{{.Channel}}</td></tr>
<tr><th>Progress</th><td class="p"><progress max="{{.Planned}}" value="{{.Done}}"></progress> {{.Done}}/{{.Planned}} ({{pct .Percent}})</td></tr>
<tr><th>Planned</th><td class="n">{{.Planned}}</td></tr><tr><th>Pending</th><td class="n">{{.Pending}}</td></tr>
<tr><th>Sent</th><td class="n">{{.Sent}}</td></tr><tr><th>Failed</th><td class="n">{{.Failed}}</td></tr>
<tr><th>Skipped</th><td class="n">{{.Skipped}}</td></tr><tr><th>Unknown</th><td class="n">{{.Unknown}}</td></tr>
<tr><th>Delivered / undelivered</th><td class="n">{{.Delivered}} / {{.Undelivered}}</td></tr>
{{with .Rate}}<tr><th>Rate now</th><td class="n">{{.}}</td></tr>{{end}}
{{with .ETA}}<tr><th>ETA</th><td class="n">{{.}}</td></tr>{{end}}
<tr><th>Created</th><td>{{.CreatedAt}}</td></tr>
{{with .StartAt}}<tr><th>Starts</th><td>{{when .}}</td></tr>{{end}}
{{with .StartedAt}}<tr><th>Started</th><td>{{when .}}</td></tr>{{end}}
{{with .FinishedAt}}<tr><th>Finished</th><td>{{when .}}</td></tr>{{end}}
{{with .Waiting}}<tr><th>Waiting</th><td class="wait"><b>{{.Reason}}</b>: {{.Detail}}</td></tr>{{end}}
{{if .RedisUnavailable}}<tr><th>Redis</th><td class="wait">unreachable: Postgres's figures only</td></tr>{{end}}
</table>{{end}}
<div><h2 style="margin-top:0">Failed by reason</h2>{{if .Failed}}<table>{{range .Failed}}<tr><td>{{.Name}}</td><td class="n">{{.Count}}</td></tr>{{end}}</table>{{else}}<p class="muted">none</p>{{end}}
<h2>Skipped by reason</h2>{{if .Skipped}}<table>{{range .Skipped}}<tr><td>{{.Name}}</td><td class="n">{{.Count}}</td></tr>{{end}}</table>{{else}}<p class="muted">none</p>{{end}}</div>
<div><h2 style="margin-top:0">Batches in the queue</h2><table>{{range .Batches}}<tr><td>{{.Name}}</td><td class="n">{{.Count}}</td></tr>{{end}}</table></div>
</div>
<h2>Sends per second, {{.Chart.From}} to {{.Chart.To}}{{if .Chart.Total}} ({{.Chart.Total}} sent, peak {{.Chart.Max}}/s){{end}}</h2>
{{with .Chart}}<svg xmlns="http://www.w3.org/2000/svg" width="{{.Width}}" height="{{.Height}}" viewBox="0 0 {{.Width}} {{.Height}}" role="img" aria-label="sends per second">
{{range .Bars}}<rect x="{{f1 .X}}" y="{{f1 .Y}}" width="{{f1 .W}}" height="{{f1 .H}}" fill="#2da44e"><title>{{.Title}}</title></rect>{{end}}
{{if not .Bars}}<text x="12" y="24" fill="#656d76">no send in the last minutes</text>{{end}}
</svg>{{end}}
{{if not .ReadOnly}}{{if or .Pausable .Resumable .Cancellable}}<h2>Actions</h2>{{end}}
{{with .Row}}
{{if $.Pausable}}<form method="post" action="/campaigns/{{.ID}}/pause" onsubmit="return confirm('Pause campaign {{.ID}} ({{.Name}})? No new send starts until you resume it.')"><button type="submit">Pause</button></form>{{end}}
{{if $.Resumable}}<form method="post" action="/campaigns/{{.ID}}/resume" onsubmit="return confirm('Resume campaign {{.ID}} ({{.Name}})?')"><button type="submit">Resume</button></form>{{end}}
{{if $.Cancellable}}<form method="post" action="/campaigns/{{.ID}}/cancel" onsubmit="return confirm('Cancel campaign {{.ID}} ({{.Name}}) for good? Unsent recipients are skipped; this cannot be undone.')"><button type="submit" class="danger">Cancel campaign</button></form>{{end}}
{{end}}{{end}}
{{template "foot"}}{{end}}

{{define "error"}}{{template "head" .}}
<h1>{{.Title}}</h1><div class="err">{{.Err}}</div>
<p><a href="/campaigns">All campaigns</a></p>
{{template "foot"}}{{end}}
`))
