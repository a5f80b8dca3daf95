package supervisor

import (
	"math"
	"time"
)

// Observation is one look at the batch queue and at the rate caps of the running campaigns.
type Observation struct {
	// At is when it was taken; Decide reads it as "now".
	At time.Time
	// Pending is how many batch tasks are ready and wait for a free worker slot.
	Pending int
	// Active is how many are being run, including those of a worker that died, until Asynq hands them
	// back.
	Active int
	// Due is how many scheduled or retrying tasks become ready within the look-ahead (before the next
	// decision could react to them).
	Due int
	// Latency is how long the oldest pending task has waited.
	Latency time.Duration
	// Paused says the queue itself is paused (asynqmon, Inspector.PauseQueue): workers take nothing new.
	Paused bool
	// RateCap is how many messages per second the running campaigns may send together under their own and
	// their providers' caps (see RateCap); 0 when nothing runs or when Uncapped.
	RateCap float64
	// Uncapped says some running campaign is capped neither by its own --rate nor by its provider.
	Uncapped bool
	// Sends counts, per running campaign, the provider calls made so far (sent, failed, unknown).
	Sends map[int64]int64
	// SendRate is the provider calls per second between the previous observation (at RateSince) and this
	// one, from Sends; the supervisor fills it in (see SendRate). 0 when unknown.
	SendRate  float64
	RateSince time.Time
	// Beating holds the process IDs, on this machine, of the workers whose heartbeat is live; nil when not
	// known (then no worker is judged hung: see Config.HungAfter).
	Beating map[int]bool
	// Supervisors is how many supervisors size pools from this queue, this one included (0 or 1: alone).
	// Each keeps its share of the workers the queue needs: the queue, the sends and the caps are everyone's.
	Supervisors int
}

// Policy sizes the pool of worker processes.
type Policy struct {
	// Min and Max bound the number of workers.
	Min, Max int
	// Concurrency is how many batches one worker runs at once (its --concurrency).
	Concurrency int
	// Cooldown is how long fewer workers must have been enough before one is stopped, and the least time
	// between two changes before a scale down.
	Cooldown time.Duration
	// WaitLimit: while a pending task has waited this long, no worker is stopped, whatever the counts
	// say (the workers have slots but are not taking tasks: starting, or stuck on Redis). Default 5 s;
	// a free slot takes a task within a second.
	WaitLimit time.Duration
}

// State is what Decide carries from one decision to the next.
type State struct {
	// Workers is the number of workers the pool is kept at.
	Workers int
	// LastChange is when Workers last changed (the start counts as a change).
	LastChange time.Time
	// LowSince is since when fewer workers than Workers have been enough (zero: they have not).
	LowSince time.Time
	// PerWorker is the messages per second one worker was seen to send with every slot busy; 0 until
	// seen.
	PerWorker float64
}

// Decision is the outcome of one look, with the figures it was made from.
type Decision struct {
	From, To int
	// Backlog is the batches that want a worker slot now: pending + active + due (only active when the
	// queue is paused).
	Backlog int
	// Need is the workers the backlog fills: ceil(Backlog / Concurrency), divided among the Supervisors
	// (this pool's share, rounded up).
	Need int
	// Supervisors is how many supervisors share the queue (Observation.Supervisors); 0 when this one is
	// alone.
	Supervisors int
	// RateLimit is the workers that saturate the running campaigns' rate caps; 0 when not known or not
	// capped.
	RateLimit int
	// Reason says why, in one word (the Reason* constants).
	Reason string
}

// Reasons a Decision gives.
const (
	// ReasonBacklog: more batches are ready than the workers have slots for.
	ReasonBacklog = "backlog"
	// ReasonMin: the pool is below --min.
	ReasonMin = "min"
	// ReasonMax: the backlog wants more than --max.
	ReasonMax = "max"
	// ReasonRateCap: more workers would only wait for the rate caps.
	ReasonRateCap = "rate_cap"
	// ReasonIdle: nothing is queued or running; one worker stops.
	ReasonIdle = "idle"
	// ReasonShrank: the backlog fits in fewer workers; one worker stops.
	ReasonShrank = "backlog_shrank"
	// ReasonCooldown: fewer workers would do, but not for long enough yet.
	ReasonCooldown = "cooldown"
	// ReasonPaused: the queue is paused; only the batches already running count.
	ReasonPaused = "queue_paused"
	// ReasonSteady: the pool is the right size.
	ReasonSteady = "steady"
	// ReasonStillStopping: a scale down waits until the worker stopped last has exited.
	ReasonStillStopping = "previous_still_stopping"
	// ReasonWaiting: fewer workers would do by the counts, but a pending task has waited WaitLimit.
	ReasonWaiting = "tasks_waiting"
)

// Saturation is the share of the rate cap above which the caps, not the workers, are taken to limit the
// send rate.
const Saturation = 0.9

// Action names what a decision does: "scale up", "scale down" or "hold".
func (d Decision) Action() string {
	switch {
	case d.To > d.From:
		return "scale up"
	case d.To < d.From:
		return "scale down"
	}
	return "hold"
}

// Decide sizes the pool from one observation.
//
//	backlog    = pending + active + due            (active only, when the queue is paused)
//	need       = ceil(ceil(backlog / concurrency) / supervisors)
//	                                               this pool's share of the workers that give every ready
//	                                               batch a slot now
//	rate_limit = workers                           when the running campaigns send at ≥ 90 % of their caps
//	           = ceil(ceil(rate_cap / per_worker) / supervisors)
//	                                               otherwise, once per_worker has been seen
//	           = none                              when nothing is capped or per_worker is not known yet
//	wanted     = clamp(min(need, rate_limit), min, max)
//
// per_worker is the send rate over the last interval divided by the workers of every pool (this pool's
// times the supervisors: the pools are taken to be alike), measured only when every slot was busy and the
// pool did not change during the interval: what one worker sends when it is not short of work. The queue,
// the send rate and the caps are the same for every supervisor on the queue; each keeps its share. Scaling up goes to wanted at once. Scaling down goes one worker at a time, once wanted has stayed
// below the pool for the cooldown and the cooldown has passed since the last change, and never while the
// queue's latency (its oldest pending task) is at WaitLimit or more.
func (p Policy) Decide(st State, o Observation) (Decision, State) {
	c := max(1, p.Concurrency)
	d := Decision{From: st.Workers, Backlog: o.Pending + o.Active + o.Due}
	if o.Paused {
		d.Backlog = o.Active
	}
	n := max(1, o.Supervisors)
	if n > 1 {
		d.Supervisors = n
	}
	d.Need = ceilDiv(ceilDiv(d.Backlog, c), n)

	if o.SendRate > 0 && st.Workers > 0 && !o.RateSince.IsZero() && !st.LastChange.After(o.RateSince) && o.Active >= st.Workers*c*n {
		st.PerWorker = o.SendRate / float64(st.Workers*n)
	}
	if o.RateCap > 0 && !o.Uncapped {
		switch {
		case st.Workers > 0 && o.SendRate >= Saturation*o.RateCap:
			d.RateLimit = st.Workers
		case st.PerWorker > 0:
			d.RateLimit = ceilDiv(max(1, int(math.Ceil(o.RateCap/st.PerWorker-1e-9))), n)
		}
	}
	wanted := d.Need
	if d.RateLimit > 0 {
		wanted = min(wanted, d.RateLimit)
	}
	wanted = min(max(wanted, p.Min), p.Max)

	switch {
	case wanted > st.Workers:
		d.To = wanted
		d.Reason = ReasonBacklog
		if d.Need < wanted {
			// only --min asks for these
			d.Reason = ReasonMin
		}
		st.LastChange, st.LowSince = o.At, time.Time{}
	case wanted < st.Workers && !o.Paused && o.Pending > 0 && o.Latency >= p.waitLimit():
		d.To, d.Reason = st.Workers, ReasonWaiting
		st.LowSince = time.Time{}
	case wanted < st.Workers:
		if st.LowSince.IsZero() {
			st.LowSince = o.At
		}
		d.To = st.Workers
		d.Reason = ReasonCooldown
		if o.At.Sub(st.LowSince) >= p.Cooldown && o.At.Sub(st.LastChange) >= p.Cooldown {
			d.To = st.Workers - 1
			switch {
			case d.Backlog == 0:
				d.Reason = ReasonIdle
			case d.RateLimit > 0 && d.RateLimit < d.Need:
				d.Reason = ReasonRateCap
			default:
				d.Reason = ReasonShrank
			}
			st.LastChange = o.At
		}
	default:
		d.To = st.Workers
		st.LowSince = time.Time{}
		switch {
		case d.RateLimit > 0 && d.Need > d.RateLimit && d.RateLimit <= st.Workers:
			d.Reason = ReasonRateCap
		case d.Need > p.Max:
			d.Reason = ReasonMax
		case o.Paused:
			d.Reason = ReasonPaused
		case d.Need < st.Workers && st.Workers == p.Min:
			d.Reason = ReasonMin
		default:
			d.Reason = ReasonSteady
		}
	}
	if o.Paused && d.To != d.From {
		d.Reason = ReasonPaused
	}
	st.Workers = d.To
	return d, st
}

func (p Policy) waitLimit() time.Duration {
	if p.WaitLimit > 0 {
		return p.WaitLimit
	}
	return 5 * time.Second
}

// Running is a running campaign as the rate caps see it.
type Running struct {
	// Provider names the provider bucket the campaign's sends take tokens from (its channel will do).
	Provider string
	// Rate is the campaign's own cap (--rate) in messages per second; 0 = none.
	Rate float64
	// PerMessage is how many of its provider's tokens one of its messages takes, on average: the SMS
	// segments a message where the provider's cap counts segments (Twilio's does). 0 or less counts as 1.
	PerMessage float64
}

// RateCap is how many messages per second the running campaigns may send together: for each provider, the
// lower of its cap and the sum of its campaigns' own caps (a campaign without its own cap counts as the
// provider's), summed over the providers. uncapped says some provider has no cap and a campaign on it has
// none either: the rate caps then limit nothing. providerCaps maps a provider to its cap (0 = none), in its
// own tokens: a cap in SMS segments is turned into messages by the mean of its campaigns' PerMessage (a
// cap of 100 segments a second is 50 two-segment messages).
func RateCap(running []Running, providerCaps map[string]float64) (capSum float64, uncapped bool) {
	own := map[string]float64{}
	perMessage := map[string]float64{}
	campaigns := map[string]float64{}
	for _, r := range running {
		perMessage[r.Provider] += max(r.PerMessage, 1)
		campaigns[r.Provider]++
		if r.Rate <= 0 || math.IsInf(own[r.Provider], 1) {
			own[r.Provider] = math.Inf(1)
			continue
		}
		own[r.Provider] += r.Rate
	}
	for prov, sum := range own {
		limit := sum
		if pc := providerCaps[prov]; pc > 0 {
			limit = math.Min(limit, pc/(perMessage[prov]/campaigns[prov]))
		}
		if math.IsInf(limit, 1) {
			return 0, true
		}
		capSum += limit
	}
	return capSum, false
}

// SendRate is the provider calls per second between two observations, counted over the campaigns both saw
// (a campaign that just started or ended, or counters that went back after Redis lost them, count nothing:
// the rate is never overestimated).
func SendRate(prev, cur Observation) float64 {
	dt := cur.At.Sub(prev.At).Seconds()
	if dt <= 0 || prev.Sends == nil {
		return 0
	}
	var n int64
	for id, c := range cur.Sends {
		if p, ok := prev.Sends[id]; ok && c > p {
			n += c - p
		}
	}
	return float64(n) / dt
}

func ceilDiv(a, b int) int {
	if a <= 0 {
		return 0
	}
	return (a + b - 1) / b
}
