package main

import (
	"strconv"
	"testing"
)

// The launch report shows a campaign's rate with the digits it needs: a --rate below 0.01 msg/s was shown
// as "0.00 msg/s".
func TestTheLaunchReportShowsASlowRateWithItsDigits(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		rate float64
		want string
	}{
		{1000, "1000"}, {50, "50.0"}, {0.5, "0.50"}, {0.01, "0.01"}, {0.001, "0.0010"}, {0.0042, "0.0042"}, {0, "0.00"},
	} {
		if got := strconv.FormatFloat(tc.rate, 'f', rateDigits(tc.rate), 64); got != tc.want {
			t.Errorf("rate %v shown as %q; want %q", tc.rate, got, tc.want)
		}
	}
}
