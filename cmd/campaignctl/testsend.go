package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/iys"
	"github.com/campaignctl/campaignctl/limiter"
	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/worker"
)

// testCode stands for the promo code in a test send: a test reserves no code, and the placeholder shows
// where the recipient's code goes. It has a space, which no pool's code may have (codes import refuses
// it, codes generate makes none): a pool that held "TEST-KOD" gave one recipient the code every test send
// showed to others.
const testCode = "TEST KOD"

// testSendTimeout bounds the provider call of a test send.
const testSendTimeout = 30 * time.Second

// testSendResult is what `launch --test-to` prints (--json: this object).
type testSendResult struct {
	Test      bool   `json:"test"`
	Channel   string `json:"channel"`
	Provider  string `json:"provider"`
	To        string `json:"to"`
	UserID    string `json:"user_id"`
	MessageID string `json:"message_id"`
	Code      string `json:"code,omitempty"`
	Subject   string `json:"subject,omitempty"`
}

// testSend renders the launch's message for one audience row (--test-user, or the first) and sends it
// to --test-to alone, through the channel's configured provider and under its provider-wide cap. No
// campaign is created, no code reserved, nothing queued; the send is audited in send_log as a test
// (campaign.TestCampaignID, status "test"), since send_log.campaign_id cannot be NULL.
func (a *app) testSend(ctx context.Context, o launchOptions, spec campaign.Spec, planner *campaign.Planner) error {
	if o.dryRun {
		return usagef("--test-to sends one message and --dry-run sends none: leave out one of them")
	}
	ch := spec.Channel
	to, err := ch.Spec().Canonical(o.testTo)
	if err != nil {
		return usagef("--test-to %q is not a valid %s address (%v); nothing was sent", o.testTo, ch.Spec().Title, err)
	}
	if err := spec.Validate(); err != nil {
		return err
	}
	if err := planner.CheckPool(ctx, spec); err != nil {
		return err
	}
	if !spec.Transactional && ch.IYSType() != "" {
		status, err := planner.TestConsent(ctx, spec, to)
		if err != nil {
			return err
		}
		if status != iys.StatusApproved {
			why := "has no İYS consent"
			if status != "" {
				why = "has İYS " + status
			}
			return usagef("%s %s for %s (%s): a commercial test goes only to an address with ONAY; import its consent, or add --transactional if the message is not commercial; nothing was sent",
				providers.MaskAddress(to), why, ch.IYSType(), spec.RecipientType)
		}
	}
	r, err := planner.TestRecipient(ctx, spec, o.testUser)
	if err != nil {
		return err
	}
	if spec.CodePool != "" {
		r.Code = testCode
	}
	// Rendered by the worker's own renderer, under the test's campaign ID: what the campaign will send.
	rd := worker.Renderer{Campaign: &campaign.Campaign{ID: campaign.TestCampaignID, Name: spec.Name, Channel: ch,
		TemplateID: spec.TemplateID, MaxSegments: spec.MaxSegments, Transactional: spec.Transactional, RecipientType: spec.RecipientType}}
	if spec.OneClickUnsubscribe() {
		signer, err := a.unsubscribeSigner()
		if err != nil {
			return err
		}
		if signer == nil {
			return errNoUnsubscribe()
		}
		mailto, err := a.unsubscribeMailto()
		if err != nil {
			return err
		}
		rd.Unsubscribe, rd.Mailto = signer, mailto
	}
	if rd.Tmpl, err = campaign.ParseContent(spec.Content()); err != nil {
		return err
	}
	m, err := rd.Render(&r)
	if err != nil {
		return usagef("the message for user_id %s: %v; nothing was sent", r.UserID, err)
	}
	m.To = to

	set, err := a.providers(sendOpts{timeout: testSendTimeout})
	if err != nil {
		return err
	}
	p := set.primary[ch]
	if p == nil {
		return usagef("no provider is configured for %s: set its settings (see campaignctl worker --help); nothing was sent", ch)
	}
	rdb, err := a.openQueueRedis(ctx) // no claim: a test send refused here leaves Redis as it was
	if err != nil {
		return err
	}
	defer rdb.Close()
	// The provider's bucket is the one every worker takes from: a test never pushes the provider past its cap.
	tokens := 1
	if sp, ok := p.(providers.SegmentPaced); ok && sp.PacesSegments() {
		_, n := providers.SMSSegments(m.Body)
		tokens = max(1, n)
	}
	limit := limiter.Limit{Key: state.ProviderBucket(p.Name()), Rate: set.rates[p.Name()], Pausable: true}
	if err := limiter.New(rdb).WaitN(ctx, tokens, limit); err != nil {
		return fmt.Errorf("no test send while the provider's rate limit cannot be read: %w", err)
	}
	masked := providers.MaskAddress(to)
	res, sendErr := p.Send(ctx, m)
	sendErr = providers.MaskContent(sendErr, m)
	status, reason := campaign.StatusTest, "test to "+masked
	if sendErr != nil {
		status, reason = campaign.StatusTestFailed, "test to "+masked+": "+sendErr.Error()
	}
	if err := planner.LogTest(context.WithoutCancel(ctx), spec, r.UserID, status, reason, res.MessageID); err != nil {
		if sendErr == nil {
			fmt.Fprintf(a.stderr, "warning: the test was sent (%s) but could not be audited: %v\n", res.MessageID, err)
		}
	}
	if sendErr != nil {
		var pe *providers.Error
		if errors.As(sendErr, &pe) && pe.AccountLevel() {
			// The provider refuses the account, not the recipient: say which settings to look at.
			var settings []string
			for _, ps := range providerSpecs() {
				if ps.name == p.Name() {
					settings = ps.settings
				}
			}
			return fmt.Errorf("test send to %s through %s: %w; the provider refuses the account, not the recipient: check %s (credentials and sender) on this machine and on the workers",
				masked, p.Name(), sendErr, strings.Join(settings, ", "))
		}
		return fmt.Errorf("test send to %s through %s: %w", masked, p.Name(), sendErr)
	}
	out := testSendResult{Test: true, Channel: string(ch), Provider: p.Name(), To: masked, UserID: r.UserID,
		MessageID: res.MessageID, Code: r.Code, Subject: m.Subject}
	if o.json {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	fmt.Fprintf(a.stdout, "Test sent to %s via %s (%s), rendered for user_id %s\n  message id\t%s\n", masked, p.Name(), ch, r.UserID, res.MessageID)
	if r.Code != "" {
		fmt.Fprintf(a.stdout, "  code\t%s (placeholder: no code was reserved)\n", r.Code)
	}
	fmt.Fprintln(a.stdout, "  no campaign was created and nothing was queued")
	return nil
}
