package main

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// poolFlag is a code pool name as people type it: ACC, Acc and acc name the pool acc (pool names are
// lower case).
type poolFlag string

func (p *poolFlag) String() string { return string(*p) }
func (p *poolFlag) Type() string   { return "string" }
func (p *poolFlag) Set(s string) error {
	*p = poolFlag(strings.ToLower(strings.TrimSpace(s)))
	return nil
}

// poolVar defines a code pool flag.
func poolVar(f *pflag.FlagSet, p *string, name, value, usage string) {
	*p = value
	f.Var((*poolFlag)(p), name, usage)
}

// daysFlag is a duration that also takes days, as marketers count: 1d, 7d, 1d12h, next to Go's 36h, 90m.
type daysFlag time.Duration

var daysRE = regexp.MustCompile(`^(\d+)d(.*)$`)

func (d *daysFlag) String() string { return formatDays(time.Duration(*d)) }
func (d *daysFlag) Type() string   { return "duration" }
func (d *daysFlag) Set(s string) error {
	v, err := parseDays(s)
	if err != nil {
		return err
	}
	*d = daysFlag(v)
	return nil
}

// parseDays parses a Go duration with an optional leading number of days.
func parseDays(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	var days time.Duration
	if m := daysRE.FindStringSubmatch(s); m != nil {
		n, err := strconv.Atoi(m[1])
		if err != nil || n > 3650 {
			return 0, fmt.Errorf("%q: give at most 3650 days", s)
		}
		days, s = time.Duration(n)*24*time.Hour, m[2]
		if s == "" {
			return days, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration: give it like 1d, 7d, 36h or 90m", s)
	}
	return days + d, nil
}

// formatDays writes whole days as such (24h0m0s reads better as 1d).
func formatDays(d time.Duration) string {
	if d > 0 && d%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "d"
	}
	return d.String()
}

// daysVar defines a duration flag that takes days too.
func daysVar(f *pflag.FlagSet, p *time.Duration, name string, value time.Duration, usage string) {
	*p = value
	f.Var((*daysFlag)(p), name, usage)
}
