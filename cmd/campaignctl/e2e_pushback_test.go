package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/providers/sandbox"
)

// pushbackRun sends n SMS with the built binary through a sandbox started with sandboxArgs, by workers
// worker processes, TWILIO_RATE rate (0: none), until nothing is pending; it checks from the provider's
// side that everyone got exactly one message and that nobody failed or landed in the DLQ, and returns the
// sandbox's timeline of the run, and the workers' pushback metrics summed over them: the moves of the
// shared pace by event (campaignctl_provider_pace_changes_total) and provider_down at the end.
func pushbackRun(t *testing.T, n, workers int, rate string, sandboxArgs ...string) (sandbox.Timeline, map[string]float64) {
	return pushbackRunMessage(t, "Merhaba {{.first_name}}, kodunuz {{.code}}", n, workers, rate, sandboxArgs...)
}

// pushbackRunMessage is pushbackRun with the message's text (after the sender's prefix).
func pushbackRunMessage(t *testing.T, message string, n, workers int, rate string, sandboxArgs ...string) (sandbox.Timeline, map[string]float64) {
	t.Helper()
	e, sandboxAddr, audience := smsSandboxEnv(t, n, rate, sandboxArgs...)
	metricsAddrs := make([]string, workers)
	for i := range workers {
		metricsAddrs[i] = freeAddr(t)
		e.start(fmt.Sprint("worker ", i+1), "worker", "--concurrency", "8", "--provider-timeout", "2s", "--metrics-addr", metricsAddrs[i])
	}
	id, _ := launchSMS(e, "pushback", audience, message)
	var st chaosStatus
	waitFor(t, 3*time.Minute, func() bool {
		s, err := chaosStatusOf(e, id)
		st = s
		return err == nil && s.Pending == 0
	})
	if st.Failed != 0 || st.DLQ != 0 || st.Unknown != 0 || st.Sent != int64(n) {
		t.Errorf("status %+v: want all %d sent, none failed, unknown or in the DLQ", st, n)
	}
	perTo := map[string]int{}
	for _, m := range chaosSandboxMessages(t, sandboxAddr) {
		perTo[m.To]++
	}
	dups := 0
	for _, c := range perTo {
		if c > 1 {
			dups++
		}
	}
	if dups != 0 || len(perTo) != n {
		t.Errorf("the sandbox accepted messages to %d numbers, %d of them more than once; want %d, once each", len(perTo), dups, n)
	}
	resp, err := http.Get("http://" + sandboxAddr + "/_sandbox/timeline?api=twilio")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var tl sandbox.Timeline
	if err := json.NewDecoder(resp.Body).Decode(&tl); err != nil {
		t.Fatal(err)
	}
	t.Logf("sandbox: %d requests, %d accepted, %d refused %v", tl.Total.Requests, tl.Total.Accepted, tl.Total.Refused, tl.Total.RefusedBy)
	for _, s := range tl.Seconds {
		t.Logf("  %s accepted %4d refused %4d %v", s.Second.Format("15:04:05"), s.Accepted, s.Refused, s.RefusedBy)
	}
	moves := map[string]float64{}
	for _, addr := range metricsAddrs {
		body := scrape(t, "http://"+addr+"/metrics")
		for _, ev := range []string{"lowered", "at_cap", "down", "up", "paused"} {
			v, _ := sample(body, `campaignctl_provider_pace_changes_total{event="`+ev+`",provider="twilio"}`)
			moves[ev] += v
		}
		v, _ := sample(body, `campaignctl_provider_down{provider="twilio"}`)
		moves["down_now"] += v
	}
	t.Logf("pace moves over the workers: %v", moves)
	return tl, moves
}

// Sporadic faults (5 % 503, 2 % 429 with Retry-After) slow the provider's pace no lower than its cap and
// stop nobody: everyone is sent once, nobody fails.
func TestPushbackSporadicFaultsStopNobody(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("end-to-end run skipped in -short mode")
	}
	_, moves := pushbackRun(t, 3000, 2, "1500", "--fail-503", "0.05", "--fail-429", "0.02")
	if moves["down"] != 0 || moves["paused"] != 0 {
		t.Errorf("pace moves %v: sporadic errors stopped the workers (down or paused), want them to slow at most", moves)
	}
}

// A provider that takes only 300 requests a second and answers 429 (without Retry-After) past it, with no
// cap configured: the shared pace finds the limit. The first second, sent with no pace known, is refused
// for the most part; after it, the rejected requests stay a small share.
func TestPushbackFindsAHiddenLimit(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("end-to-end run skipped in -short mode")
	}
	tl, moves := pushbackRun(t, 4000, 3, "0", "--limit", "twilio=300")
	if moves["lowered"] == 0 || moves["down"] != 0 {
		t.Errorf("pace moves %v: want the pace lowered (and reported), the provider never taken for down", moves)
	}
	var requests, refused int
	for _, s := range tl.Seconds[min(2, len(tl.Seconds)):] {
		requests, refused = requests+s.Requests, refused+s.Refused
	}
	if share := float64(refused) / float64(max(1, requests)); share > 0.05 {
		t.Errorf("after the first two seconds, %.1f%% of the requests were refused by the hidden limit, want at most 5%%", 100*share)
	}
}

// A hard outage in the middle of a campaign costs nobody a retry: nobody fails, nothing lands in the DLQ,
// sending goes on after the provider is back, and while it is down, only the probes reach it.
func TestPushbackOutageCostsNoRetry(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("end-to-end run skipped in -short mode")
	}
	tl, moves := pushbackRun(t, 3000, 2, "500", "--outage", "twilio=6s@3s")
	if moves["down"] == 0 || moves["up"] == 0 || moves["down_now"] != 0 {
		t.Errorf("pace moves %v: want the provider reported down, then up, and up at the end", moves)
	}
	if len(tl.Outages) != 1 || tl.Outages[0].End.IsZero() {
		t.Fatalf("outages %+v: want the one window, over", tl.Outages)
	}
	o := tl.Outages[0]
	for _, s := range tl.Seconds {
		// From two seconds into the outage (the workers have seen it) to its end: the probes only.
		if !s.Second.Before(o.Start.Add(2*time.Second)) && !s.Second.Add(time.Second).After(o.End) && s.Requests > 2 {
			t.Errorf("%s, inside the outage: %d requests, want one probe a second over every worker", s.Second.Format(time.TimeOnly), s.Requests)
		}
	}
}

// Twilio's limit counts segments: with TWILIO_RATE=150 (segments a second) and a provider that takes 160
// segments a second, three-segment messages go at 50 a second and none is refused for segments. One token
// a message would put 450 segments a second on it.
func TestPushbackSegmentsAreTokens(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("end-to-end run skipped in -short mode")
	}
	// UCS-2 (ş, ğ, ı): 67 characters a segment; with the prefix, between 135 and 201 characters: three.
	long := "Merhaba {{.first_name}}, kodunuz {{.code}}. Bu hafta sonuna kadar geçerli indiriminizi mağazalarımızda ve uygulamamızda kullanabilirsiniz; şartlar için sitemize bakın."
	// TWILIO_RATE 150 segments a second, the provider's limit 200: a message taken as one token would go
	// at 150 messages (450 segments) a second, and most of the first second's would be refused.
	tl, _ := pushbackRunMessage(t, long, 400, 2, "150", "--limit-segments", "twilio=200")
	if tl.Total.Segments < 3*400 {
		t.Fatalf("the sandbox counted %d segments for 400 messages, want three each (the test's message is too short)", tl.Total.Segments)
	}
	// The bucket's burst and the network's jitter may bunch a few requests into one of the provider's
	// seconds: one in a hundred, not more.
	if n := tl.Total.RefusedBy["segments"]; n > 4 {
		t.Errorf("%d requests of 400 refused over the provider's segment limit, want at most 4: a message takes a token a segment", n)
	}
}

// Long messages under Twilio's cap: ten-segment SMS with TWILIO_RATE=170 segments a second. A window of
// eight of them was let out at once (80 segments, ten times the bucket's burst), and single seconds held up
// to 240 segments, 1.41 times the cap; a provider that keeps its limit exactly refused them. A window's
// segments now stay within the bucket's burst (a long message goes alone), and no second holds much more
// than the cap.
func TestLongSMSKeepTheSegmentCapEverySecond(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("end-to-end run skipped in -short mode")
	}
	// The sender's prefix (ACME A.Ş., RET yazıp ...) makes it UCS-2, 67 characters a segment of a long
	// message: between 604 and 670 characters is ten.
	long := "Merhaba {{.first_name}}, kodunuz {{.code}}. " + strings.Repeat("Kampanya ayrintilari burada. ", 19)
	const rate = 170
	tl, _ := pushbackRunMessage(t, long, 200, 2, strconv.Itoa(rate))
	if tl.Total.Segments < 10*200 {
		t.Fatalf("the sandbox counted %d segments for 200 messages, want ten each (the test's message is too short)", tl.Total.Segments)
	}
	// What a cap allows in one second of the provider's clock: the cap (the bucket's burst included), with
	// room for sends that left a little late and one message reserved at its moment that the rounding puts
	// in the same second.
	most := rate + rate/20 + 10
	for _, s := range tl.Seconds {
		if s.Segments > most {
			t.Errorf("%s: %d segments, want at most %d under TWILIO_RATE=%d", s.Second.Format(time.TimeOnly), s.Segments, most, rate)
		}
	}
}
