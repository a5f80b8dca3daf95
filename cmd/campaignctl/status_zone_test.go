package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/worker"
)

// The text view gives the times of a waiting reason's detail in --tz, as it gives since and until: a
// campaign scheduled for 10:00 Istanbul time said "starts at 2027-01-05T07:00:00Z" above "until
// 2027-01-05 10:00:00 +03". --json keeps them in UTC.
func TestStatusTextGivesTheWaitingDetailsTimesInItsZone(t *testing.T) {
	start := time.Date(2027, 1, 5, 7, 0, 0, 0, time.UTC)
	created := time.Date(2027, 1, 4, 9, 30, 0, 0, time.UTC)
	v := worker.CampaignStatus{ID: 7, Name: "ocak", Channel: "sms", State: "scheduled",
		Waiting: &worker.Waiting{Reason: worker.WaitScheduled, Detail: "starts at " + start.Format(time.RFC3339) + " (launch --at)", Since: &created, Until: &start}}
	var out bytes.Buffer
	(&app{}).printStatusTo(&out, v, nil)
	text := out.String()
	if !strings.Contains(text, "starts at 2027-01-05 10:00:00 +03 (launch --at)") || strings.Contains(text, "07:00:00Z") {
		t.Fatalf("status text:\n%s\nwant the start in Istanbul time, as its until", text)
	}
	if !strings.Contains(text, "2027-01-05 10:00:00 +03") || !strings.Contains(text, "2027-01-04 12:30:00 +03") {
		t.Fatalf("status text:\n%s\nwant since and until in Istanbul time", text)
	}
	// Another zone, and a time with a fraction of a second.
	out.Reset()
	v.Waiting.Detail = "retries at 2027-01-05T07:00:00.250Z"
	(&app{}).printStatusTo(&out, v, time.UTC)
	if !strings.Contains(out.String(), "retries at 2027-01-05 07:00:00 UTC") {
		t.Fatalf("status text in UTC:\n%s", out.String())
	}
}
