package campaign

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Spec is a launch request, as the marketer gave it.
type Spec struct {
	Name        string
	Channel     Channel
	AudienceSQL string
	Message     string
	Subject     string
	// HTML is the HTML e-mail template (html/template); TemplateID a SendGrid dynamic template ("d-...").
	HTML       string
	TemplateID string
	// CodePool is the pool to reserve one code per recipient from; "" plans without codes.
	CodePool string
	// Rate caps this campaign in messages per second over all workers; 0 means only the provider's cap.
	Rate float64
	// ProviderRate is the provider's cap in messages per second (0 = none), or in SMS segments a second
	// when ProviderCountsSegments (Twilio's is); used for the ETA only.
	ProviderRate           float64
	ProviderCountsSegments bool
	// BatchSize is recipients per queued task; 0 means the channel's (ChannelSpec.BatchSize), or for a
	// small campaign of a one-message channel less, so that its recipients spread over SpreadBatches.
	BatchSize int
	// DryRun computes the full report inside a transaction that is rolled back: same numbers, nothing written.
	DryRun bool
	// CountSegments renders every planned message to report the total SMS segments (always on a dry run;
	// about 4 µs a message).
	CountSegments bool
	// StatementTimeout bounds the audience query; 0 means 5 minutes.
	StatementTimeout time.Duration
	// StartAt schedules the campaign (zero: start at once).
	StartAt time.Time
	// Window keeps sends inside daily hours (zero: any time).
	Window Window
	// FrequencyCap excludes, at plan time, and skips, at send time, anyone who got a message on this
	// channel within this long, across campaigns (0: no cap; the CLI's default is DefaultFrequencyCap).
	FrequencyCap time.Duration
	// RecipientType is the İYS recipient type whose consents count: BIREYSEL (default) or TACIR.
	RecipientType string
	// BrandCode is the İYS brand whose consents count ("" for consents stored without one).
	BrandCode string
	// Transactional marks a message that is not commercial (an order update, a security notice): İYS
	// consent is not required (law 6563 exempts it), and it carries no promo code.
	Transactional bool
	// MaxConsentAge refuses a commercial launch on an İYS channel when the consents were last brought up
	// to date (an İYS pull, a re-verification, a CSV import) longer ago than this; 0 skips the check.
	MaxConsentAge time.Duration
	// AllowStaleConsent launches anyway, and is recorded on the campaign.
	AllowStaleConsent bool
	// AllowPrivilegedAudience runs the audience query as the audience connection's own role even when that
	// role may do more than read the audience (a superuser, or a role that can read the engine's tables);
	// recorded on the campaign. Without it the query runs as campaignctl_audience (see
	// migrations/0008_audience_role.sql), or such a launch is refused.
	AllowPrivilegedAudience bool
	// MaxSegments is the most SMS segments one message may take; 0 means DefaultMaxSegments. A launch any of
	// whose messages is longer is refused (a message changed since, by a template's data, fails at send
	// time).
	MaxSegments int
	// Rules is the content lint for commercial SMS (nil: no lint).
	Rules *ContentRules
	// UnsubscribeSample stands for the recipients' unsubscribe links in the sample message (the link's
	// base with a placeholder token; UnsubscribeSample when empty): each real link is signed by the worker.
	UnsubscribeSample string
}

// ContentRules is what a commercial SMS must carry under law 6563: the sender's identity and how to refuse
// further messages. Each is a regular expression the rendered text must match.
type ContentRules struct {
	// Sender matches the sender's identity (trade name, MERSİS number), e.g. from SENDER_IDENTITY.
	Sender *regexp.Regexp
	// SenderHint is what to tell the marketer to add when Sender does not match.
	SenderHint string
	// OptOut matches the refusal instruction, e.g. "RET yazıp 4609'a gönderin".
	OptOut *regexp.Regexp
}

// Report is what a launch found and did. It is printed for the marketer and, with --json, for programs.
type Report struct {
	ID          int64            `json:"id,omitempty"`
	Name        string           `json:"name"`
	Channel     Channel          `json:"channel"`
	State       State            `json:"state,omitempty"`
	DryRun      bool             `json:"dry_run"`
	Audience    int64            `json:"audience"`
	Eligible    int64            `json:"eligible"`
	Excluded    map[string]int64 `json:"excluded"`
	CodePool    string           `json:"code_pool,omitempty"`
	CodesNeeded int64            `json:"codes_needed"`
	CodesFree   int64            `json:"codes_free"`
	// CodesCounted says the pool's free codes were counted (CodesFree holds them): a plan that stopped
	// before (Postgres gone, a lock waited out) knows what it needed only.
	CodesCounted       bool   `json:"-"`
	Batches            int    `json:"batches"`
	SampleMessage      string `json:"sample_message,omitempty"`
	Encoding           string `json:"encoding,omitempty"`
	SegmentsPerMessage int    `json:"segments_per_message,omitempty"`
	// SampleSegments is the mean segments of the first SampleMessages SMS (by batch), each rendered for
	// its recipient: the rate's estimate when not every message is counted (TotalSegments).
	SampleSegments float64 `json:"-"`
	// SampleSubject is the first message's subject (e-mail, push title); SampleHTML its HTML part, kept out
	// of the JSON report for its size (`launch --dry-run --preview-dir` writes it to a file).
	SampleSubject string `json:"sample_subject,omitempty"`
	SampleHTML    string `json:"-"`
	// TotalSegments is the sum of every planned SMS's segments, each message rendered for its recipient:
	// what the provider will bill and what its throughput is counted in.
	TotalSegments int64 `json:"total_segments,omitempty"`
	// UCS2Messages is how many planned SMS need UCS-2 (70/67 characters per segment).
	UCS2Messages int64   `json:"ucs2_messages,omitempty"`
	Rate         float64 `json:"rate"`
	ETASeconds   float64 `json:"eta_seconds"`
	Enqueued     int     `json:"enqueued"`
	// StartAt is when a scheduled campaign begins; Window its daily send window, in WindowZone.
	StartAt    *time.Time `json:"start_at,omitempty"`
	Window     string     `json:"window,omitempty"`
	WindowZone string     `json:"window_zone,omitempty"`
	// RecipientType is the İYS recipient type checked (BIREYSEL or TACIR); Transactional says İYS was not
	// checked at all.
	RecipientType string `json:"recipient_type"`
	Transactional bool   `json:"transactional,omitempty"`
	// ConsentSyncedAt is when the consents were last brought up to date; StaleConsentAllowed is set when
	// that was too long ago and the launch went ahead with --allow-stale-consent.
	ConsentSyncedAt     *time.Time `json:"consent_synced_at,omitempty"`
	StaleConsentAllowed bool       `json:"stale_consent_allowed,omitempty"`
	// PrivilegedAudience is set when the audience ran with --allow-privileged-audience as a role that may
	// do more than read it.
	PrivilegedAudience bool `json:"privileged_audience,omitempty"`
	// Warnings are what the marketer should know before sending (a long SMS, an empty audience).
	Warnings []string `json:"warnings,omitempty"`
}

// DefaultMaxSegments is the most SMS segments a message may take unless the launch says otherwise: ten is
// 1,530 GSM-7 characters or 670 in UCS-2 (any Turkish ç ğ ı İ ş), ten times the price of one.
const DefaultMaxSegments = 10

// WarnSegments is the segment count above which a dry run warns.
const WarnSegments = 3

// MaxSMSChars is the longest body an SMS provider takes (Twilio refuses more with error 21617), in UTF-16
// code units.
const MaxSMSChars = 1600

var nameRE = regexp.MustCompile(`^[\p{L}\p{N}][\p{L}\p{N} ._:/-]{0,127}$`)

// Validate checks the request without touching any database.
// MinRate is the lowest rate a campaign or a provider's cap may have, in messages (or SMS segments) a
// second: one an hour. Below it a campaign of any size would take years, its consents long stale.
const MinRate = 1.0 / 3600

func (s *Spec) Validate() error {
	if !nameRE.MatchString(s.Name) {
		return fmt.Errorf("%w: --name %q must be 1-128 letters, digits, spaces or ._:/- and start with a letter or digit", ErrInvalid, s.Name)
	}
	if _, err := ParseChannel(string(s.Channel)); err != nil {
		return err
	}
	ch := s.Channel.Spec()
	if strings.TrimSpace(s.AudienceSQL) == "" {
		return fmt.Errorf("%w: the audience query is empty; put one SELECT returning user_id and %s in the --audience file", ErrInvalid, s.Channel.AddressColumn())
	}
	if s.Rate < 0 || math.IsNaN(s.Rate) || math.IsInf(s.Rate, 0) {
		return fmt.Errorf("%w: --rate %v must be a positive number of messages per second (or 0 for the provider's cap)", ErrInvalid, s.Rate)
	}
	if s.Rate > 0 && s.Rate < MinRate {
		return fmt.Errorf("%w: --rate %v is below one message an hour: give at least %.6f (one an hour), or 0 for the provider's cap", ErrInvalid, s.Rate, MinRate)
	}
	if s.FrequencyCap < 0 {
		return fmt.Errorf("%w: --frequency-cap %v must be a duration like 24h, or 0 for none", ErrInvalid, s.FrequencyCap)
	}
	if s.FrequencyCap%time.Second != 0 {
		// Kept in whole seconds: 900ms would be no cap at send time, 1500ms one second.
		return fmt.Errorf("%w: --frequency-cap %v: give whole seconds (the cap is kept in seconds), e.g. %v, or 0 for none",
			ErrInvalid, s.FrequencyCap, max(time.Second, s.FrequencyCap.Round(time.Second)))
	}
	if s.BatchSize < 0 || s.BatchSize > MaxBatchSize {
		return fmt.Errorf("%w: batch size %d must be between 1 and %d", ErrInvalid, s.BatchSize, MaxBatchSize)
	}
	if s.HTML != "" && !ch.HTML {
		return fmt.Errorf("%w: --html is for %s; the %s message is the --message text", ErrInvalid, titlesWhere(func(c ChannelSpec) bool { return c.HTML }), s.Channel.Spec().Title)
	}
	if s.TemplateID != "" && !ch.TemplateID {
		return fmt.Errorf("%w: --template-id is for %s; the %s message is the --message text", ErrInvalid, titlesWhere(func(c ChannelSpec) bool { return c.TemplateID }), s.Channel.Spec().Title)
	}
	if ch.SubjectRequired && s.Subject == "" && s.TemplateID == "" {
		return fmt.Errorf("%w: a message by %s needs a subject; pass --subject 'Size özel kod' (or a --template-id whose template has one)", ErrInvalid, ch.Title)
	}
	if strings.ContainsAny(s.Subject, "\r\n") {
		return fmt.Errorf("%w: --subject holds a line break; a subject is one line (a header), write it on one", ErrInvalid)
	}
	if s.TemplateID != "" && !strings.HasPrefix(s.TemplateID, "d-") {
		return fmt.Errorf("%w: --template-id %q is not a SendGrid dynamic template ID; they start with d-", ErrInvalid, s.TemplateID)
	}
	tmpl, err := ParseContent(s.Content())
	if err != nil {
		return err
	}
	if s.CodePool != "" && s.TemplateID == "" && !slices.Contains(tmpl.Fields(), "code") {
		return fmt.Errorf("%w: --code-pool reserves a code for every recipient, but the message never shows {{.code}}; add {{.code}} to --message (or --subject, --html), or drop --code-pool", ErrInvalid)
	}
	if s.CodePool != "" && s.TemplateID == "" && !tmpl.AlwaysPrints("code") {
		return fmt.Errorf("%w: --code-pool reserves a code for every recipient, but the message shows {{.code}} only to some of them (inside an {{if}} without an {{else}} that shows it too, a {{range}} or a {{with}}): the others would hold a code they never see. Show {{.code}} in every branch, or launch the two groups as two campaigns, one without --code-pool", ErrInvalid)
	}
	switch s.RecipientType {
	case "", "BIREYSEL", "TACIR":
	default:
		return fmt.Errorf("%w: --recipient-type %q: use BIREYSEL (individuals) or TACIR (merchants)", ErrInvalid, s.RecipientType)
	}
	if s.Transactional && s.CodePool != "" {
		return fmt.Errorf("%w: a transactional message carries no promo code (a code makes it commercial, which needs İYS consent); drop --code-pool or --transactional", ErrInvalid)
	}
	if s.MaxSegments < 0 || s.MaxSegments > 24 {
		return fmt.Errorf("%w: --max-segments %d must be between 1 and 24 (24 UCS-2 segments is the %d characters providers take)", ErrInvalid, s.MaxSegments, MaxSMSChars)
	}
	if s.MaxConsentAge < 0 {
		return fmt.Errorf("%w: --max-consent-age %v must be a duration like 24h, or 0 to skip the check", ErrInvalid, s.MaxConsentAge)
	}
	return s.lint(tmpl)
}

// lint checks a commercial SMS for what law 6563 wants in it. A field can carry neither the identity nor
// the instruction, so the message's fixed text must: each must be whole in one of the texts every
// message carries as they are (Template.FixedTexts), not inside {{if}}, {{range}}, {{with}} or a comment,
// which reach some recipients or none.
func (s Spec) lint(tmpl *Template) error {
	if s.Rules == nil || s.Transactional || !s.Channel.Spec().Linted {
		return nil
	}
	fixed := tmpl.FixedTexts()
	carries := func(re *regexp.Regexp) bool {
		return slices.ContainsFunc(fixed, re.MatchString)
	}
	var missing []string
	if s.Rules.Sender != nil && !carries(s.Rules.Sender) {
		missing = append(missing, "the sender's identity ("+s.Rules.SenderHint+")")
	}
	if s.Rules.OptOut != nil && !carries(s.Rules.OptOut) {
		missing = append(missing, "how to refuse further messages (e.g. \"RET yazıp 4609'a gönderin\")")
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: every commercial SMS must carry %s (law 6563); add it to --message as text outside {{if}}, {{range}}, {{with}} and comments, or launch with --transactional if the message is not commercial",
			ErrInvalid, strings.Join(missing, " and "))
	}
	return nil
}

// recipientType is the İYS recipient type the campaign checks.
func (s Spec) recipientType() string { return iysRecipientType(s.RecipientType) }

// OneClickUnsubscribe says the campaign's messages carry a one-click unsubscribe link per recipient:
// commercial messages of a channel that has them (e-mail).
func (s Spec) OneClickUnsubscribe() bool { return s.Channel.Spec().Unsubscribe && !s.Transactional }

// Content returns the spec's message parts.
func (s Spec) Content() Content {
	return Content{Text: s.Message, Subject: s.Subject, HTML: s.HTML, TemplateID: s.TemplateID}
}

// EffectiveRate is the rate the campaign will actually send at: the lower of its own cap and the
// provider's, 0 when neither caps it.
func EffectiveRate(campaignRate, providerRate float64) float64 {
	switch {
	case campaignRate > 0 && providerRate > 0:
		return math.Min(campaignRate, providerRate)
	case campaignRate > 0:
		return campaignRate
	}
	return providerRate
}

// BatchCount is the number of batches n recipients make at size per batch.
func BatchCount(n int64, size int) int {
	if n <= 0 {
		return 0
	}
	return int((n + int64(size) - 1) / int64(size))
}

// Planner plans campaigns: Engine is the campaignctl database, Audience the one the audience query runs on
// (often the same).
type Planner struct {
	Engine   *pgxpool.Pool
	Audience *pgxpool.Pool
	// Log receives one debug line per planning step with its duration; nil discards them.
	Log *slog.Logger
}

// step logs how long a planning step took.
func (p *Planner) step(name string, start time.Time) {
	if p.Log != nil {
		p.Log.Debug("plan step", "step", name, "ms", time.Since(start).Milliseconds())
	}
}

// Plan validates spec, plans the campaign and commits it in state running, or, on a dry run, computes the
// same report and rolls back. On error nothing is written; the returned report holds whatever was counted
// before the error (so a dry run can still show, say, how many codes are missing).
func (p *Planner) Plan(ctx context.Context, spec Spec) (Report, error) {
	if spec.StatementTimeout == 0 {
		spec.StatementTimeout = 5 * time.Minute
	}
	if spec.MaxSegments == 0 {
		spec.MaxSegments = DefaultMaxSegments
	}
	rep := Report{Name: spec.Name, Channel: spec.Channel, DryRun: spec.DryRun, CodePool: spec.CodePool, Excluded: map[string]int64{},
		RecipientType: spec.recipientType(), Transactional: spec.Transactional}
	if err := spec.Validate(); err != nil {
		return rep, err
	}
	tmpl, _ := ParseContent(spec.Content())
	err := p.plan(ctx, spec, tmpl, &rep)
	// Counted also for a plan refused after it counted the eligible (a code pool too short): the report
	// printed with the refusal says what the launch would have been.
	rep.Batches = BatchCount(rep.Eligible, spec.batchSize(rep.Eligible))
	rep.Rate, rep.ETASeconds = spec.eta(&rep)
	return rep, err
}

// batchSize is how many recipients a queued task carries in a campaign of eligible recipients: the
// launch's BatchSize when it gives one, else the channel's, and for a one-message channel (ChannelSpec.Spread)
// no more than spreads the campaign over SpreadBatches batches of at least MinSpreadBatch.
func (s *Spec) batchSize(eligible int64) int {
	if s.BatchSize > 0 {
		return s.BatchSize
	}
	ch := s.Channel.Spec()
	size := DefaultBatchSize
	if ch.BatchSize > 0 {
		size = ch.BatchSize
	}
	if ch.Spread && eligible > 0 {
		size = min(size, max(MinSpreadBatch, int((eligible+SpreadBatches-1)/SpreadBatches)))
	}
	return size
}

// eta is the message rate a campaign goes at and how long it takes: the slower of its own --rate (in
// messages) and the provider's cap, which for a provider counting segments takes every segment (the
// total when counted, else the mean of a sample of them: a launch and its dry run give about the same).
func (spec *Spec) eta(rep *Report) (rate, seconds float64) {
	providerMsgs := spec.ProviderRate
	if spec.ProviderRate > 0 && spec.ProviderCountsSegments && rep.Eligible > 0 {
		perMessage := float64(max(1, rep.SegmentsPerMessage))
		switch {
		case rep.TotalSegments > 0:
			perMessage = float64(rep.TotalSegments) / float64(rep.Eligible)
		case rep.SampleSegments >= 1:
			// The first message's count alone made a launch say 50 msg/s where its dry run, counting
			// every message, said 73.
			perMessage = rep.SampleSegments
		}
		providerMsgs = spec.ProviderRate / perMessage
	}
	rate = EffectiveRate(spec.Rate, providerMsgs)
	if rate > 0 && rep.Eligible > 0 {
		seconds = math.Ceil(float64(rep.Eligible) / rate)
	}
	return rate, seconds
}
