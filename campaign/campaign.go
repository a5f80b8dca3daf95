package campaign

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/campaignctl/campaignctl/codes"
)

// State is where a campaign is in its lifecycle.
type State string

// Campaign states.
const (
	StatePlanning  State = "planning"
	StateScheduled State = "scheduled"
	StateRunning   State = "running"
	StatePaused    State = "paused"
	StateCompleted State = "completed"
	StateCancelled State = "cancelled"
	StateFailed    State = "failed"
)

// Over reports whether a campaign in state s has ended (completed, cancelled or failed): nothing more is
// sent for it.
func (s State) Over() bool {
	return s == StateCompleted || s == StateCancelled || s == StateFailed
}

// Recipient statuses.
const (
	StatusPending = "pending"
	StatusSent    = "sent"
	StatusFailed  = "failed"
	StatusSkipped = "skipped"
	StatusUnknown = "unknown"
)

// Exclusion and skip reasons, as stored and reported.
const (
	ReasonMissingUser      = "missing_user_id"
	ReasonDuplicateUser    = "duplicate_user"
	ReasonInvalidAddress   = "invalid_address"
	ReasonDuplicateAddress = "duplicate_address"
	ReasonMissingValue     = "missing_value"
	// ReasonInvalidValue: a value the message puts in a header (the e-mail subject) holds a line break,
	// which would let it write headers of its own.
	ReasonInvalidValue = "invalid_value"
	ReasonNoConsent    = "no_consent"
	ReasonFrequencyCap = "frequency_cap"
	ReasonConsentRET   = "consent_ret"
	ReasonRevoked      = "revoked"
	ReasonCancelled    = "cancelled"
	// ReasonNoOptIn: a push or webhook recipient whose audience row does not say <channel>_opt_in = true.
	ReasonNoOptIn = "no_opt_in"
)

// TemplateFailure starts the reason of a recipient failed because its message could not be rendered for
// it (a value changed since the launch): no provider was asked.
const TemplateFailure = "template: "

// The statuses, states and reasons as SQL literals, for the statements that test or set them. They are
// written into the statements' text rather than passed as parameters: the planner then knows the value
// (and any partial index on one, like send_log_message's), which a parameter's generic plan hides from it.
// No index of campaign_recipients names status (migration 0012): an outcome is written in place.
const (
	sqlPending = "'" + StatusPending + "'"
	sqlSent    = "'" + StatusSent + "'"
	sqlFailed  = "'" + StatusFailed + "'"
	sqlSkipped = "'" + StatusSkipped + "'"
	sqlUnknown = "'" + StatusUnknown + "'"

	sqlStatePlanning  = "'" + string(StatePlanning) + "'"
	sqlStateScheduled = "'" + string(StateScheduled) + "'"
	sqlStateRunning   = "'" + string(StateRunning) + "'"
	sqlStateCompleted = "'" + string(StateCompleted) + "'"
	sqlStateCancelled = "'" + string(StateCancelled) + "'"
	sqlStateFailed    = "'" + string(StateFailed) + "'"

	sqlReasonCancelled   = "'" + ReasonCancelled + "'"
	sqlCancelledUnsure   = "'" + CancelledUnsure + "'"
	sqlResendNotSentTail = "'" + resendNotSentTail + "'"
)

// CancelledUnsure is the reason of a recipient once recorded unknown, pending again for `resume
// --resend-unknown`, when its campaign was cancelled before the resend: it stays unknown, not skipped,
// since its first message may have gone out (with its code, which it keeps).
const CancelledUnsure = "cancelled before it was sent again; its first message may have gone out"

// ResendNotSent is the reason of a recipient once recorded unknown, pending again for `resume
// --resend-unknown`, whose resend did not go for why (skipped at send time: the frequency cap, a refusal
// since; or failed, with the provider's reason): it stays unknown, since its first message may have gone
// out (with its code, which it keeps).
func ResendNotSent(why string) string { return "not sent again (" + why + ")" + resendNotSentTail }

const resendNotSentTail = "; its first message may have gone out"

// SQLSTATE codes the store tells apart (PostgreSQL's errcodes, Appendix A of its manual).
const (
	pgUniqueViolation        = "23505" // a second campaign of the same name
	pgInsufficientPrivilege  = "42501" // the audience role reads what it was not granted
	pgReadOnlySQLTransaction = "25006" // the audience query tried to write
	pgQueryCanceled          = "57014" // the audience query outran its statement timeout
	pgSyntaxError            = "42601" // also: more than one statement in the audience file
)

// Content returns the campaign's message parts.
func (c *Campaign) Content() Content {
	return Content{Text: c.Message, Subject: c.Subject, HTML: c.HTML, TemplateID: c.TemplateID}
}

// Campaign is one campaign row.
type Campaign struct {
	ID          int64
	Name        string
	Channel     Channel
	State       State
	Message     string
	Subject     string
	HTML        string
	TemplateID  string
	CodePool    string
	Rate        float64
	AudienceSQL string
	Audience    int64
	Eligible    int64
	Excluded    map[string]int64
	BatchSize   int
	Batches     int
	CreatedAt   time.Time
	StartedAt   *time.Time
	FinishedAt  *time.Time
	// StateSince is when the campaign entered its state through a pause, resume or cancel (nil: another
	// way, or before schema version 15).
	StateSince *time.Time
	// StartAt is when sending may begin (nil: at once).
	StartAt *time.Time
	// Window is the daily send window (zero: any time).
	Window Window
	// FrequencyCap is how long one address gets no second message on this channel (0: no cap).
	FrequencyCap time.Duration
	// MarksJudgedFor is the longest FrequencyCap of the campaigns that may still send (planning, scheduled,
	// running or paused) when the campaign was read: the frequency marks its sends leave must last that
	// long, for a campaign scheduled days ahead with a long cap to find them when it starts. Not stored.
	MarksJudgedFor time.Duration
	// RecipientType is the İYS recipient type checked (BIREYSEL or TACIR), BrandCode the İYS brand.
	RecipientType string
	BrandCode     string
	// Transactional campaigns are not commercial: İYS is not checked.
	Transactional bool
	// AllowStaleConsent records that the launch went ahead with consents older than the allowed age.
	AllowStaleConsent bool
	// PrivilegedAudience records --allow-privileged-audience: the audience query, and its re-reads of the
	// opt-ins at send time (OptIns), run as the audience connection's own role.
	PrivilegedAudience bool
	// AudienceDatabase is the name of the database the audience query ran on at launch ("" before schema
	// version 25): the opt-ins are read again there only.
	AudienceDatabase string
	// MaxConsentAge is the --max-consent-age a commercial campaign on an İYS channel was launched with
	// (0: none, or stale consents allowed): a batch does not send on consents older than that
	// (ConsentStale). ConsentSyncedAt is when they were last brought up to date, as Get read it (nil: never,
	// or no age to keep), and consentAge how long ago that was by Postgres's clock.
	MaxConsentAge   time.Duration
	ConsentSyncedAt *time.Time
	consentAge      time.Duration
	// MaxSegments is the most SMS segments one message may take (launch --max-segments).
	MaxSegments int
}

// Counts is how many planned recipients are in each status.
type Counts struct {
	Planned int64 `json:"planned"`
	Pending int64 `json:"pending"`
	Sent    int64 `json:"sent"`
	Failed  int64 `json:"failed"`
	Skipped int64 `json:"skipped"`
	Unknown int64 `json:"unknown"`
	// Segments is the SMS segments of the sent messages (0 for other channels): not shown, kept for the
	// progress counters that resume rebuilds.
	Segments int64 `json:"-"`
}

// Errors callers branch on.
var (
	// ErrNotFound: no campaign with that ID.
	ErrNotFound = errors.New("campaign not found")
	// ErrNameTaken: a campaign with that name exists already.
	ErrNameTaken = errors.New("campaign name already used")
	// ErrInvalid: the launch request is wrong (bad flag, template, audience query); nothing was written.
	ErrInvalid = errors.New("invalid campaign")
	// ErrPoolShort: the code pool has fewer free codes than eligible recipients; nothing was written. It
	// is codes.ErrPoolExhausted, so callers of either package branch on one error.
	ErrPoolShort = codes.ErrPoolExhausted
)

// PoolShortError tells how many codes are missing.
type PoolShortError struct {
	Pool         string
	Needed, Free int64
}

func (e *PoolShortError) Error() string {
	return fmt.Sprintf("code pool %q has %d free codes but %d recipients are eligible: %d codes missing; add them with `campaignctl codes generate --pool %s --count %d`",
		e.Pool, e.Free, e.Needed, e.Needed-e.Free, e.Pool, e.Needed-e.Free)
}

func (e *PoolShortError) Is(target error) bool { return target == ErrPoolShort }

// Nonce tells c from another campaign that had the same ID: its creation time in microseconds, in base
// 36. Campaign IDs start again at 1 when the engine database is re-created, and another engine may share a
// provider account or a signing secret; the claims in Redis, the messages' receipts and the one-click
// links carry the nonce so that the old campaign 1's do not pass for the new one's.
func (c *Campaign) Nonce() string { return strconv.FormatInt(c.CreatedAt.UnixMicro(), 36) }

// NonceMicros is the creation time in microseconds a nonce (Nonce) stands for: 0 for "" (none given), and
// -1, what no campaign's creation time is, for a string that is no nonce.
func NonceMicros(nonce string) int64 {
	if nonce == "" {
		return 0
	}
	if us, err := strconv.ParseInt(nonce, 36, 64); err == nil && us > 0 {
		return us
	}
	return -1
}

// createdMicros is the SQL of the creation time in microseconds of the campaign row alias, as
// NonceMicros gives it.
func createdMicros(alias string) string {
	return "(extract(epoch FROM " + alias + ".created_at) * 1000000)::bigint"
}
