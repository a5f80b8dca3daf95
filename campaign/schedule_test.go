package campaign

import (
	"strings"
	"testing"
	"time"
)

func TestWindow(t *testing.T) {
	ist, _ := time.LoadLocation(DefaultZone)
	day, _ := ParseWindow("09:00-20:00", ist)
	night, _ := ParseWindow("22:00-02:00", ist)
	at := func(s string) time.Time {
		tm, err := time.ParseInLocation("2006-01-02 15:04", s, ist)
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	tests := []struct {
		w    Window
		now  string
		open bool
		next string
	}{
		{day, "2026-12-01 08:59", false, "2026-12-01 09:00"},
		{day, "2026-12-01 09:00", true, "2026-12-01 09:00"},
		{day, "2026-12-01 19:59", true, "2026-12-01 19:59"},
		{day, "2026-12-01 20:00", false, "2026-12-02 09:00"},
		{night, "2026-12-01 23:30", true, "2026-12-01 23:30"},
		{night, "2026-12-02 01:59", true, "2026-12-02 01:59"},
		{night, "2026-12-02 02:00", false, "2026-12-02 22:00"},
		{Window{}, "2026-12-02 03:00", true, "2026-12-02 03:00"},
	}
	for _, tt := range tests {
		now := at(tt.now)
		if got := tt.w.Open(now); got != tt.open {
			t.Errorf("%s at %s: open %v, want %v", tt.w, tt.now, got, tt.open)
		}
		if got := tt.w.NextOpen(now); !got.Equal(at(tt.next)) {
			t.Errorf("%s at %s: next open %s, want %s", tt.w, tt.now, got.In(ist).Format("2006-01-02 15:04"), tt.next)
		}
	}
	// 09:00 Istanbul is 06:00 UTC: the zone, not the machine's clock, decides.
	if !day.Open(time.Date(2026, 12, 1, 6, 30, 0, 0, time.UTC)) || day.Open(time.Date(2026, 12, 1, 5, 59, 0, 0, time.UTC)) {
		t.Error("the window is not read in Europe/Istanbul")
	}
	for _, bad := range []string{"9-20", "09:00", "09:00-09:00", "25:00-26:00"} {
		if _, err := ParseWindow(bad, ist); err == nil {
			t.Errorf("ParseWindow(%q) accepted", bad)
		}
	}
}

func TestParseAt(t *testing.T) {
	ist, _ := time.LoadLocation(DefaultZone)
	now := time.Date(2026, 12, 1, 7, 0, 0, 0, time.UTC) // 10:00 in Istanbul
	got, err := ParseAt("2026-12-01 11:30", ist, now)
	if err != nil || !got.Equal(time.Date(2026, 12, 1, 8, 30, 0, 0, time.UTC)) {
		t.Fatalf("ParseAt local = %v, %v", got, err)
	}
	if _, err := ParseAt("2026-12-01 09:30", ist, now); err == nil {
		t.Fatal("a time in the past was accepted")
	}
	if got, err := ParseAt("2026-12-02T00:00:00Z", ist, now); err != nil || got.Hour() != 0 {
		t.Fatalf("ParseAt RFC 3339 = %v, %v", got, err)
	}
	if _, err := ParseAt("tomorrow", ist, now); err == nil {
		t.Fatal("garbage accepted")
	}
	// A wall time the zone skips (New York puts its clocks from 02:00 to 03:00 on 2027-03-14): refused,
	// not moved by the gap without a word; the hour after is taken.
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Skip(err)
	}
	if _, err := ParseAt("2027-03-14 02:30", ny, now); err == nil || !strings.Contains(err.Error(), "does not exist") || !strings.Contains(err.Error(), "e.g. 2027-03-14 03:30") {
		t.Fatalf("a time New York skips: %v, want it refused, with 03:30 (after the change) for an example", err)
	}
	if london, err := time.LoadLocation("Europe/London"); err == nil {
		if _, err := ParseAt("2027-03-28 01:15", london, now); err == nil || !strings.Contains(err.Error(), "e.g. 2027-03-28 02:15") {
			t.Fatalf("a time London skips: %v, want it refused, with 02:15 for an example", err)
		}
	}
	if got, err := ParseAt("2027-03-14 03:30", ny, now); err != nil || !got.Equal(time.Date(2027, 3, 14, 7, 30, 0, 0, time.UTC)) {
		t.Fatalf("ParseAt after the change = %v, %v", got, err)
	}
	// A wall time the zone has twice (New York puts its clocks from 02:00 back to 01:00 on 2027-11-07):
	// refused, naming both, rather than one taken without a word; with its offset, each is taken.
	if _, err = ParseAt("2027-11-07 01:30", ny, now); err == nil || !strings.Contains(err.Error(), "happens twice") ||
		!strings.Contains(err.Error(), "2027-11-07T01:30:00-04:00") || !strings.Contains(err.Error(), "2027-11-07T01:30:00-05:00") {
		t.Fatalf("a time New York has twice: %v, want it refused, naming both", err)
	}
	if got, err := ParseAt("2027-11-07T01:30:00-05:00", ny, now); err != nil || !got.Equal(time.Date(2027, 11, 7, 6, 30, 0, 0, time.UTC)) {
		t.Fatalf("the second 01:30 with its offset = %v, %v", got, err)
	}
	if got, err := ParseAt("2027-11-07 00:30", ny, now); err != nil || !got.Equal(time.Date(2027, 11, 7, 4, 30, 0, 0, time.UTC)) {
		t.Fatalf("the hour before the change = %v, %v", got, err)
	}
	if got, err := ParseAt("2026-12-01 9:30", ist, now.Add(-2*time.Hour)); err != nil || !got.Equal(time.Date(2026, 12, 1, 6, 30, 0, 0, time.UTC)) {
		t.Fatalf("ParseAt with a one-digit hour = %v, %v", got, err)
	}
}

func TestLastClose(t *testing.T) {
	t.Parallel()
	ist, err := time.LoadLocation(DefaultZone)
	if err != nil {
		t.Fatal(err)
	}
	w, err := ParseWindow("09:00-20:00", ist)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ at, want string }{
		{"2026-12-02 21:30", "2026-12-02 20:00"}, // closed this evening
		{"2026-12-03 07:00", "2026-12-02 20:00"}, // still closed next morning
		{"2026-12-02 20:00", "2026-12-02 20:00"},
	} {
		at, _ := time.ParseInLocation("2006-01-02 15:04", tc.at, ist)
		want, _ := time.ParseInLocation("2006-01-02 15:04", tc.want, ist)
		if got := w.LastClose(at); !got.Equal(want) {
			t.Errorf("LastClose(%s) = %v, want %v", tc.at, got, want)
		}
	}
}
