package sandbox

import "testing"

func TestFaultsPick(t *testing.T) {
	if got := (&Faults{}).pick("twilio"); got != noFault {
		t.Errorf("no faults: %v", got)
	}
	for f, want := range map[Faults]fault{
		{Rate429: 1}:     fault429,
		{Rate500: 1}:     fault500,
		{Rate503: 1}:     fault503,
		{RateRaw503: 1}:  faultRaw503,
		{RateTimeout: 1}: faultTimeout,
		{RateReset: 1}:   faultReset,
	} {
		if got := f.pick("twilio"); got != want {
			t.Errorf("%+v: picked %v, want %v", f, got, want)
		}
	}
	// Half and half: over many draws both happen, and nothing else does.
	f := Faults{Rate429: 0.5, Rate500: 0.5}
	seen := map[fault]int{}
	for range 1000 {
		seen[f.pick("twilio")]++
	}
	if seen[fault429] < 400 || seen[fault500] < 400 || seen[fault429]+seen[fault500] != 1000 {
		t.Errorf("draws %v", seen)
	}
}
