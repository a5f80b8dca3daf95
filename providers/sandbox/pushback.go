package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// APIs are the provider APIs the sandbox imitates, in the order Limits, timelines and outages list
// them. Faults.Only, the limits' and the outages' "only" name them.
var APIs = []string{"twilio", "netgsm", "sendgrid", "fcm", "webhook"}

// api indexes APIs.
type api int

const (
	apiTwilio api = iota
	apiNetgsm
	apiSendGrid
	apiFCM
	apiWebhook
	numAPIs
)

func (a api) String() string { return APIs[a] }

// apiNamed returns the index of the API called name.
func apiNamed(name string) (api, bool) {
	i := slices.Index(APIs, name)
	return api(i), i >= 0
}

// parseOnly reads a comma-separated list of API names; empty (or "all") means every API.
func parseOnly(only string) ([]api, error) {
	only = strings.TrimSpace(only)
	if only == "" || only == "all" {
		return []api{apiTwilio, apiNetgsm, apiSendGrid, apiFCM, apiWebhook}, nil
	}
	var out []api
	for _, p := range strings.Split(only, ",") {
		a, ok := apiNamed(strings.TrimSpace(p))
		if !ok {
			return nil, fmt.Errorf("unknown API %q (give twilio, netgsm, sendgrid, fcm or webhook)", strings.TrimSpace(p))
		}
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out, nil
}

// maxLimit bounds a hidden limit: the sliding window keeps one entry per admitted request or segment.
const maxLimit = 1_000_000

// Limit is an API's hidden limit: what the provider enforces without telling (no Retry-After). A request
// over it gets the provider's 429 and is not recorded. Zero fields are no limit.
type Limit struct {
	// Rate is the most requests the API takes in any one second (a sliding window over all connections and
	// credentials together, on the sandbox's clock). Refused requests do not count; every request that
	// passes does, whatever is answered next (an injected fault, a validation error).
	Rate int `json:"rate"`
	// Concurrency is the most requests the API holds at once, from arrival to answer (Options.Latency and
	// requests left hanging by the timeout fault included). The excess is refused at once.
	Concurrency int `json:"concurrency"`
	// Segments (Twilio only) is the most SMS segments Twilio takes in any one second: the segments of each
	// valid message's Body (GSM-7 or UCS-2, as num_segments) count once it passed every other check. A
	// message longer than the whole limit passes only into an empty second.
	Segments int `json:"segments"`
}

func (l Limit) validate(apis []api) error {
	for _, f := range []struct {
		name string
		v    int
	}{{"rate", l.Rate}, {"concurrency", l.Concurrency}, {"segments", l.Segments}} {
		if f.v < 0 || f.v > maxLimit {
			return fmt.Errorf("%s %d: give 0 (no limit) to %d", f.name, f.v, maxLimit)
		}
	}
	if l.Segments > 0 && slices.ContainsFunc(apis, func(a api) bool { return a != apiTwilio }) {
		return errors.New("segments: only Twilio counts segments (give only \"twilio\")")
	}
	return nil
}

// ValidateLimits checks limits as Options.Limits takes them: API names as keys, no negative values,
// segments for Twilio only.
func ValidateLimits(limits map[string]Limit) error {
	for name, l := range limits {
		a, ok := apiNamed(name)
		if !ok {
			return fmt.Errorf("limits: unknown API %q (give twilio, netgsm, sendgrid, fcm or webhook)", name)
		}
		if err := l.validate([]api{a}); err != nil {
			return fmt.Errorf("limits of %s: %w", name, err)
		}
	}
	return nil
}

// pushback is the state of the hidden limits and the outages, shared by all APIs.
type pushback struct {
	limits   atomic.Pointer[[numAPIs]Limit]
	rate     [numAPIs]slidingWindow
	segments slidingWindow // Twilio's
	inflight [numAPIs]atomic.Int64
	outages  outageBook
	timeline timeline
}

// Limits returns every API's hidden limit (zero: none).
func (s *Server) Limits() map[string]Limit {
	ls := s.push.limits.Load()
	out := make(map[string]Limit, numAPIs)
	for a := range numAPIs {
		out[a.String()] = ls[a]
	}
	return out
}

// SetLimits replaces the hidden limit of the APIs named in only (comma-separated; empty means all) with
// l. The other APIs keep theirs; the requests already counted in the last second still count.
func (s *Server) SetLimits(only string, l Limit) error {
	apis, err := parseOnly(only)
	if err != nil {
		return err
	}
	if err := l.validate(apis); err != nil {
		return err
	}
	for {
		old := s.push.limits.Load()
		next := *old
		for _, a := range apis {
			next[a] = l
		}
		if s.push.limits.CompareAndSwap(old, &next) {
			return nil
		}
	}
}

// slidingWindow counts what was admitted in the last second, oldest first, to hold a limit over any
// one-second span. Each entry is an admission time (nanoseconds since the server's epoch, on the
// monotonic clock) and its weight (1 for a request, the segments of a message).
type slidingWindow struct {
	mu     sync.Mutex
	at     []int64
	weight []int32
	head   int
	sum    int
}

// take admits n units at the time now() gives under the window's lock, if the units admitted in the
// second before plus n stay within limit (n alone over the limit passes only an empty window). It
// returns that time, so admissions are stamped in the order they were counted, and when refused, the
// time the oldest unit leaves the window.
func (w *slidingWindow) take(now func() time.Time, epoch time.Time, n, limit int) (at time.Time, ok bool, free time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	at = now()
	t := at.Sub(epoch).Nanoseconds()
	for w.head < len(w.at) && w.at[w.head] <= t-int64(time.Second) {
		w.sum -= int(w.weight[w.head])
		w.head++
	}
	if w.head == len(w.at) {
		w.at, w.weight, w.head = w.at[:0], w.weight[:0], 0
	} else if w.head > 1024 && w.head > len(w.at)/2 {
		w.at = w.at[:copy(w.at, w.at[w.head:])]
		w.weight = w.weight[:copy(w.weight, w.weight[w.head:])]
		w.head = 0
	}
	if w.sum > 0 && w.sum+n > limit {
		return at, false, epoch.Add(time.Duration(w.at[w.head]) + time.Second)
	}
	n = min(n, maxLimit)
	w.at = append(w.at, t)
	w.weight = append(w.weight, int32(n))
	w.sum += n
	return at, true, time.Time{}
}

func (w *slidingWindow) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.at, w.weight, w.head, w.sum = nil, nil, 0, 0
}

// exchange follows one provider request from arrival to answer. It is the ResponseWriter the handler
// writes to: the first status written decides the request's outcome in the timeline, unless the
// handler named it before (a fault, a limit, an outage).
type exchange struct {
	http.ResponseWriter
	s        *Server
	api      api
	at       time.Time // the request's stamp: the second of the timeline it counts in
	slot     bool      // holds one of the API's in-flight places
	decided  bool
	messages int
	segments int
	// recipient is the recipient the request named, once read: the debug records mask and log it.
	recipient string
}

func (x *exchange) Unwrap() http.ResponseWriter { return x.ResponseWriter }

func (x *exchange) WriteHeader(status int) {
	if status >= 200 && !x.decided {
		o := outAccepted
		if status >= 300 {
			o = outRequest
		}
		x.decide(o)
	}
	x.ResponseWriter.WriteHeader(status)
}

func (x *exchange) Write(b []byte) (int, error) {
	if !x.decided {
		x.decide(outAccepted)
	}
	return x.ResponseWriter.Write(b)
}

// decide counts the request in the timeline with outcome o, once.
func (x *exchange) decide(o outcome) {
	if x.decided {
		return
	}
	x.decided = true
	if x.at.IsZero() {
		x.at = x.s.now()
	}
	x.s.push.timeline.add(x.api, x.at, o, x.messages, x.segments)
}

// recipient returns the recipient of the request answered through w, "" before it was read.
func recipient(w http.ResponseWriter) string {
	if x := exchangeOf(w); x != nil {
		return x.recipient
	}
	return ""
}

// exchangeOf returns the exchange behind w, nil when w is not one.
func exchangeOf(w http.ResponseWriter) *exchange {
	x, _ := w.(*exchange)
	return x
}

// mark names the outcome of the request answered through w, before the answer is written.
func mark(w http.ResponseWriter, o outcome) {
	if x := exchangeOf(w); x != nil {
		x.decide(o)
	}
}

// recorded notes that the request answered through w had messages recorded, with their SMS segments.
func recorded(w http.ResponseWriter, messages, segments int) {
	if x := exchangeOf(w); x != nil {
		x.messages += messages
		x.segments += segments
	}
}

// arrive starts a provider request to a: it counts the request, refuses it at the door during an outage
// of a or over a's concurrency limit, waits Options.Latency when latency is set, and then refuses it if
// an outage began meanwhile. It returns the ResponseWriter the handler must use from then on, and done,
// which the handler must defer. ok is false when the request was answered already.
func (s *Server) arrive(w http.ResponseWriter, r *http.Request, a api, latency bool) (_ http.ResponseWriter, done func(), ok bool) {
	s.log.request()
	x := &exchange{ResponseWriter: w, s: s, api: a}
	done = func() {
		if x.slot {
			x.slot = false
			s.push.inflight[a].Add(-1)
		}
		if !x.decided {
			x.decide(outGone)
		}
	}
	defer func() {
		// The latency's wait and the hang outage end the handler with a panic, before it could defer done.
		if v := recover(); v != nil {
			done()
			panic(v)
		}
	}()
	now := s.now()
	if win := s.push.outages.active(a, now); win != nil {
		x.at = now
		s.outageAnswer(x, r, win)
		return x, done, false
	}
	if c := int64(s.push.limits.Load()[a].Concurrency); c > 0 {
		for {
			n := s.push.inflight[a].Load()
			if n >= c {
				x.at = now
				s.tooMany(x, r, outConcurrency, int(c), now.Add(time.Second))
				return x, done, false
			}
			if s.push.inflight[a].CompareAndSwap(n, n+1) {
				break
			}
		}
	} else {
		s.push.inflight[a].Add(1)
	}
	x.slot = true
	if latency {
		sleep(r.Context(), s.opts.Latency)
		now = s.now()
		if win := s.push.outages.active(a, now); win != nil {
			x.at = now
			s.outageAnswer(x, r, win)
			return x, done, false
		}
	}
	x.at = now
	return x, done, true
}

// overRate applies the hidden rate limit of the request's API. It returns true when the request was over
// it and has been answered. A request that passes is stamped with the time the window counted it.
func (s *Server) overRate(w http.ResponseWriter, r *http.Request) bool {
	x := exchangeOf(w)
	if x == nil {
		return false
	}
	limit := s.push.limits.Load()[x.api].Rate
	if limit <= 0 {
		return false
	}
	at, ok, free := s.push.rate[x.api].take(s.now, s.epoch, 1, limit)
	x.at = at
	if ok {
		return false
	}
	s.tooMany(x, r, outLimit, limit, free)
	return true
}

// overSegments applies Twilio's hidden segment limit to a valid message of n segments. It returns true
// when the message was over it and has been answered.
func (s *Server) overSegments(w http.ResponseWriter, r *http.Request, n int) bool {
	x := exchangeOf(w)
	if x == nil {
		return false
	}
	ls := s.push.limits.Load()[apiTwilio]
	if ls.Segments <= 0 {
		return false
	}
	at, ok, free := s.push.segments.take(s.now, s.epoch, max(n, 1), ls.Segments)
	if ls.Rate <= 0 {
		// Without a rate limit the segment window's time is the request's stamp; with one, the rate
		// window's stamp stays, so that the timeline's seconds hold the rate exactly.
		x.at = at
	}
	if ok {
		return false
	}
	s.tooMany(x, r, outSegments, ls.Segments, free)
	return true
}

// tooMany answers a request over a hidden limit with the provider's own 429 and no Retry-After: what
// the provider sends when it does not say how long to wait. limit and free feed SendGrid's
// X-RateLimit-Limit and X-RateLimit-Reset.
func (s *Server) tooMany(x *exchange, r *http.Request, o outcome, limit int, free time.Time) {
	x.decide(o)
	switch x.api {
	case apiTwilio:
		s.twilioReply(x, r, http.StatusTooManyRequests, codeTooManyRequests, "Too Many Requests", false)
	case apiNetgsm:
		// Netgsm says so in a 200, with its rate-limit code.
		s.netgsmError(x, http.StatusOK, netgsmRate, "Gönderim hız sınırı aşıldı.")
	case apiSendGrid:
		s.sendgridLimited(x, limit, free)
	case apiFCM:
		s.fcmError(x, "", "", http.StatusTooManyRequests, "RESOURCE_EXHAUSTED", fcmQuotaExceeded,
			"Quota exceeded for quota metric 'Messages per minute' of service 'fcm.googleapis.com'.")
	case apiWebhook:
		s.webhookError(x, "", http.StatusTooManyRequests, "too many requests")
	}
}

// outageAnswer answers a request that arrived during the outage win, as its mode says.
func (s *Server) outageAnswer(x *exchange, r *http.Request, win *outageWindow) {
	win.refused.Add(1)
	x.decide(outOutage)
	switch win.mode {
	case OutageRaw503:
		s.log.rejected(http.StatusServiceUnavailable, 0)
		writeRaw503(x)
		return
	case OutageReset:
		s.log.connReset()
		resetConn(x)
		return
	case OutageHang:
		// Read the body first: only then does net/http notice that the client has gone.
		_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, 2*sendgridMaxBody))
		hang(r)
		return
	}
	switch x.api {
	case apiTwilio:
		s.twilioReply(x, r, http.StatusServiceUnavailable, codeUnavailable, "Service Unavailable", false)
	case apiNetgsm:
		s.netgsmError(x, http.StatusServiceUnavailable, netgsmUnavailable, "Sistem hatası.")
	case apiSendGrid:
		s.sendgridError(x, nil, http.StatusServiceUnavailable, "", "service unavailable")
	case apiFCM:
		s.fcmError(x, "", "", http.StatusServiceUnavailable, "UNAVAILABLE", fcmUnavailable, "The service is currently unavailable.")
	case apiWebhook:
		s.webhookError(x, "", http.StatusServiceUnavailable, "service unavailable")
	}
}

// sendgridLimited is SendGrid's 429 as its rate-limits page documents it: X-RateLimit-Limit,
// X-RateLimit-Remaining 0 and X-RateLimit-Reset (Unix seconds, rounded up) and the body
// {"errors":[{"field":null,"message":"too many requests"}]}, no Retry-After.
func (s *Server) sendgridLimited(w http.ResponseWriter, limit int, free time.Time) {
	s.log.rejected(http.StatusTooManyRequests, 0)
	s.sendgridLogRequest(nil, http.StatusTooManyRequests)
	reset := free.Unix()
	if free.Nanosecond() > 0 {
		reset++
	}
	w.Header().Set("X-RateLimit-Limit", strconv.Itoa(limit))
	w.Header().Set("X-RateLimit-Remaining", "0")
	w.Header().Set("X-RateLimit-Reset", strconv.FormatInt(reset, 10))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write([]byte(`{"errors":[{"field":null,"message":"too many requests"}]}` + "\n"))
}

// pushbackRoutes registers the control API of the hidden limits, the outages and the timeline:
//
//	GET  /_sandbox/limits          every API's Limit: {"twilio":{"rate":800,"concurrency":0,"segments":0},...}
//	POST /_sandbox/limits          {"only":"twilio","rate":800,"concurrency":50,"segments":0}: replace the named APIs' limits
//	GET  /_sandbox/outages         the outage windows ([]OutageWindow)
//	POST /_sandbox/outages         {"only":"twilio","mode":"503","start":RFC 3339,"after_ms":0,"duration_ms":20000}: open windows
//	POST /_sandbox/outages/stop    {"only":"twilio"} (or no body: all): end them now
//	GET  /_sandbox/timeline        Timeline; ?api=twilio,sendgrid sums those APIs only, ?since= (Unix seconds or RFC 3339)
func (s *Server) pushbackRoutes() {
	s.mux.HandleFunc("GET /_sandbox/limits", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.Limits())
	})
	s.mux.HandleFunc("POST /_sandbox/limits", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Only string `json:"only"`
			Limit
		}
		if !decodeControl(w, r, &req, false) {
			return
		}
		if err := s.SetLimits(req.Only, req.Limit); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		s.logger.Info("sandbox limits set", "only", req.Only, "limit", req.Limit)
		writeJSON(w, http.StatusOK, s.Limits())
	})
	s.mux.HandleFunc("GET /_sandbox/outages", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.Outages())
	})
	s.mux.HandleFunc("POST /_sandbox/outages", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Only       string     `json:"only"`
			Mode       OutageMode `json:"mode"`
			Start      time.Time  `json:"start"`
			AfterMS    int64      `json:"after_ms"`
			DurationMS int64      `json:"duration_ms"`
		}
		if !decodeControl(w, r, &req, false) {
			return
		}
		ws, err := s.StartOutage(OutagePlan{
			Only: req.Only, Mode: req.Mode, Start: req.Start,
			After: time.Duration(req.AfterMS) * time.Millisecond, Duration: time.Duration(req.DurationMS) * time.Millisecond,
		})
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		s.logger.Info("sandbox outage planned", "windows", ws)
		writeJSON(w, http.StatusOK, ws)
	})
	s.mux.HandleFunc("POST /_sandbox/outages/stop", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Only string `json:"only"`
		}
		if !decodeControl(w, r, &req, true) {
			return
		}
		if err := s.StopOutages(req.Only); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		s.logger.Info("sandbox outages stopped", "only", req.Only)
		writeJSON(w, http.StatusOK, s.Outages())
	})
	s.mux.HandleFunc("GET /_sandbox/timeline", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		var since time.Time
		if v := q.Get("since"); v != "" {
			if sec, err := strconv.ParseInt(v, 10, 64); err == nil {
				since = time.Unix(sec, 0)
			} else if since, err = time.Parse(time.RFC3339Nano, v); err != nil {
				writeJSON(w, http.StatusBadRequest, map[string]string{"error": "since: give Unix seconds or an RFC 3339 time"})
				return
			}
		}
		tl, err := s.TimelineOf(q.Get("api"), since)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "api: " + err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, tl)
	})
}

// decodeControl decodes a control request's JSON body into v, refusing unknown fields; an empty body is
// allowed when emptyOK. It answers 400 and returns false when the body is bad.
func decodeControl(w http.ResponseWriter, r *http.Request, v any, emptyOK bool) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil || emptyOK && errors.Is(err, io.EOF) {
		return true
	}
	writeJSON(w, http.StatusBadRequest, map[string]string{"error": "decode: " + err.Error()})
	return false
}
