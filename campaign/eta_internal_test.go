package campaign

import "testing"

// The ETA takes the slower of the campaign's --rate (messages) and the provider's cap, which for a
// provider counting segments (Twilio) is spent a token a segment.
func TestETACountsSegmentsWhereTheProviderDoes(t *testing.T) {
	for _, tc := range []struct {
		name              string
		spec              Spec
		rep               Report
		wantRate, wantETA float64
	}{
		{"no cap", Spec{}, Report{Eligible: 100}, 0, 0},
		{"campaign rate", Spec{Rate: 10}, Report{Eligible: 100}, 10, 10},
		{"provider in messages", Spec{ProviderRate: 50, Rate: 100}, Report{Eligible: 100, SegmentsPerMessage: 3}, 50, 2},
		{"segments counted", Spec{ProviderRate: 100, ProviderCountsSegments: true}, Report{Eligible: 100, SegmentsPerMessage: 2, TotalSegments: 300}, 100.0 / 3, 3},
		{"segments of the first message", Spec{ProviderRate: 100, ProviderCountsSegments: true}, Report{Eligible: 100, SegmentsPerMessage: 3}, 100.0 / 3, 3},
		{"campaign slower than the segments", Spec{Rate: 10, ProviderRate: 100, ProviderCountsSegments: true}, Report{Eligible: 100, SegmentsPerMessage: 3}, 10, 10},
	} {
		rate, eta := tc.spec.eta(&tc.rep)
		if rate != tc.wantRate || eta != tc.wantETA {
			t.Errorf("%s: rate %v, ETA %v s; want %v, %v s", tc.name, rate, eta, tc.wantRate, tc.wantETA)
		}
	}
}
