package main

import (
	"io"
	"testing"
)

// A provider's cap from the environment must be a number of messages per second: TWILIO_RATE=NaN (or
// Inf) is not one. NaN is taken (NaN < 0 is false) and then reads as "no cap" (NaN > 0 is false); Inf
// is taken too, and gcra's int conversion of it turns the bucket into one that never refuses. Both must
// be a usage error (exit 2) naming the variable, as TWILIO_RATE=-1 is.
func TestAProviderCapThatIsNotANumberIsRefused(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"NaN", "Inf", "-Inf", "+Infinity", "-1"} {
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
