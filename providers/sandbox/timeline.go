package sandbox

import (
	"maps"
	"sync"
	"time"
)

// outcome is what became of one provider request, as the timeline counts it.
type outcome uint8

const (
	// outAccepted: answered with success (2xx; Netgsm's code 00), messages recorded unless the request
	// asked for a check only (SendGrid's sandbox_mode, FCM's validate_only).
	outAccepted outcome = iota
	// outHung: recorded, then never answered (the timeout fault).
	outHung
	// The refusals, by reason.
	outLimit       // over the hidden rate limit
	outConcurrency // over the hidden concurrency limit
	outSegments    // over Twilio's hidden segment limit
	outOutage      // during an outage window
	outRate        // over the per-account cap of Options.TwilioRate, SendGridRate or FCMRate
	outFault429    // the injected faults
	outFault500
	outFault503
	outFaultRaw503
	outFaultReset
	outRequest // refused for the request itself: authentication, validation, a magic recipient
	// outGone: the client went away before an answer (during Options.Latency).
	outGone
	numOutcomes
)

var outcomeNames = [numOutcomes]string{
	outAccepted: "accepted", outHung: "hung",
	outLimit: "limit", outConcurrency: "concurrency", outSegments: "segments", outOutage: "outage", outRate: "rate",
	outFault429: "fault_429", outFault500: "fault_500", outFault503: "fault_503", outFaultRaw503: "fault_raw_503",
	outFaultReset: "fault_reset", outRequest: "request",
	outGone: "gone",
}

func (o outcome) refusal() bool { return o >= outLimit && o <= outRequest }

// faultOutcome is the outcome of a request that drew the injected fault f.
func faultOutcome(f fault) outcome {
	switch f {
	case fault429:
		return outFault429
	case fault500:
		return outFault500
	case fault503:
		return outFault503
	case faultRaw503:
		return outFaultRaw503
	case faultReset:
		return outFaultReset
	}
	return outHung
}

// timelineSeconds is how many of the latest seconds the timeline keeps per API; its totals keep
// counting from the start.
const timelineSeconds = 2 * 3600

// TimelineCounts counts provider requests by what became of them. Requests = Accepted + Hung + Refused
// + Gone, and Refused is the sum of RefusedBy.
type TimelineCounts struct {
	// Requests is every request to a provider API route, the same ones Stats.Requests counts.
	Requests int `json:"requests"`
	// Accepted were answered with success (2xx; Netgsm's code 00).
	Accepted int `json:"accepted"`
	// Hung were accepted and recorded, then never answered (the timeout fault).
	Hung int `json:"hung"`
	// Refused were answered with an error, or dropped, by the sandbox.
	Refused int `json:"refused"`
	// RefusedBy splits Refused by reason (only reasons that occurred appear):
	//
	//	limit          over the hidden rate limit (429, no Retry-After)
	//	concurrency    over the hidden concurrency limit (429, no Retry-After)
	//	segments       over Twilio's hidden segment limit (429, no Retry-After)
	//	outage         during an outage window
	//	rate           over the per-account cap of --twilio-rate, --sendgrid-rate or --fcm-rate
	//	fault_429, fault_500, fault_503, fault_raw_503, fault_reset   an injected fault
	//	request        the request itself: authentication, validation, a magic recipient
	RefusedBy map[string]int `json:"refused_by"`
	// Gone is requests whose client went away before an answer (during the latency).
	Gone int `json:"gone"`
	// Messages is the messages recorded (a SendGrid request records one per recipient), Hung included.
	Messages int `json:"messages"`
	// Segments is the SMS segments of the Twilio and Netgsm messages recorded.
	Segments int `json:"segments"`
}

// TimelineSecond is the counts of one second of the sandbox's clock.
type TimelineSecond struct {
	// Second is the start of the second, UTC.
	Second time.Time `json:"second"`
	TimelineCounts
}

// Timeline is what GET /_sandbox/timeline answers: per second, what became of the requests to the APIs
// asked for (summed over them), the totals since the start or the last Reset, and the limits and
// outage windows that explain them.
//
// A request counts in the second it was stamped: when it passed the hidden rate limit if its API has
// one (so per second, no more than the limit is ever accepted), when it was refused at the door
// (outage, concurrency), else when the sandbox began to judge it, after the latency. Seconds run
// without a gap from the first to the last that saw a request; the last two hours are kept.
type Timeline struct {
	APIs    []string         `json:"apis"`
	Now     time.Time        `json:"now"`
	Seconds []TimelineSecond `json:"seconds"`
	Total   TimelineCounts   `json:"total"`
	Limits  map[string]Limit `json:"limits"`
	Outages []OutageWindow   `json:"outages"`
}

// counts is one second's, or the total, tally of one API.
type counts struct {
	by       [numOutcomes]int
	messages int
	segments int
}

func (c *counts) addTo(out *TimelineCounts) {
	for o, n := range c.by {
		if n == 0 {
			continue
		}
		out.Requests += n
		switch o := outcome(o); {
		case o == outAccepted:
			out.Accepted += n
		case o == outHung:
			out.Hung += n
		case o == outGone:
			out.Gone += n
		case o.refusal():
			out.Refused += n
			out.RefusedBy[outcomeNames[o]] += n
		}
	}
	out.Messages += c.messages
	out.Segments += c.segments
}

type apiTimeline struct {
	mu      sync.Mutex
	seconds map[int64]*counts
	newest  int64
	total   counts
}

type timeline struct {
	apis [numAPIs]apiTimeline
}

// add counts one request of a, stamped at, with outcome o and the messages and segments it recorded.
func (t *timeline) add(a api, at time.Time, o outcome, messages, segments int) {
	sec := at.Unix()
	tl := &t.apis[a]
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if tl.seconds == nil {
		tl.seconds = make(map[int64]*counts)
	}
	c := tl.seconds[sec]
	if c == nil {
		c = &counts{}
		tl.seconds[sec] = c
		if sec > tl.newest {
			tl.newest = sec
		}
		if len(tl.seconds) > timelineSeconds {
			for k := range tl.seconds {
				if k <= tl.newest-timelineSeconds {
					delete(tl.seconds, k)
				}
			}
		}
	}
	for _, c := range []*counts{c, &tl.total} {
		c.by[o]++
		c.messages += messages
		c.segments += segments
	}
}

func (t *timeline) reset() {
	for a := range t.apis {
		tl := &t.apis[a]
		tl.mu.Lock()
		tl.seconds, tl.newest, tl.total = nil, 0, counts{}
		tl.mu.Unlock()
	}
}

// snapshot sums the seconds from since on and the totals of the APIs given.
func (t *timeline) snapshot(apis []api, since time.Time) (seconds []TimelineSecond, total TimelineCounts) {
	total.RefusedBy = make(map[string]int)
	merged := make(map[int64]*counts)
	for _, a := range apis {
		tl := &t.apis[a]
		tl.mu.Lock()
		for sec, c := range tl.seconds {
			if !since.IsZero() && sec < since.Unix() {
				continue
			}
			m := merged[sec]
			if m == nil {
				m = &counts{}
				merged[sec] = m
			}
			for o, n := range c.by {
				m.by[o] += n
			}
			m.messages += c.messages
			m.segments += c.segments
		}
		tl.total.addTo(&total)
		tl.mu.Unlock()
	}
	if len(merged) == 0 {
		return []TimelineSecond{}, total
	}
	first, last := int64(0), int64(0)
	for sec := range maps.Keys(merged) {
		if first == 0 || sec < first {
			first = sec
		}
		last = max(last, sec)
	}
	seconds = make([]TimelineSecond, 0, last-first+1)
	for sec := first; sec <= last; sec++ {
		ts := TimelineSecond{Second: time.Unix(sec, 0).UTC(), TimelineCounts: TimelineCounts{RefusedBy: map[string]int{}}}
		if c := merged[sec]; c != nil {
			c.addTo(&ts.TimelineCounts)
		}
		seconds = append(seconds, ts)
	}
	return seconds, total
}

// TimelineOf returns the timeline of the APIs named in only (comma-separated; empty means all), from the
// second of since on (zero: all the seconds kept), with their outage windows.
func (s *Server) TimelineOf(only string, since time.Time) (Timeline, error) {
	apis, err := parseOnly(only)
	if err != nil {
		return Timeline{}, err
	}
	now := s.now()
	tl := Timeline{Now: now.UTC(), Limits: s.Limits(), Outages: s.push.outages.list(apis, now)}
	for _, a := range apis {
		tl.APIs = append(tl.APIs, a.String())
	}
	tl.Seconds, tl.Total = s.push.timeline.snapshot(apis, since)
	return tl, nil
}
