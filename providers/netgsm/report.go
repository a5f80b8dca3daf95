package netgsm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/internal/wire"
)

// ReportPath is the path of the report endpoint under the base URL.
const ReportPath = "/sms/rest/v2/report"

// ReportPageSize is the most jobs one report query asks for (Netgsm's page size limit).
const ReportPageSize = 100

// ReportsPerMinute is how many report queries Netgsm takes from an account in a minute; the next is
// refused with code 80.
const ReportsPerMinute = 10

// Netgsm knows no time zone in a report query: its dates are Turkey's time (UTC+3 all year).
var turkey = time.FixedZone("TRT", 3*60*60)

// reportDateLayout is dd.MM.yyyy HH:mm:ss.
const reportDateLayout = "02.01.2006 15:04:05"

// Report statuses of a message (the "status" of a report job).
const (
	ReportPending      = 0  // not yet known
	ReportDelivered    = 1  // delivered to the handset
	ReportExpired      = 2  // not delivered within its validity
	ReportInvalid      = 3  // invalid or restricted number
	ReportNotSent      = 4  // not passed to the operator
	ReportRejected     = 11 // refused by the operator
	ReportDeliveryErr  = 12 // the operator could not deliver it
	ReportDuplicate    = 13 // the same message to the same number again: not sent
	ReportNoCredit     = 14 // the account's credit ran out
	ReportBlacklisted  = 15 // the number is on the account's blacklist
	ReportIYSRejected  = 16 // İYS holds no consent for the number: not sent
	ReportIYSError     = 17 // İYS could not be asked: not sent
	reportStatusUnseen = -1
)

// ReportJob is what a report says of one message.
type ReportJob struct {
	// JobID is the job ID the send answered (the message ID).
	JobID string
	// Number is the recipient in E.164 (+905321234567), as Send was given it.
	Number string
	// Status is one of the Report constants (others may come: Outcome treats them as not delivered).
	Status int
	// ErrorCode is the operator's error code, when Netgsm gives one (0 when not).
	ErrorCode int
	// DeliveredAt is when the handset received it, as Netgsm reports it (zero when it gives no date it
	// can be read as).
	DeliveredAt time.Time
}

// Outcome is what a report status means for the message: its delivery status in the vocabulary of the
// other providers' receipts ("delivered", "undelivered", "failed"; "" while Netgsm does not know yet),
// why it was not delivered, and whether Netgsm asked İYS and found no consent (ReportIYSRejected: the same
// refusal as a send's code 50, only found after the message was accepted). A status Netgsm did not give,
// or one this package does not know, is not taken as final: the message is asked about again.
func (j ReportJob) Outcome() (delivery, reason string, noConsent bool) {
	switch j.Status {
	case ReportPending, reportStatusUnseen:
		return "", "", false
	case ReportDelivered:
		return "delivered", "", false
	case ReportIYSRejected:
		return "undelivered", "netgsm 16: İYS holds no consent for the number", true
	}
	what, ok := map[int]string{
		ReportExpired:     "expired before delivery",
		ReportInvalid:     "invalid or restricted number",
		ReportNotSent:     "not passed to the operator",
		ReportRejected:    "refused by the operator",
		ReportDeliveryErr: "the operator could not deliver it",
		ReportDuplicate:   "a duplicate of a message just sent: not sent",
		ReportNoCredit:    "the account's credit ran out: not sent",
		ReportBlacklisted: "the number is on the account's blacklist",
		ReportIYSError:    "İYS could not be asked: not sent",
	}[j.Status]
	if !ok {
		return "", "", false
	}
	reason = fmt.Sprintf("netgsm %d: %s", j.Status, what)
	if j.ErrorCode != 0 {
		reason += fmt.Sprintf(" (operator error %d)", j.ErrorCode)
	}
	switch j.Status {
	case ReportNotSent, ReportDuplicate, ReportNoCredit, ReportIYSError:
		return "failed", reason, false
	}
	return "undelivered", reason, false
}

type reportRequest struct {
	JobIDs     []string `json:"jobids,omitempty"`
	StartDate  string   `json:"startdate"`
	StopDate   string   `json:"stopdate"`
	PageNumber int      `json:"pagenumber"`
	PageSize   int      `json:"pagesize"`
}

type reportAnswer struct {
	Code        string `json:"code"`
	Description string `json:"description"`
	Jobs        []struct {
		JobID     json.RawMessage `json:"jobid"`
		Number    string          `json:"number"`
		Status    json.RawMessage `json:"status"`
		ErrorCode json.RawMessage `json:"errorCode"`
		Delivered string          `json:"deliveredDate"`
	} `json:"jobs"`
}

// Report asks Netgsm what became of the messages with the given job IDs (at most ReportPageSize), sent
// between from and to. Jobs Netgsm does not name in its answer are not known to it yet; no jobs at all
// (its code 60) is an empty answer, not an error.
//
// Every error is a *providers.Error: Throttled (with a RetryAfter of a minute) for code 80, Netgsm's
// limit of ReportsPerMinute queries; Account for code 30; Transient for 5xx answers, codes 100 and 110 and
// a transport error; Permanent otherwise.
func (p *Provider) Report(ctx context.Context, jobIDs []string, from, to time.Time) ([]ReportJob, error) {
	if len(jobIDs) == 0 {
		return nil, nil
	}
	if len(jobIDs) > ReportPageSize {
		return nil, &providers.Error{Provider: "netgsm", Class: providers.Permanent,
			Message: fmt.Sprintf("a report asks for at most %d jobs, not %d", ReportPageSize, len(jobIDs))}
	}
	body, err := json.Marshal(reportRequest{JobIDs: jobIDs, PageSize: ReportPageSize,
		StartDate: from.In(turkey).Format(reportDateLayout), StopDate: to.In(turkey).Format(reportDateLayout)})
	if err != nil {
		return nil, &providers.Error{Provider: "netgsm", Class: providers.Permanent, Message: "cannot encode the report query", Err: err}
	}
	reqCtx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	resp, data, readErr, err := p.post(reqCtx, p.reportURL, body)
	if errors.Is(err, errBuild) {
		return nil, &providers.Error{Provider: "netgsm", Class: providers.Permanent, Message: "cannot build the report query: check NETGSM_BASE_URL"}
	}
	if err != nil {
		return nil, &providers.Error{Provider: "netgsm", Class: providers.Transient, Message: "report query not answered", Err: p.redactErr(err, "")}
	}
	var a reportAnswer
	decoded := readErr == nil && json.Unmarshal(data, &a) == nil && a.Code != ""
	e := &providers.Error{Provider: "netgsm", Status: resp.StatusCode, Message: "report query refused"}
	if decoded {
		e.Code, _ = strconv.Atoi(a.Code)
		e.Message = "report query refused: " + p.quote(a.Description, "")
	}
	switch {
	case decoded && (a.Code == "00" || a.Code == "0") && resp.StatusCode/100 == 2:
		out := make([]ReportJob, 0, len(a.Jobs))
		for _, j := range a.Jobs {
			id := unquote(j.JobID)
			if id == "" {
				continue
			}
			st, err := strconv.Atoi(unquote(j.Status))
			if err != nil || st < 0 {
				st = reportStatusUnseen
			}
			code, _ := strconv.Atoi(unquote(j.ErrorCode))
			no := j.Number
			if n, ok := strings.CutPrefix(no, "90"); ok && len(n) == 10 {
				no = n
			}
			if len(no) == 10 {
				no = "+90" + no
			}
			out = append(out, ReportJob{JobID: id, Number: no, Status: st, ErrorCode: code, DeliveredAt: reportDate(j.Delivered)})
		}
		return out, nil
	case decoded && a.Code == "60":
		return nil, nil
	case decoded && a.Code == "80":
		e.Class, e.Throttled, e.RetryAfter = providers.Transient, true, time.Minute
		e.Message = wire.Join(e.Message, fmt.Sprintf("Netgsm answers %d report queries a minute to an account: another process asking with the same credentials, or a --netgsm-report-interval under 6s", ReportsPerMinute))
	case decoded && a.Code == "30":
		e.Class, e.Account = providers.Permanent, true
		e.Message = wire.Join(e.Message, "check NETGSM_USERCODE, NETGSM_PASSWORD and the API IP allow-list")
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests || (decoded && (a.Code == "100" || a.Code == "110")):
		e.Class = providers.Transient
		e.RetryAfter = wire.ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
	default:
		e.Class = providers.Permanent
	}
	if readErr != nil {
		e.Err = p.redactErr(readErr, "")
	}
	return nil, e
}

// reportDate reads a date of a report: Netgsm's dd.MM.yyyy HH:mm:ss in Turkey's time, or an ISO 8601 one
// (with its zone, or else Turkey's). Zero when it is none of them.
func reportDate(s string) time.Time {
	s = strings.TrimSpace(s)
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t
	}
	for _, layout := range []string{reportDateLayout, "2006-01-02 15:04:05", "2006-01-02T15:04:05", "02.01.2006 15:04"} {
		if t, err := time.ParseInLocation(layout, s, turkey); err == nil {
			return t
		}
	}
	return time.Time{}
}

// unquote reads a JSON number or string as its text ("" for null or nothing).
func unquote(raw json.RawMessage) string {
	s := strings.TrimSpace(string(raw))
	if s == "null" {
		return ""
	}
	if u, err := strconv.Unquote(s); err == nil {
		return u
	}
	return s
}
