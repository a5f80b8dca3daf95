// Command loopback measures the loopback HTTP ceiling of this machine: how many requests per second one
// process can make to an HTTP server it serves itself over 127.0.0.1, with keep-alive connections and a
// request and answer shaped like a Twilio message create (a form POST, a JSON 201). It is the reference a
// one-request-per-message provider's throughput is compared with (scripts/bench.sh prints both).
//
//	go run ./scripts/bench/loopback -duration 5s -concurrency 32
//
// It prints one line: "<requests per second> <requests> <seconds>".
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	duration := flag.Duration("duration", 5*time.Second, "how long to measure")
	concurrency := flag.Int("concurrency", 32, "requests in flight at once (one connection each)")
	flag.Parse()
	if *duration <= 0 || *concurrency <= 0 {
		fmt.Fprintln(os.Stderr, "loopback: -duration and -concurrency must be positive")
		os.Exit(2)
	}
	rate, n, secs, err := measure(*duration, *concurrency)
	if err != nil {
		fmt.Fprintln(os.Stderr, "loopback:", err)
		os.Exit(1)
	}
	fmt.Printf("%.0f %d %.2f\n", rate, n, secs)
}

type answer struct {
	SID         string `json:"sid"`
	To          string `json:"to"`
	From        string `json:"from"`
	Body        string `json:"body"`
	Status      string `json:"status"`
	NumSegments string `json:"num_segments"`
	DateCreated string `json:"date_created"`
}

func measure(d time.Duration, concurrency int) (float64, int64, float64, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, 0, 0, err
	}
	var seq atomic.Int64
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := r.ParseForm(); err != nil || r.PostForm.Get("To") == "" {
			http.Error(w, "bad form", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(answer{
			SID: fmt.Sprintf("SM%032x", seq.Add(1)), To: r.PostForm.Get("To"), From: r.PostForm.Get("From"),
			Body: r.PostForm.Get("Body"), Status: "queued", NumSegments: "1", DateCreated: time.Now().UTC().Format(time.RFC1123Z),
		})
	})}
	go srv.Serve(ln) //nolint:errcheck // closed below
	defer srv.Close()

	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		MaxIdleConns: concurrency, MaxIdleConnsPerHost: concurrency, IdleConnTimeout: time.Minute,
	}}
	target := "http://" + ln.Addr().String() + "/2010-04-01/Accounts/AC0/Messages.json"
	body := url.Values{"To": {"+905321234567"}, "From": {"KAMPANYA"},
		"Body": {"Merhaba Ayşe, kodunuz ABCD-1234 - Kampanya A.Ş. RET yazıp 3338e gönderin"}}.Encode()

	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var done atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				req, _ := http.NewRequest(http.MethodPost, target, strings.NewReader(body))
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				resp, err := client.Do(req)
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusCreated {
					firstErr.CompareAndSwap(nil, fmt.Errorf("status %d", resp.StatusCode))
					return
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	if e, ok := firstErr.Load().(error); ok && e != nil {
		return 0, 0, 0, e
	}
	n := done.Load()
	return float64(n) / secs, n, secs, nil
}
