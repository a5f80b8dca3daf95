package campaign

import (
	"fmt"
	"strings"
	"time"
	_ "time/tzdata" // Europe/Istanbul resolves on machines without a zoneinfo database
)

// DefaultZone is where send windows and --at times are read when no zone is given.
const DefaultZone = "Europe/Istanbul"

// DefaultFrequencyCap is how long after a commercial message the same person gets no other one on the
// same channel, across campaigns.
const DefaultFrequencyCap = 24 * time.Hour

// Window is a daily send window, [Start, End) in minutes after midnight in Zone. End < Start wraps past
// midnight (22:00-02:00). The zero Window is "always open".
type Window struct {
	Start, End int
	Zone       *time.Location
}

// IsZero reports whether w is "always open".
func (w Window) IsZero() bool { return w.Start == w.End }

// ParseWindow reads "09:00-20:00" in zone.
func ParseWindow(s string, zone *time.Location) (Window, error) {
	if strings.TrimSpace(s) == "" {
		return Window{}, nil
	}
	from, to, ok := strings.Cut(s, "-")
	start, err1 := parseClock(from)
	end, err2 := parseClock(to)
	if !ok || err1 != nil || err2 != nil || start == end {
		return Window{}, fmt.Errorf("%w: --window %q must be HH:MM-HH:MM with two different times, e.g. 09:00-20:00", ErrInvalid, s)
	}
	return Window{Start: start, End: end, Zone: zone}, nil
}

func parseClock(s string) (int, error) {
	t, err := time.Parse("15:04", strings.TrimSpace(s))
	if err != nil {
		return 0, err
	}
	return t.Hour()*60 + t.Minute(), nil
}

// String formats w as HH:MM-HH:MM.
func (w Window) String() string {
	if w.IsZero() {
		return ""
	}
	return fmt.Sprintf("%02d:%02d-%02d:%02d", w.Start/60, w.Start%60, w.End/60, w.End%60)
}

// Open reports whether t is inside the window.
func (w Window) Open(t time.Time) bool {
	if w.IsZero() {
		return true
	}
	lt := t.In(w.Zone)
	m := lt.Hour()*60 + lt.Minute()
	if w.Start < w.End {
		return m >= w.Start && m < w.End
	}
	return m >= w.Start || m < w.End
}

// NextOpen returns t when the window is open at t, otherwise the next moment it opens.
func (w Window) NextOpen(t time.Time) time.Time {
	if w.Open(t) {
		return t
	}
	lt := t.In(w.Zone)
	open := time.Date(lt.Year(), lt.Month(), lt.Day(), w.Start/60, w.Start%60, 0, 0, w.Zone)
	if !open.After(t) {
		open = time.Date(lt.Year(), lt.Month(), lt.Day()+1, w.Start/60, w.Start%60, 0, 0, w.Zone)
	}
	return open
}

// LastClose returns the last moment the window closed at or before t (the zero Window never closes: t).
func (w Window) LastClose(t time.Time) time.Time {
	if w.IsZero() {
		return t
	}
	lt := t.In(w.Zone)
	c := time.Date(lt.Year(), lt.Month(), lt.Day(), w.End/60, w.End%60, 0, 0, w.Zone)
	if c.After(t) {
		c = time.Date(lt.Year(), lt.Month(), lt.Day()-1, w.End/60, w.End%60, 0, 0, w.Zone)
	}
	return c
}

// ParseAt reads a start time: RFC 3339 ("2026-12-01T10:00:00+03:00"), or "2026-12-01 10:00" in zone. It
// must lie in the future.
func ParseAt(s string, zone *time.Location, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	t, err := time.Parse(time.RFC3339, s)
	local := false
	if err != nil {
		t, err = time.ParseInLocation("2006-01-02 15:04", s, zone)
		local = true
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: --at %q must be like \"2026-12-01 10:00\" (in %s) or RFC 3339", ErrInvalid, s, zone)
	}
	if wall, _ := time.Parse("2006-01-02 15:04", s); local && t.In(zone).Format("2006-01-02 15:04") != wall.Format("2006-01-02 15:04") {
		// A wall time the zone skips (clocks put forward): Go moves it silently, by the gap, one way or the
		// other. The example is the same wall time moved past the change.
		_, before := t.Add(-12 * time.Hour).In(zone).Zone()
		_, after := t.Add(12 * time.Hour).In(zone).Zone()
		ex := t
		if ex.In(zone).Format("2006-01-02 15:04") < wall.Format("2006-01-02 15:04") {
			ex = ex.Add(time.Duration(after-before) * time.Second)
		}
		return time.Time{}, fmt.Errorf("%w: --at %s does not exist in %s (its clocks skip it, a daylight-saving change); give a time after the change, e.g. %s, or an RFC 3339 time with its offset",
			ErrInvalid, s, zone, ex.In(zone).Format("2006-01-02 15:04"))
	}
	if local {
		// A wall time the zone has twice (clocks put back): Go takes one of the two silently.
		for _, d := range []time.Duration{-time.Hour, -30 * time.Minute, 30 * time.Minute, time.Hour} {
			if other := t.Add(d); other.In(zone).Format("2006-01-02 15:04") == t.In(zone).Format("2006-01-02 15:04") {
				first, second := t, other
				if other.Before(t) {
					first, second = other, t
				}
				return time.Time{}, fmt.Errorf("%w: --at %s happens twice in %s (its clocks go back, a daylight-saving change): give an RFC 3339 time with its offset, %s for the first or %s for the second",
					ErrInvalid, s, zone, first.In(zone).Format(time.RFC3339), second.In(zone).Format(time.RFC3339))
			}
		}
	}
	if !t.After(now) {
		return time.Time{}, fmt.Errorf("%w: --at %s is in the past; give a future time or leave --at out to start now", ErrInvalid, t.In(zone).Format("2006-01-02 15:04 MST"))
	}
	return t, nil
}
