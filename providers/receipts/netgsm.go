package receipts

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/netgsm"
)

// Netgsm posts no receipts: NetgsmPoller asks its report API instead, for the messages sent through it
// whose delivery is not known yet, ReportBatch at a time, one query every NetgsmPoller.Every (Netgsm
// answers netgsm.ReportsPerMinute a minute). A final status becomes a Receipt like the other providers':
//
//	Netgsm report status                  Receipt.Status
//	0 pending                             (asked again on the next round)
//	1 delivered                           delivered
//	2, 3, 11, 12, 15, 16                  undelivered   Error "netgsm 12: the operator could not deliver it"
//	4, 13, 14, 17                         failed        Error "netgsm 14: the account's credit ran out: not sent"
//	none, or one not listed here          (asked again; an unknown one counted in Stats.Ignored)
//
// A delivered receipt is dated when Netgsm says the handset got it; the others when the report was read.
//
// Status 16 (İYS holds no consent for the number) is also a provider's refusal for want of consent, the
// same as a send's code 50 found after the message was accepted: NetgsmPoller.NoConsent records it (the
// person's stored consent turns RET here; nothing goes to İYS) before the receipt, so that a failure in
// between asks again rather than loses it.

// ReportBatch is how many messages one report query asks about (Netgsm's page size).
const ReportBatch = netgsm.ReportPageSize

// DueMessage is a message whose report is asked for: sent through Netgsm, its delivery not final.
type DueMessage struct {
	CampaignID         int64
	UserID             string
	Address, MessageID string
	SentAt             time.Time
}

// NoConsent is a message Netgsm refused for want of İYS consent (report status 16): to Address, sent at
// At, with Evidence naming its job.
type NoConsent struct {
	Address, Evidence string
	At                time.Time
}

// NetgsmReporter asks Netgsm's report API (netgsm.Provider.Report).
type NetgsmReporter interface {
	Report(ctx context.Context, jobIDs []string, from, to time.Time) ([]netgsm.ReportJob, error)
}

// NetgsmPoller turns Netgsm's reports into receipts. Its fields are set before Run and not changed after.
type NetgsmPoller struct {
	Reporter NetgsmReporter
	// Due returns up to limit messages due a report after the one named (campaign 0 and user "": from the
	// start), in a stable order (campaign.Store.ReportsDue).
	Due func(ctx context.Context, afterCampaign int64, afterUser string, limit int) ([]DueMessage, error)
	// Sink records the receipts (the same as the webhooks').
	Sink Sink
	// NoConsent records, in one write, that Netgsm found no İYS consent for campaign id's messages ns
	// (campaign.Store.ProviderNoConsents): each dated with its send, since a consent given after the send
	// is not the one İYS refused.
	NoConsent func(ctx context.Context, campaignID int64, ns []NoConsent) error
	// Every is the pause between two queries; Idle the pause once nothing is due.
	Every, Idle time.Duration
	// GiveUpAfter is how many rounds in a row may fail before Run returns (0: never), so that a process
	// that cannot ask Netgsm (its address not on the account's allow-list) lets another one poll.
	GiveUpAfter int
	Log         *slog.Logger

	stats     counter
	afterCamp int64
	afterUser string
	lastErr   string
	loggedAt  time.Time
}

// Stats returns what the poller did: Accepted counts the queries answered, Receipts the final statuses
// recorded, Refusals the İYS refusals among them, Unmatched the reports that named another number than
// the message's, Ignored the statuses this package does not know ("status_N"), SinkErrors the rounds
// the sinks failed, Rejected the queries refused by reason.
func (p *NetgsmPoller) Stats() Stats {
	p.count(func(*Stats) {}) // its maps are made, for a poller that has counted nothing yet
	return p.stats.snapshot()
}

func (p *NetgsmPoller) count(f func(*Stats)) {
	p.stats.update(func(s *Stats) {
		if s.Rejected == nil {
			s.Rejected, s.Ignored = map[string]int64{}, map[string]int64{}
		}
		f(s)
	})
}

// Run polls until ctx is done, or until GiveUpAfter rounds in a row failed; it reports whether it gave up.
// It first asks about a job that cannot exist, so that wrong credentials are logged at once rather than
// once something is due.
func (p *NetgsmPoller) Run(ctx context.Context) (gaveUp bool) {
	failed := 0
	if _, err := p.Reporter.Report(ctx, []string{"0"}, time.Now().Add(-time.Minute), time.Now()); err != nil && ctx.Err() == nil {
		p.fail("ask Netgsm for its reports", err)
		failed++
	}
	for {
		wait, ok := p.Poll(ctx)
		if ok {
			failed = 0
		} else if failed++; p.GiveUpAfter > 0 && failed >= p.GiveUpAfter && ctx.Err() == nil {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
	}
}

// Poll makes one query for the next messages due (starting again from the first once the last were
// asked about), records what it says, and returns how long to wait before the next, and whether the
// round went through (nothing due is a round that went through).
func (p *NetgsmPoller) Poll(ctx context.Context) (time.Duration, bool) {
	now := time.Now
	due, err := p.Due(ctx, p.afterCamp, p.afterUser, ReportBatch)
	if err == nil && len(due) == 0 && (p.afterCamp != 0 || p.afterUser != "") {
		p.afterCamp, p.afterUser = 0, ""
		due, err = p.Due(ctx, 0, "", ReportBatch)
	}
	if err != nil {
		return p.failed(ctx, "read the messages due a report", err, false)
	}
	if len(due) == 0 {
		return max(p.Idle, p.Every), true
	}
	ids := make([]string, len(due))
	from := due[0].SentAt
	for i, d := range due {
		ids[i] = d.MessageID
		if d.SentAt.Before(from) {
			from = d.SentAt
		}
	}
	// The minutes around: Netgsm keeps its own time of acceptance, a little after the send's.
	jobs, err := p.Reporter.Report(ctx, ids, from.Add(-time.Minute), now().Add(time.Minute))
	if err != nil && ctx.Err() != nil {
		return p.Every, true // stopped, not failed
	}
	if err != nil {
		var pe *providers.Error
		reason := ReasonMalformed
		wait := p.Every
		if errors.As(err, &pe) {
			switch {
			case pe.Throttled:
				reason = "throttled"
			case pe.Account:
				reason = "account"
			default:
				reason = "provider_" + pe.Class.String()
			}
			wait = max(wait, pe.RetryAfter)
			if pe.Account {
				wait = max(wait, time.Minute)
			}
		}
		p.count(func(s *Stats) { s.Rejected[reason]++ })
		p.fail("ask Netgsm for its reports", err)
		return wait, false
	}
	p.count(func(s *Stats) { s.Accepted++ })
	byJob := make(map[string][]netgsm.ReportJob, len(jobs))
	for _, j := range jobs {
		byJob[j.JobID] = append(byJob[j.JobID], j)
	}
	at := now()
	var rs []Receipt
	refused := map[int64][]NoConsent{} // by campaign
	var nRefused int
	var unmatched int64
	unknown := map[string]int64{}
	for _, d := range due {
		for _, j := range byJob[d.MessageID] {
			if j.Number != d.Address {
				unmatched++
				continue
			}
			status, reason, noConsent := j.Outcome()
			if status == "" {
				if j.Status > 0 {
					unknown["status_"+strconv.Itoa(j.Status)]++
				}
				continue
			}
			when := at
			if status == "delivered" && !j.DeliveredAt.IsZero() {
				// When the handset got it, as Netgsm says, within the send and now.
				when = j.DeliveredAt
				if when.Before(d.SentAt) {
					when = d.SentAt
				}
				if when.After(at) {
					when = at
				}
			}
			rs = append(rs, Receipt{Provider: "netgsm", MessageID: d.MessageID, CampaignID: d.CampaignID, UserID: d.UserID,
				Address: d.Address, Status: status, Error: reason, EventID: "netgsm:" + d.MessageID + ":" + strconv.Itoa(j.Status), At: when})
			if noConsent {
				// Dated with the send: Netgsm asked İYS then.
				refused[d.CampaignID] = append(refused[d.CampaignID], NoConsent{Address: d.Address, At: d.SentAt,
					Evidence: fmt.Sprintf("netgsm report: job %s status %d (İYS rejected)", d.MessageID, j.Status)})
				nRefused++
			}
		}
	}
	for id, ns := range refused {
		if err := p.NoConsent(ctx, id, ns); err != nil {
			return p.failed(ctx, "record Netgsm's İYS refusals", err, true)
		}
	}
	if len(rs) > 0 {
		if err := p.Sink.Record(ctx, rs); err != nil {
			return p.failed(ctx, "record Netgsm's reports", err, true)
		}
	}
	p.count(func(s *Stats) {
		s.Receipts += int64(len(rs))
		s.Refusals += int64(nRefused)
		s.Unmatched += unmatched
		for k, n := range unknown {
			s.Ignored[k] += n
		}
	})
	if len(rs) > 0 || unmatched > 0 || len(unknown) > 0 {
		p.log().Info("netgsm reports recorded", "asked", len(due), "final", len(rs), "iys_refused", nRefused, "other_number", unmatched,
			"unknown_statuses", len(unknown))
	}
	last := due[len(due)-1]
	p.afterCamp, p.afterUser = last.CampaignID, last.UserID
	p.lastErr = ""
	return p.Every, true
}

// failed ends a round that could not what: quietly when ctx is done (a stop, not a failure: the round
// is asked again), else logged (fail) and, when a sink failed, counted.
func (p *NetgsmPoller) failed(ctx context.Context, what string, err error, sink bool) (time.Duration, bool) {
	if ctx.Err() != nil {
		return p.Every, true
	}
	if sink {
		p.count(func(s *Stats) { s.SinkErrors++ })
	}
	p.fail(what, err)
	return p.Every, false
}

// fail logs a failed round: the first of a run of the same error, then once a minute.
func (p *NetgsmPoller) fail(what string, err error) {
	msg := what + ": " + err.Error()
	if msg == p.lastErr && time.Since(p.loggedAt) < time.Minute {
		return
	}
	p.lastErr, p.loggedAt = msg, time.Now()
	p.log().Warn("netgsm reports: could not "+what, "err", err)
}

func (p *NetgsmPoller) log() *slog.Logger {
	if p.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return p.Log
}
