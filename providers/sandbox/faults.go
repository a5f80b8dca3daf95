package sandbox

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Faults are the failures injected into provider requests. Each rate is the probability (0..1) that a
// request gets that fault. One draw decides per request, taking the faults in field order; if the rates
// add up to more than 1, the later ones get only what is left.
type Faults struct {
	// Rate429 answers 429 with the provider's rate-limit error (Twilio code 20429, Retry-After: 1).
	Rate429 float64 `json:"rate_429"`
	// Rate500 answers 500 with a JSON error body, as the provider sends it.
	Rate500 float64 `json:"rate_500"`
	// Rate503 answers 503 with a JSON error body.
	Rate503 float64 `json:"rate_503"`
	// RateRaw503 answers 503 with an HTML body, as a load balancer in front of the provider would; SDKs
	// cannot decode it into a typed error.
	RateRaw503 float64 `json:"rate_raw_503"`
	// RateTimeout accepts and records the message, then never answers until the client gives up: the
	// provider did accept it, but the client cannot know.
	RateTimeout float64 `json:"rate_timeout"`
	// RateReset reads the request and closes the TCP connection without answering; nothing is recorded.
	RateReset float64 `json:"rate_reset"`
	// Only, when set, limits the faults to the APIs it names, comma-separated (twilio, netgsm, sendgrid,
	// fcm, webhook): e.g. "twilio" makes Twilio fail while Netgsm, the failover, works.
	Only string `json:"only,omitempty"`
}

type fault int

const (
	noFault fault = iota
	fault429
	fault500
	fault503
	faultRaw503
	faultTimeout
	faultReset
)

func (f Faults) validate() error {
	for _, r := range []struct {
		name string
		v    float64
	}{
		{"rate_429", f.Rate429}, {"rate_500", f.Rate500}, {"rate_503", f.Rate503},
		{"rate_raw_503", f.RateRaw503}, {"rate_timeout", f.RateTimeout}, {"rate_reset", f.RateReset},
	} {
		if !(r.v >= 0 && r.v <= 1) { // also catches NaN
			return fmt.Errorf("%s must be between 0 and 1, got %v", r.name, r.v)
		}
	}
	for _, p := range strings.Split(f.Only, ",") {
		switch strings.TrimSpace(p) {
		case "", "twilio", "netgsm", "sendgrid", "fcm", "webhook":
		default:
			return fmt.Errorf("only: unknown API %q (give twilio, netgsm, sendgrid, fcm or webhook)", p)
		}
	}
	return nil
}

// Validate checks the rates (0 to 1) and the APIs named in Only.
func (f Faults) Validate() error { return f.validate() }

// pick returns the fault for a request to api, drawing at most one random number and none when no fault
// is set for it.
func (f *Faults) pick(api string) fault {
	if *f == (Faults{Only: f.Only}) {
		return noFault
	}
	if f.Only != "" && !slices.Contains(strings.Split(strings.ReplaceAll(f.Only, " ", ""), ","), api) {
		return noFault
	}
	x := rand.Float64()
	for _, c := range []struct {
		rate  float64
		fault fault
	}{
		{f.Rate429, fault429}, {f.Rate500, fault500}, {f.Rate503, fault503},
		{f.RateRaw503, faultRaw503}, {f.RateTimeout, faultTimeout}, {f.RateReset, faultReset},
	} {
		if x < c.rate {
			return c.fault
		}
		x -= c.rate
	}
	return noFault
}

const raw503Body = `<html>
<head><title>503 Service Temporarily Unavailable</title></head>
<body>
<center><h1>503 Service Temporarily Unavailable</h1></center>
</body>
</html>
`

// writeRaw503 answers like a proxy whose backend is down: an HTML page, not the provider's JSON.
func writeRaw503(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/html")
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = w.Write([]byte(raw503Body))
}

// shutdownKey is the context key under which ListenAndServe hands handlers the channel closed when the
// server shuts down, so that hanging requests let go and a graceful shutdown does not wait for them.
type shutdownKey struct{}

// hang holds the request without answering until the client goes away or the server shuts down, then
// drops the connection so that no response is ever written.
func hang(r *http.Request) {
	stop, _ := r.Context().Value(shutdownKey{}).(<-chan struct{})
	select {
	case <-r.Context().Done():
	case <-stop:
	}
	panic(http.ErrAbortHandler)
}

// resetConn closes the client's connection without a response. On HTTP/1 it hijacks the connection and
// closes it with SO_LINGER 0, so the client sees a TCP reset rather than an orderly close; where the
// connection cannot be hijacked it aborts the handler, which closes it (or resets the HTTP/2 stream).
func resetConn(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

// sleep waits d, or aborts the handler when the client goes away first.
func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		panic(http.ErrAbortHandler)
	}
}
