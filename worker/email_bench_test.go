package worker

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/internal/unsubscribe"
	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/sendgrid"
)

// emailBench is what one request of a commercial e-mail campaign costs a worker, from the recipients as
// LoadBatch returns them to the bytes on the wire, without Postgres, Redis or the provider's own work:
// the e-mail of scripts/bench.sh (a subject, a text and an HTML part that take the first name and the
// code, a one-click unsubscribe link a recipient) over 1000 recipients, sent by the SendGrid adapter to a
// server that reads the body and answers 202.
type emailBench struct {
	*sendgridSink
	run *batchRun
	rs  []campaign.Recipient
}

// sendgridSink is the SendGrid adapter pointed at a server that reads each request's body and answers
// 202, with what that server read.
type sendgridSink struct {
	p     *sendgrid.Provider
	bytes atomic.Int64 // request body bytes the server read
	reqs  atomic.Int64
}

func newSendGridSink(b *testing.B) *sendgridSink {
	b.Helper()
	s := &sendgridSink{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		s.bytes.Add(n)
		s.reqs.Add(1)
		w.Header().Set("X-Message-Id", "benchMessageId00000000")
		w.WriteHeader(http.StatusAccepted)
	}))
	b.Cleanup(srv.Close)
	p, err := sendgrid.New(sendgrid.Config{APIKey: "SG.bench-key", From: "kampanya@example.com", BaseURL: srv.URL})
	if err != nil {
		b.Fatal(err)
	}
	s.p = p
	return s
}

func newEmailBench(b *testing.B, n int, edit func(*campaign.Content)) *emailBench {
	b.Helper()
	e := &emailBench{sendgridSink: newSendGridSink(b)}
	content := campaign.Content{
		Subject: "{{.first_name}}, size özel bir kod",
		Text:    "Merhaba {{.first_name}}, kodunuz {{.code}}",
		HTML:    "<p>Merhaba {{.first_name}},</p><p>Kodunuz: <b>{{.code}}</b></p>",
	}
	if edit != nil {
		edit(&content)
	}
	tmpl, err := campaign.ParseContent(content)
	if err != nil {
		b.Fatal(err)
	}
	signer, err := unsubscribe.New("bench-unsubscribe-secret-0123456789", "https://hooks.example.com")
	if err != nil {
		b.Fatal(err)
	}
	c := &campaign.Campaign{ID: 4217, Name: "email-104512", Channel: campaign.ChannelEmail}
	e.run = &batchRun{c: c, render: Renderer{Campaign: c, Tmpl: tmpl, Unsubscribe: signer}}
	if f := tmpl.Shared(providers.SharedTagPrefix); f != nil {
		e.run.render.Form = f
		e.run.render.Shared = &providers.Shared{Text: f.Text, HTML: f.HTML, Tags: f.Tags}
	}
	names := []string{"Ayşe", "Mehmet", "Zeynep", "Mustafa", "Elif", "Ahmet", "Şükrü", "Gülşen", "İbrahim", "Çağrı"}
	e.rs = make([]campaign.Recipient, n)
	for i := range e.rs {
		k := 100000 + i
		e.rs[i] = campaign.Recipient{
			UserID:  fmt.Sprintf("c%08d", k),
			Address: fmt.Sprintf("musteri%d@example.com", k),
			// As Postgres writes a jsonb value.
			Vars:    []byte(`{"first_name": "` + names[k%len(names)] + `"}`),
			Code:    fmt.Sprintf("KMP%07d", 7919*k%10000000),
			Consent: true,
		}
	}
	return e
}

// render renders every recipient's message, as deliverGroup does.
func (e *emailBench) render(b *testing.B) []providers.Message {
	ms := make([]providers.Message, len(e.rs))
	for i := range e.rs {
		m, err := e.run.message(&e.rs[i])
		if err != nil {
			b.Fatal(err)
		}
		ms[i] = m
	}
	return ms
}

func (e *emailBench) send(b *testing.B, ms []providers.Message) {
	if _, err := e.p.SendBatch(context.Background(), ms); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkEmailRequest is one request of 1000 personalizations: "render" the messages, "send" the request
// (the adapter's body and the HTTP exchange) of messages rendered beforehand, "both" the two. The figures
// to read are ns/recipient and allocs/recipient, and body-B/recipient for the wire.
//
//	go test ./worker -run '^$' -bench EmailRequest -benchtime 100x -count 5
func BenchmarkEmailRequest(b *testing.B) {
	for _, tc := range []struct {
		name string
		edit func(*campaign.Content)
	}{
		{"shared", nil},
		// A link carries a value: the template is not plain, each recipient's rendered parts are sent.
		{"rendered", func(c *campaign.Content) {
			c.HTML = `<p>Merhaba {{.first_name}},</p><p><a href="https://shop.example/k?c={{.code}}">Kodunuz: <b>{{.code}}</b></a></p>`
		}},
	} {
		for _, part := range []string{"render", "send", "both"} {
			b.Run(tc.name+"/"+part, func(b *testing.B) {
				e := newEmailBench(b, 1000, tc.edit)
				pre := e.render(b)
				e.send(b, pre)
				e.bytes.Store(0)
				e.reqs.Store(0)
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				cpu0 := cpuTime()
				for b.Loop() {
					switch part {
					case "render":
						e.render(b)
					case "send":
						e.send(b, pre)
					default:
						e.send(b, e.render(b))
					}
				}
				cpu := cpuTime() - cpu0
				runtime.ReadMemStats(&after)
				n := float64(b.N * len(e.rs))
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/n, "ns/recipient")
				b.ReportMetric(float64(cpu.Nanoseconds())/n, "cpu-ns/recipient")
				b.ReportMetric(float64(after.Mallocs-before.Mallocs)/n, "allocs/recipient")
				b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/n, "B/recipient")
				if r := e.reqs.Load(); r > 0 {
					b.ReportMetric(float64(e.bytes.Load())/float64(r)/float64(len(e.rs)), "body-B/recipient")
				}
			})
		}
	}
}

// BenchmarkRunBatchEmail runs whole batches of 1000 of scripts/bench.sh's e-mail campaign through RunBatch
// against the local Postgres and Redis, sent by the SendGrid adapter to a server that reads each request
// and answers 202: a worker's whole cost per e-mail recipient (lease, render, claims, request, outcomes),
// the services' round trips included in ns/recipient but not their CPU, except Postgres's backends'
// (pg-cpu-ns/recipient).
//
//	go test ./worker -run '^$' -bench RunBatchEmail -benchtime 40x -count 5
func BenchmarkRunBatchEmail(b *testing.B) {
	const n = 20000
	db, _ := testdb.New(b)
	rdb, _ := testredis.New(b)
	ctx := context.Background()
	exec := func(sql string, args ...any) {
		b.Helper()
		if _, err := db.Exec(ctx, sql, args...); err != nil {
			b.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`CREATE TABLE customers AS SELECT 'c' || lpad(k::text, 8, '0') AS user_id, 'musteri' || k || '@example.com' AS email,
		(ARRAY['Ayşe', 'Mehmet', 'Zeynep', 'Mustafa', 'Elif', 'Ahmet', 'Şükrü', 'Gülşen', 'İbrahim', 'Çağrı'])[1 + k % 10] AS first_name
		FROM generate_series(1, $1::int) k`, n)
	exec(`GRANT SELECT ON customers TO campaignctl_audience`)
	exec(`INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date)
		SELECT email, 'EPOSTA', 'BIREYSEL', 'ONAY', 'HS_WEB', now() FROM customers`)
	exec(`INSERT INTO code_pools (name) VALUES ('p')`)
	sink := newSendGridSink(b)
	signer, err := unsubscribe.New("bench-unsubscribe-secret-0123456789", "https://hooks.example.com")
	if err != nil {
		b.Fatal(err)
	}
	h := NewHandler(Config{Store: campaign.NewStore(db), Redis: rdb, Owner: "bench", Unsubscribe: signer,
		Providers: map[campaign.Channel]providers.Provider{campaign.ChannelEmail: sink.p}, ProviderRates: map[string]float64{}})
	plans := 0
	plan := func() (int64, int) {
		b.Helper()
		exec(`INSERT INTO promo_codes (pool, code) SELECT 'p', 'K' || $1::int || '-' || lpad(i::text, 7, '0') FROM generate_series(1, $2::int) i`, plans, n)
		plans++
		rep, err := (&campaign.Planner{Engine: db, Audience: db}).Plan(ctx, campaign.Spec{
			Name: fmt.Sprint("email-", plans), Channel: campaign.ChannelEmail, CodePool: "p",
			AudienceSQL: `SELECT user_id, email, first_name FROM customers`,
			Subject:     "{{.first_name}}, size özel bir kod",
			Message:     "Merhaba {{.first_name}}, kodunuz {{.code}}",
			HTML:        "<p>Merhaba {{.first_name}},</p><p>Kodunuz: <b>{{.code}}</b></p>",
		})
		if err != nil {
			b.Fatal(err)
		}
		return rep.ID, rep.Batches
	}
	id, batches := plan()
	batch := 0
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	cpu0 := cpuTime()
	var pgCPU time.Duration // the Postgres backends' CPU while batches ran
	for b.Loop() {
		if batch == batches {
			b.StopTimer()
			c := cpuTime()
			id, batches = plan()
			cpu0 += cpuTime() - c
			batch = 0
			b.StartTimer()
		}
		b.StopTimer()
		c, pg0 := cpuTime(), backendCPU(b, db)
		cpu0 += cpuTime() - c
		b.StartTimer()
		if err := h.RunBatch(ctx, id, batch); err != nil {
			b.Fatalf("batch %d: %v", batch, err)
		}
		b.StopTimer()
		c = cpuTime()
		pgCPU += backendCPU(b, db) - pg0
		cpu0 += cpuTime() - c
		b.StartTimer()
		batch++
	}
	cpu := cpuTime() - cpu0
	runtime.ReadMemStats(&after)
	if sink.reqs.Load() == 0 {
		b.Fatal("nothing sent")
	}
	sent := float64(sink.reqs.Load()) * campaign.DefaultEmailBatchSize
	b.ReportMetric(float64(sink.bytes.Load())/sent, "body-B/recipient")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/sent, "ns/recipient")
	b.ReportMetric(float64(cpu.Nanoseconds())/sent, "cpu-ns/recipient")
	b.ReportMetric(float64(pgCPU.Nanoseconds())/sent, "pg-cpu-ns/recipient")
	b.ReportMetric(float64(after.Mallocs-before.Mallocs)/sent, "allocs/recipient")
	b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/sent, "B/recipient")
}

// cpuTime is the CPU time the process has used, user and system: what a benchmark costs the machine's
// cores, whatever else runs on them.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
