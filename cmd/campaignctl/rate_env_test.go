package main

import (
	"io"
	"testing"
)

// A provider's cap from the environment must be a number of messages per second: TWILIO_RATE=NaN (or
// Inf) is not one. NaN is taken (NaN < 0 is false) and then reads as "no cap" (NaN > 0 is false); Inf
// is taken too, and gcra's int conversion of it turns the bucket into one that never refuses. Both must
// be a usage error (exit 2) naming the variable, as TWILIO_RATE=-1 is, and so must a cap below one message
// an hour (1e-9: a campaign would never end).
func TestAProviderCapThatIsNotANumberIsRefused(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"NaN", "Inf", "-Inf", "+Infinity", "-1", "1e-9"} {
		a := &app{stdout: io.Discard, stderr: io.Discard, getenv: func(k string) string {
			if k == "TWILIO_RATE" {
				return v
			}
			return ""
		}}
		r, err := a.rate("TWILIO_RATE", 10)
		if err == nil {
			t.Errorf("TWILIO_RATE=%s taken as a cap of %v/s; want a usage error", v, r)
			continue
		}
		if !isUsage(err) {
			t.Errorf("TWILIO_RATE=%s: not a usage error (exit 2): %v", v, err)
		}
	}
}

// The launch's ETA at the lowest rate, for an audience of millions, is told in days: the seconds do not fit
// a time.Duration (it printed a negative ETA).
func TestALaunchETABeyondAYearIsInDays(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		secs float64
		want string
	}{{10_000_000 * 3600, "416667 days"}, {3600, "1h0m0s"}, {400 * 24 * 3600, "400 days"}} {
		if got := etaText(c.secs); got != c.want {
			t.Errorf("etaText(%v) = %q, want %q", c.secs, got, c.want)
		}
	}
}
