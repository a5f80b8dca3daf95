package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/unsubscribe"
	"github.com/campaignctl/campaignctl/worker"
)

type launchOptions struct {
	name, channel, audience, message, subject, codePool       string
	html, templateID, recipientType                           string
	transactional, allowStaleConsent, allowPrivilegedAudience bool
	maxConsentAge                                             time.Duration
	rate                                                      float64
	dryRun, yes, watch, json                                  bool
	timeout                                                   time.Duration
	segments                                                  bool
	at, window, tz                                            string
	frequencyCap                                              time.Duration
	maxSegments                                               int
	batchSize                                                 int
	testTo, testUser                                          string // see testsend.go
	previewDir                                                string // see preview.go
}

func (o *launchOptions) validate() error {
	var missing []string
	for flag, v := range map[string]string{"--name": o.name, "--channel": o.channel, "--audience": o.audience, "--message": o.message} {
		if flag == "--message" && o.templateID != "" {
			continue // the provider's template is the message
		}
		if strings.TrimSpace(v) == "" {
			missing = append(missing, flag)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return usagef("missing %s; e.g. SENDER_IDENTITY='Kampanya A.Ş.' campaignctl launch --name yaz-2026 --channel sms --audience audience.sql --message 'Kampanya A.Ş.: Merhaba {{.first_name}}, kodunuz {{.code}}. RET yazıp 3338e gönderin' --code-pool yaz", strings.Join(missing, ", "))
	}
	if _, err := campaign.ParseChannel(o.channel); err != nil {
		return err
	}
	if o.testUser != "" && o.testTo == "" {
		return usagef("--test-user picks the audience row of a test send: add --test-to ADDRESS")
	}
	if o.previewDir != "" && !o.dryRun {
		return usagef("--preview-dir writes the preview of a dry run: add --dry-run")
	}
	if o.previewDir != "" && o.channel != string(campaign.ChannelEmail) {
		return usagef("--preview-dir shows an e-mail; a %s campaign has no HTML to preview", o.channel)
	}
	if o.batchSize < 0 || o.batchSize > campaign.MaxBatchSize {
		return usagef("--batch-size %d: give the recipients a batch carries, from 1 to %d, or 0 for the channel's", o.batchSize, campaign.MaxBatchSize)
	}
	if o.channel == string(campaign.ChannelEmail) && o.batchSize > campaign.DefaultEmailBatchSize {
		return usagef("--batch-size %d: an e-mail batch is one SendGrid request, which takes at most %d recipients", o.batchSize, campaign.DefaultEmailBatchSize)
	}
	if o.maxSegments < 1 {
		return usagef("--max-segments %d: give the longest SMS to send, in segments, between 1 and 24 (default %d)", o.maxSegments, campaign.DefaultMaxSegments)
	}
	if o.timeout < time.Second || o.timeout > maxStatementTimeout {
		// Postgres takes milliseconds: less than one is no limit at all, and past about 24 days none either.
		return usagef("--statement-timeout %s: the audience query always runs with a limit; give a duration from 1s to %s, e.g. 5m", o.timeout, maxStatementTimeout)
	}
	if ch, _ := campaign.ParseChannel(o.channel); ch == campaign.ChannelSMS && o.subject != "" {
		return usagef("--subject is the subject of an e-mail or the title of a push notification; an SMS has none: drop it, or put the text in --message")
	}
	if o.html != "" && o.templateID != "" {
		return usagef("--html and --template-id both give the e-mail's body: keep one (--template-id sends SendGrid's dynamic template %s, --html your own HTML)", o.templateID)
	}
	return nil
}

// maxStatementTimeout bounds --statement-timeout: a day, well under what Postgres takes (about 24 days).
const maxStatementTimeout = 24 * time.Hour

func (a *app) newLaunchCmd() *cobra.Command {
	var o launchOptions
	cmd := &cobra.Command{
		Use:   "launch --name N --channel sms --audience FILE.sql --message TEMPLATE [--code-pool P]",
		Short: "Plan a campaign (consent, codes, batches) and queue it for the workers",
		Long: `Plan a campaign and queue it.

The audience file holds one SELECT returning user_id and the channel's address column (phone for sms, email
for email, push_token for push; webhook needs user_id only); every other column is a template variable.
For sms and email only recipients with İYS ONAY (MESAJ or EPOSTA, BIREYSEL unless --recipient-type TACIR)
are kept; push and webhook keep the rows whose <channel>_opt_in is true. One unique code per recipient is
reserved from --code-pool before anything is queued. --dry-run shows the same report and writes nothing.`,
		Example: `  # A commercial SMS carries the sender's identity (SENDER_IDENTITY) and how to refuse (law 6563).
  SENDER_IDENTITY='Kampanya A.Ş.' campaignctl launch --name yaz-2026 --channel sms --audience audience.sql \
    --message 'Kampanya A.Ş.: Merhaba {{.first_name}}, kodunuz {{.code}}. RET yazıp 3338e gönderin' \
    --code-pool yaz --dry-run
  campaignctl launch ... --yes --watch`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			if ch, _ := campaign.ParseChannel(o.channel); cmd.Flags().Changed("max-segments") && !ch.Spec().Segmented {
				// Accepted and ignored, it read as if a bound held (an e-mail launched with it).
				return usagef("--max-segments bounds an SMS in segments, and --channel %s sends none: drop it", ch)
			}
			if o.transactional {
				// The cap is about commercial messages: a transactional one is neither held back by it
				// nor counted for it.
				if cmd.Flags().Changed("frequency-cap") && o.frequencyCap > 0 {
					return usagef("--frequency-cap is about commercial messages: a transactional one (--transactional) is neither held back by it nor counted for it; drop --frequency-cap or --transactional")
				}
				o.frequencyCap = 0
			}
			return a.launch(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.name, "name", "", "unique campaign name")
	f.StringVar(&o.channel, "channel", "sms", campaign.ChannelChoices())
	f.StringVar(&o.audience, "audience", "", "file with the audience SELECT")
	f.StringVar(&o.message, "message", "", "message template, e.g. 'Merhaba {{.first_name}}, kodunuz {{.code}}'")
	f.StringVar(&o.subject, "subject", "", "e-mail subject or push title (a template too)")
	f.StringVar(&o.html, "html", "", "file with the HTML part of an e-mail (html/template; --message is then the plain-text part)")
	f.StringVar(&o.templateID, "template-id", "", "e-mail: a SendGrid dynamic template (d-...) that gets the audience columns and code as its data")
	poolVar(f, &o.codePool, "code-pool", "", "pool to reserve one code per recipient from")
	f.Float64Var(&o.rate, "rate", 0, "cap for this campaign in messages per second over all workers (0 = provider cap only)")
	f.BoolVar(&o.dryRun, "dry-run", false, "report what would happen; write and send nothing")
	f.BoolVar(&o.yes, "yes", false, "do not ask for confirmation")
	f.BoolVar(&o.watch, "watch", false, "show live progress until the campaign ends")
	f.BoolVar(&o.json, "json", false, "print the launch report as JSON")
	f.DurationVar(&o.timeout, "statement-timeout", 5*time.Minute, "limit for the audience query (1s to 24h)")
	f.StringVar(&o.at, "at", "", `start sending at this time: "2026-12-01 10:00" (in --tz) or RFC 3339`)
	f.StringVar(&o.window, "window", "", "send only between these hours every day, e.g. 09:00-20:00 (in --tz); batches wait for the next window")
	f.StringVar(&o.tz, "tz", campaign.DefaultZone, "time zone of --at and --window")
	daysVar(f, &o.frequencyCap, "frequency-cap", campaign.DefaultFrequencyCap, "skip anyone who got a commercial message on this channel within this long, across campaigns: 1d, 7d, 36h (0 = no cap; transactional messages neither count nor are held back)")
	f.StringVar(&o.recipientType, "recipient-type", "BIREYSEL", "İYS recipient type whose consents count: BIREYSEL (individuals) or TACIR (merchants)")
	f.BoolVar(&o.transactional, "transactional", false, "not a commercial message (order, security notice): İYS consent is not checked, no code pool allowed")
	daysVar(f, &o.maxConsentAge, "max-consent-age", 24*time.Hour, "refuse when the İYS consents were last synced (or imported) longer ago than this (1d, 12h); 0 = no check")
	f.BoolVar(&o.allowStaleConsent, "allow-stale-consent", false, "launch even when the consents are older than --max-consent-age (recorded on the campaign)")
	f.BoolVar(&o.allowPrivilegedAudience, "allow-privileged-audience", false, "run the audience query as the audience connection's own role even if it may do more than read the audience (a superuser; recorded on the campaign)")
	f.BoolVar(&o.segments, "count-segments", false, "render every message to report the total SMS segments (a dry run always does)")
	f.IntVar(&o.maxSegments, "max-segments", campaign.DefaultMaxSegments, "refuse an SMS longer than this many segments (a dry run warns above 3)")
	f.IntVar(&o.batchSize, "batch-size", 0, fmt.Sprintf("recipients a queued batch carries, 1 to %d (0 = the channel's: %d for SMS, push and webhook, fewer so that a smaller campaign spreads over %d batches; %d for e-mail, one SendGrid request)",
		campaign.MaxBatchSize, campaign.DefaultBatchSize, campaign.SpreadBatches, campaign.DefaultEmailBatchSize))
	f.StringVar(&o.testTo, "test-to", "", "send one test message to this address only (placeholder code "+testCode+"; no campaign created, no code reserved; without a terminal add --yes, as for a launch)")
	f.StringVar(&o.testUser, "test-user", "", "with --test-to: render for the audience row with this user_id (default: the first row)")
	f.StringVar(&o.previewDir, "preview-dir", "", "with --dry-run of an e-mail: write the first message's HTML and text to DIR/preview.html and DIR/preview.txt")
	return cmd
}

func (a *app) launch(ctx context.Context, o launchOptions) error {
	interactive := isTerminal(a.stderr) && isTerminal(a.stdin)
	if !o.dryRun && !o.yes && !interactive {
		// gh, kubectl and terraform do not act unattended without being told to: neither does a launch.
		return usagef("launch sends messages and there is no terminal to ask for confirmation: add --yes to launch unattended (or --dry-run to see the report first); nothing was written or sent")
	}
	sqlText, err := readBounded(o.audience, maxAudienceFile)
	if err != nil {
		return usagef("cannot read the audience file: %v; it must hold one SELECT", err)
	}
	// A byte order mark (editors on Windows write one) is no SQL: Postgres would report a syntax error at
	// the SELECT after it, which the message cannot show.
	sqlText = bytes.TrimPrefix(sqlText, []byte("\uFEFF"))
	if err := a.launchChecks(campaign.Channel(o.channel)); err != nil {
		return err
	}
	providerRate, providerSegments, err := a.channelRate(campaign.Channel(o.channel))
	if err != nil {
		return err
	}
	var html []byte
	if o.html != "" {
		if html, err = readBounded(o.html, maxHTMLFile); err != nil {
			return usagef("cannot read the --html file: %v", err)
		}
	}
	engine, err := a.openEngine(ctx)
	if err != nil {
		return err
	}
	defer engine.Close()
	audience := engine
	if u := a.audienceDBURL(); u != a.dbURL() {
		if audience, err = a.openDB(ctx, u, a.audienceDBName(), 0); err != nil {
			return err
		}
		defer audience.Close()
	}
	zone, err := time.LoadLocation(o.tz)
	if err != nil || o.tz == "" { // Go reads "" as UTC
		return usagef("--tz %q is not a known time zone; use an IANA name such as Europe/Istanbul or UTC", o.tz)
	}
	if zone == time.Local {
		// Go's "Local" is each process's own zone: every worker (and status) would read the window in
		// its own, and the quiet hours of one campaign would fall at different times on each machine.
		return usagef("--tz %s is each machine's own time zone: every worker would read the send window in its own; give an IANA name such as Europe/Istanbul or UTC; nothing was written or sent", o.tz)
	}
	window, err := campaign.ParseWindow(o.window, zone)
	if err != nil {
		return err
	}
	var startAt time.Time
	if o.at != "" {
		if startAt, err = campaign.ParseAt(o.at, zone, time.Now()); err != nil {
			return err
		}
	}
	brand, err := a.brandCode()
	if err != nil {
		return err
	}
	spec := campaign.Spec{
		Name: o.name, Channel: campaign.Channel(o.channel), AudienceSQL: string(sqlText), Message: o.message,
		Subject: o.subject, HTML: string(html), TemplateID: o.templateID, CodePool: o.codePool, Rate: o.rate, ProviderRate: providerRate, ProviderCountsSegments: providerSegments, StatementTimeout: o.timeout,
		CountSegments: o.segments, StartAt: startAt, Window: window, FrequencyCap: o.frequencyCap,
		RecipientType: o.recipientType, BrandCode: brand, Transactional: o.transactional, MaxConsentAge: o.maxConsentAge,
		AllowStaleConsent: o.allowStaleConsent, AllowPrivilegedAudience: o.allowPrivilegedAudience, MaxSegments: o.maxSegments, BatchSize: o.batchSize,
	}
	if spec.Rules, err = a.contentRules(campaign.Channel(o.channel), o.transactional); err != nil {
		return err
	}
	if spec.OneClickUnsubscribe() {
		// The workers sign each recipient's link; the launch only makes sure they can be made and served.
		signer, err := a.unsubscribeSigner()
		if err != nil {
			return err
		}
		if signer == nil {
			return errNoUnsubscribe()
		}
		spec.UnsubscribeSample = strings.TrimSuffix(a.getenv(publicURLEnv), "/") + unsubscribe.Path + "…"
	}
	planner := &campaign.Planner{Engine: engine, Audience: audience, Log: a.logger()}
	if o.testTo != "" {
		return a.testSend(ctx, o, spec, planner)
	}
	lo := worker.LaunchOptions{Planner: planner, Spec: spec}
	lo.Spec.DryRun = o.dryRun
	var svc *services
	if !o.dryRun {
		// Redis must be there before anything is written: a plan that cannot be queued is only half a launch.
		// The launch takes no claim: its connection creates no epoch, so a refused launch leaves Redis as it
		// was.
		rdb, err := a.openQueueRedis(ctx)
		if err != nil {
			return err
		}
		defer rdb.Close()
		svc = &services{engine: engine, redis: rdb, store: campaign.NewStore(engine)}
		lo.Redis = svc.redis
		if !o.yes && interactive {
			lo.Confirm = func(preview campaign.Report) bool {
				// The question's own report: on the terminal asked (stderr), so that stdout holds the
				// launch's result alone (the JSON of --json, say, redirected to a file).
				a.writeReport(a.stderr, preview, "About to launch (nothing written or sent yet)")
				return a.confirm(fmt.Sprintf("Send %d messages now?", preview.Eligible))
			}
		}
	}

	rep, err := worker.Launch(ctx, lo)
	var notQueued *worker.NotQueuedError
	switch {
	case errors.Is(err, worker.ErrLaunchDeclined):
		return usageError{err}
	case o.dryRun:
		if rep.Audience > 0 || err == nil {
			a.printReport(rep, o.json)
		}
		if err == nil {
			err = a.emailPreview(rep, o)
		}
		return err
	case rep.DryRun:
		// The dry run before the confirmation failed: what it counted goes with the error.
		a.writeReport(a.stderr, rep, "Not launched (nothing written, nothing sent)")
		return err
	case err == nil, errors.As(err, &notQueued):
		a.printReport(rep, o.json)
	case rep.ID == 0 && ctx.Err() == nil && rep.Audience > 0 && !o.json:
		// The plan failed and wrote nothing; what it counted, on stderr with the error (stdout is for
		// results).
		a.printRefused(rep)
	}
	if err != nil {
		return err
	}
	if o.watch && o.json {
		// stdout holds the launch report alone: the campaign's end goes to stderr with the progress.
		return a.watch(ctx, svc, rep.ID, func(v worker.CampaignStatus) error {
			a.printStatusTo(a.stderr, v, nil)
			return nil
		})
	}
	if o.watch {
		return a.watch(ctx, svc, rep.ID, nil)
	}
	return nil
}

func (a *app) confirm(question string) bool {
	fmt.Fprintf(a.stderr, "%s [y/N] ", question)
	line, _ := bufio.NewReader(a.stdin).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes", "e", "evet":
		return true
	}
	return false
}

// printRefused shows, on stderr, what a launch that was refused before it wrote anything had counted: its
// audience and exclusions, and the codes when it got as far as the pool.
func (a *app) printRefused(rep campaign.Report) {
	w := tabwriter.NewWriter(a.stderr, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "Not launched (nothing written, nothing sent): %s (%s)\n", rep.Name, rep.Channel)
	writeCounted(w, rep, rep.CodesCounted)
	w.Flush()
}

// writeCounted writes the audience a launch counted: its size, the eligible, each exclusion, and the codes
// (when the campaign has a pool and codesCounted: a plan refused early never reached the pool).
func writeCounted(w io.Writer, rep campaign.Report, codesCounted bool) {
	fmt.Fprintf(w, "  audience\t%d\n", rep.Audience)
	fmt.Fprintf(w, "  eligible\t%d\n", rep.Eligible)
	for _, r := range slices.Sorted(maps.Keys(rep.Excluded)) {
		fmt.Fprintf(w, "  excluded: %s\t%d\n", r, rep.Excluded[r])
	}
	if rep.CodePool != "" && codesCounted {
		fmt.Fprintf(w, "  codes needed / free\t%d / %d (pool %s)\n", rep.CodesNeeded, rep.CodesFree, rep.CodePool)
	}
}

func (a *app) printReport(rep campaign.Report, asJSON bool) {
	if asJSON {
		if rep.StartAt != nil {
			// Times in JSON are in UTC, as status gives them; the table shows --tz's.
			u := rep.StartAt.UTC()
			rep.StartAt = &u
		}
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		enc.Encode(rep) //nolint:errcheck
		return
	}
	title := "Launch"
	if rep.DryRun {
		title = "Dry run (nothing written, nothing sent)"
	}
	a.writeReport(a.stdout, rep, title)
}

// writeReport writes a launch's report as a table under title to out.
func (a *app) writeReport(out io.Writer, rep campaign.Report, title string) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "%s: %s (%s)\n", title, rep.Name, rep.Channel)
	if rep.ID != 0 {
		fmt.Fprintf(w, "  campaign id\t%d\n", rep.ID)
	}
	writeCounted(w, rep, rep.CodesCounted)
	fmt.Fprintf(w, "  batches\t%d\n", rep.Batches)
	if rep.SampleMessage != "" {
		fmt.Fprintf(w, "  first message\t%q\n", rep.SampleMessage)
	}
	if rep.Encoding != "" {
		fmt.Fprintf(w, "  encoding / segments\t%s / %d per message\n", rep.Encoding, rep.SegmentsPerMessage)
	}
	if rep.TotalSegments > 0 {
		fmt.Fprintf(w, "  SMS segments in all\t%d (%d of %d messages in UCS-2)\n", rep.TotalSegments, rep.UCS2Messages, rep.Eligible)
	}
	if rep.Rate > 0 {
		fmt.Fprintf(w, "  rate / ETA\t%s msg/s / %s\n", strconv.FormatFloat(rep.Rate, 'f', rateDigits(rep.Rate), 64), etaText(rep.ETASeconds))
	} else {
		fmt.Fprintf(w, "  rate\tno cap\n")
	}
	if rep.StartAt != nil {
		fmt.Fprintf(w, "  starts at\t%s\n", rep.StartAt.Format("2006-01-02 15:04 MST"))
	}
	if rep.Window != "" {
		fmt.Fprintf(w, "  send window\t%s %s every day\n", rep.Window, rep.WindowZone)
	}
	if rep.ID != 0 {
		fmt.Fprintf(w, "  batches queued\t%d\n", rep.Enqueued)
	}
	w.Flush()
	for _, warning := range rep.Warnings {
		fmt.Fprintf(a.stderr, "warning: %s\n", warning)
	}
}

// Bounds of the files a launch reads: one SELECT, one HTML e-mail body.
const (
	maxAudienceFile = 1 << 20
	maxHTMLFile     = campaign.MaxPartBytes
)

// readBounded reads the file at path, refusing one larger than max bytes before reading past it (a
// device such as /dev/zero, or a pipe, included).
func readBounded(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s is larger than %d KiB", path, max>>10)
	}
	return b, nil
}

// contentRules builds the lint for commercial SMS from the sender profile in the environment:
// SENDER_IDENTITY (the trade name and MERSİS number the messages must carry, matched literally) or
// CONTENT_SENDER_PATTERN (a regular expression), and CONTENT_OPTOUT_PATTERN (default: "RET" followed by
// a short number, as in "RET yazıp 4609'a gönderin").
func (a *app) contentRules(ch campaign.Channel, transactional bool) (*campaign.ContentRules, error) {
	if !ch.Spec().Linted || transactional {
		return nil, nil
	}
	r := &campaign.ContentRules{}
	switch id, pat := strings.TrimSpace(a.getenv("SENDER_IDENTITY")), a.getenv("CONTENT_SENDER_PATTERN"); {
	case pat != "":
		re, err := regexp.Compile(pat)
		if err != nil {
			return nil, usagef("CONTENT_SENDER_PATTERN is not a valid regular expression: %v", err)
		}
		r.Sender, r.SenderHint = re, "matching CONTENT_SENDER_PATTERN"
	case id != "":
		r.Sender, r.SenderHint = regexp.MustCompile(identityPattern(id)), fmt.Sprintf("%q, from SENDER_IDENTITY", id)
	default:
		return nil, usagef("a commercial SMS must carry the sender's identity (law 6563): set SENDER_IDENTITY to your trade name and MERSİS number as the messages show it, and put it in --message (or launch with --transactional if the message is not commercial)")
	}
	opt := a.getenv("CONTENT_OPTOUT_PATTERN")
	if opt == "" {
		opt = defaultOptOutPattern
	}
	re, err := regexp.Compile(opt)
	if err != nil {
		return nil, usagef("CONTENT_OPTOUT_PATTERN is not a valid regular expression: %v", err)
	}
	r.OptOut = re
	return r, nil
}

// identityPattern matches the sender's identity id in any case, Turkish's too: Go's case folding takes
// Ş for ş and Ğ for ğ but not İ for i nor I for ı, so "KAMPANYA İLETİŞİM" was not "Kampanya İletişim".
// Each of i, I, İ and ı matches any of them.
func identityPattern(id string) string {
	var b strings.Builder
	b.WriteString("(?i)")
	for _, r := range id {
		if strings.ContainsRune("iIİı", r) {
			b.WriteString("[iIİı]")
			continue
		}
		b.WriteString(regexp.QuoteMeta(string(r)))
	}
	return b.String()
}

// defaultOptOutPattern is "RET" as a word of its own and, within a few words, the short number it goes to.
// The word's edges are Unicode letters and digits, not \b's ASCII ones: in "ÜRETİM" the Ü and the İ would
// be edges for \b.
const defaultOptOutPattern = `(?i)(^|[^\p{L}\p{N}])RET([^\p{L}\p{N}]|$)\D{0,40}\d{3,6}`

// rateDigits is how many decimals a rate is shown with: none from 100/s on, one below, two below 1/s.
func rateDigits(r float64) int {
	switch {
	case r >= 100:
		return 0
	case r >= 1:
		return 1
	case r <= 0 || r >= 0.01:
		return 2
	}
	// Below 0.01 msg/s (--rate 0.001): two significant digits, not "0.00".
	return min(9, 1-int(math.Floor(math.Log10(r))))
}

// etaText says how long seconds is, as a duration (2h46m40s), or in days beyond a year.
func etaText(seconds float64) string {
	if seconds > 365*24*3600 {
		return fmt.Sprintf("%.0f days", seconds/(24*3600))
	}
	return (time.Duration(seconds) * time.Second).String()
}
