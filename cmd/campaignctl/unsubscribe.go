package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"mime"
	"net/http"
	"net/mail"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/internal/unsubscribe"
	"github.com/campaignctl/campaignctl/iys"
	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/receipts"
)

// The environment of the one-click unsubscribe links.
const (
	publicURLEnv   = "WEBHOOKS_PUBLIC_URL"
	unsubSecretEnv = "UNSUBSCRIBE_SECRET"
	unsubMailtoEnv = "UNSUBSCRIBE_MAILTO"
)

// unsubscribeSigner reads WEBHOOKS_PUBLIC_URL and UNSUBSCRIBE_SECRET: nil when neither is set, a usage
// error naming the fix when only one is, or either is malformed. No message quotes the secret.
func (a *app) unsubscribeSigner() (*unsubscribe.Signer, error) {
	base, secret := a.getenv(publicURLEnv), a.getenv(unsubSecretEnv)
	switch {
	case base == "" && secret == "":
		return nil, nil
	case base == "":
		return nil, usagef("%s is set but %s is not: set it to the URL where recipients reach campaignctl webhooks (e.g. https://hooks.example.com)", unsubSecretEnv, publicURLEnv)
	case secret == "":
		return nil, usagef("%s is set but %s is not: generate one with `openssl rand -hex 32` and give the same value to the workers and to campaignctl webhooks", publicURLEnv, unsubSecretEnv)
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, usagef("%s %s is not a base URL: give scheme://host[:port][/prefix] with no user, password or query, e.g. https://hooks.example.com", publicURLEnv, redact(base))
	}
	s, err := unsubscribe.New(secret, base)
	if err != nil {
		return nil, usageError{err}
	}
	return s, nil
}

// unsubscribeMailto reads UNSUBSCRIBE_MAILTO: "" when unset, else one plain address, which goes into
// every commercial e-mail's List-Unsubscribe header as <mailto:ADDRESS?subject=…>. Anything else (a name,
// angle brackets, a query, a line break that would start a header of its own) is a usage error.
func (a *app) unsubscribeMailto() (string, error) {
	raw := a.getenv(unsubMailtoEnv)
	if raw == "" {
		return "", nil
	}
	addr, err := mail.ParseAddress(raw)
	if err != nil || addr.Name != "" || addr.Address != raw || strings.ContainsAny(raw, "<>?&,;\"\r\n\t ") {
		return "", usagef("%s %q is not one plain e-mail address: give a mailbox that takes unsubscribe requests, e.g. unsubscribe@example.com (no name, brackets or query)", unsubMailtoEnv, raw)
	}
	return raw, nil
}

// errNoUnsubscribe refuses a commercial e-mail launch that could not carry its one-click links.
func errNoUnsubscribe() error {
	return usagef("a commercial e-mail must carry a one-click unsubscribe link (Gmail and Yahoo require it of bulk senders; law 6563 requires an easy refusal): set %s (where recipients reach `campaignctl webhooks`) and %s (`openssl rand -hex 32`), the same on the workers and on campaignctl webhooks; or launch with --transactional if the e-mail is not commercial",
		publicURLEnv, unsubSecretEnv)
}

// refusalSink records refusals (SendGrid events, Twilio inbound SMS, one-click links) as local RETs with
// their İYS outbox rows (iys.RecordRefusals). brand is the İYS brand a RET is stored under where the
// address has no consent at all.
type refusalSink struct {
	pool  *pgxpool.Pool
	brand string
	log   *slog.Logger
	// spool holds what Postgres could not take (nil: no spool): the providers'
	// refusals through the receipts handlers, the one-click unsubscribes through unsubscribeHandler.
	spool *receipts.Spool
}

// Refuse implements receipts.RefusalSink.
func (s *refusalSink) Refuse(ctx context.Context, rs []receipts.Refusal) error {
	out := make([]iys.Refusal, 0, len(rs))
	for _, r := range rs {
		typ, via := iys.TypeEmail, iys.ViaSendGrid
		if r.Channel == string(campaign.ChannelSMS) {
			typ, via = iys.TypeMessage, iys.ViaTwilioInbound
			if r.Kind == receipts.RefusalOptedOut {
				via = iys.ViaTwilioOptOut // Twilio's error 21610, not a message from the person
			}
		}
		if _, err := iys.CanonicalRecipient(typ, r.Address); err != nil {
			// Nothing to refuse for an address that is none (a forged event cannot get here: it is signed).
			s.log.Warn("refusal with an unusable address ignored", "via", via, "kind", r.Kind, "address", providers.MaskAddress(r.Address))
			continue
		}
		out = append(out, iys.Refusal{Via: via, EventID: r.EventID, Kind: r.Kind, Recipient: r.Address, Type: typ,
			CampaignID: r.CampaignID, UserID: r.UserID, Evidence: r.Evidence, At: r.At, Suppressed: r.Suppressed})
	}
	if err := s.scopeGroupRefusals(ctx, out); err != nil {
		return refusedForGood(err)
	}
	return refusedForGood(s.record(ctx, out))
}

// scopeGroupRefusals sets the Brand of each group_unsubscribe in rs that names its campaign to that
// campaign's İYS brand, read in one query for the post: it refuses one group of the brand's e-mails, not
// every brand sending through the same SendGrid account (a global unsubscribe or a spam report does). A
// campaign that is not there leaves the refusal of every brand.
func (s *refusalSink) scopeGroupRefusals(ctx context.Context, rs []iys.Refusal) error {
	var ids []int64
	for _, r := range rs {
		if r.Kind == receipts.RefusalGroupUnsubscribe && r.CampaignID != 0 {
			ids = append(ids, r.CampaignID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	rows, err := s.pool.Query(ctx, `SELECT id, brand_code FROM campaigns WHERE id = ANY($1)`, ids)
	if err != nil {
		return fmt.Errorf("the refused campaigns' brands: %w", err)
	}
	brands := map[int64]string{}
	var id int64
	var brand string
	if _, err := pgx.ForEachRow(rows, []any{&id, &brand}, func() error { brands[id] = brand; return nil }); err != nil {
		return fmt.Errorf("the refused campaigns' brands: %w", err)
	}
	for i := range rs {
		if rs[i].Kind == receipts.RefusalGroupUnsubscribe {
			rs[i].Brand = brands[rs[i].CampaignID]
		}
	}
	return nil
}

// lastOneClick is the event ID of the one-click refusal recorded for campaign id's link to user within the
// second before at, unless a consent of the address was given again since ("" when none).
func (s *refusalSink) lastOneClick(ctx context.Context, id int64, user, addr, typ string, at time.Time) (string, error) {
	rcpt, err := iys.CanonicalRecipient(typ, addr)
	if err != nil {
		return "", nil // RecordRefusals says what is wrong with it
	}
	var ev string
	// Not when a consent was given again since that click: this click refuses it.
	err = s.pool.QueryRow(ctx, `SELECT f.event_id FROM refusals f
		WHERE f.recipient = $1 AND f.type = $2 AND f.via = $3 AND f.campaign_id = $4 AND f.user_id = $5 AND f.refused_at > $6
		  AND NOT EXISTS (SELECT 1 FROM iys_consents c WHERE c.recipient = $1 AND c.type = $2 AND c.status = 'ONAY'
			AND c.consent_date >= f.refused_at)
		ORDER BY f.refused_at DESC LIMIT 1`, rcpt, typ, iys.ViaOneClick, id, user, at.Add(-time.Second)).Scan(&ev)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("the link's last click: %w", err)
	}
	return ev, nil
}

func (s *refusalSink) record(ctx context.Context, rs []iys.Refusal) error {
	rep, err := iys.RecordRefusals(ctx, s.pool, s.brand, rs)
	if err != nil {
		return err
	}
	// The receipts handlers log each refusal as it arrives (the one-click links, below): this says what it
	// changed, repeats included.
	s.log.Info("refusals made local RETs", "recorded", rep.Recorded, "repeats", rep.Repeats, "consents_revoked", rep.Revoked, "queued_for_iys", rep.Outboxed)
	return nil
}

// deliveryAndRefusalSink is the webhooks' sink: receipts go to the delivery batcher, refusals (SendGrid
// unsubscribe, group_unsubscribe and spamreport events in the same posts) to the refusal sink.
type deliveryAndRefusalSink struct {
	receipts.MatchingSink
	*refusalSink
}

// unsubscribePage is the page of a one-click link: the question with its button, or what happened.
var unsubscribePage = template.Must(template.New("u").Parse(`<!doctype html>
<html lang="tr"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="robots" content="noindex"><title>{{.TitleTR}} / {{.TitleEN}}</title>
<style>body{font-family:system-ui,sans-serif;max-width:34em;margin:3em auto;padding:0 1em;line-height:1.5}
button{font-size:1.1em;padding:.6em 1.4em;cursor:pointer}p.en{color:#555}</style></head>
<body><h1>{{.TitleTR}}</h1><p>{{.TextTR}}</p><p class="en" lang="en"><b>{{.TitleEN}}</b> — {{.TextEN}}</p>
{{if .Ask}}<form method="post"><input type="hidden" name="List-Unsubscribe" value="One-Click"><input type="hidden" name="via" value="page">
<button type="submit">Aboneliğimi iptal et / Unsubscribe</button></form>{{end}}
</body></html>
`))

type unsubscribeText struct {
	TitleTR, TextTR, TitleEN, TextEN string
	Ask                              bool
}

var (
	unsubAsk = unsubscribeText{TitleTR: "E-posta aboneliğinden çıkış", TextTR: "Bu markanın ticari e-postalarını artık almak istemiyorsanız aşağıdaki düğmeye basın. İzniniz geri alınır ve İleti Yönetim Sistemi'ne (İYS) bildirilir.",
		TitleEN: "Unsubscribe", TextEN: "Press the button to stop this brand's commercial e-mails. Your consent is withdrawn and reported to İYS, the Turkish consent registry.", Ask: true}
	unsubDone = unsubscribeText{TitleTR: "Aboneliğiniz iptal edildi", TextTR: "Bu markadan artık ticari e-posta almayacaksınız. Talebiniz İYS'ye bildirilecek.",
		TitleEN: "You are unsubscribed", TextEN: "You will get no more commercial e-mails from this brand. Your refusal is reported to İYS."}
	unsubBad = unsubscribeText{TitleTR: "Bağlantı geçersiz", TextTR: "Bu bağlantı geçerli değil. E-postadaki bağlantıyı eksiksiz kopyaladığınızdan emin olun.",
		TitleEN: "This link is not valid", TextEN: "Check that the whole link from the e-mail was used."}
	unsubTest = unsubscribeText{TitleTR: "Test iletisi", TextTR: "Bu, bir test gönderiminin abonelikten çıkış bağlantısıdır ve çalışıyor. Kampanya e-postalarında bu bağlantı alıcının iznini geri alır; test iletisi için hiçbir şey kaydedilmedi.",
		TitleEN: "Test message", TextEN: "This is the unsubscribe link of a test send, and it works. In a campaign's e-mails this link withdraws the recipient's consent; for a test message nothing was recorded."}
	unsubFailed = unsubscribeText{TitleTR: "Şu anda işlenemedi", TextTR: "Talebiniz kaydedilemedi; lütfen birkaç dakika sonra tekrar deneyin.",
		TitleEN: "Not recorded yet", TextEN: "Your request could not be recorded; please try again in a few minutes."}
)

// maxUnsubscribeBody bounds a one-click POST: RFC 8058's body is the 26 bytes List-Unsubscribe=One-Click.
const maxUnsubscribeBody = 1 << 10

// unsubscribeHandler serves the one-click links (unsubscribe.Path + TOKEN): GET shows the question with a
// button (a mail client's or a scanner's GET changes nothing), POST with List-Unsubscribe=One-Click (RFC
// 8058, from the mail client, or the button) records the refusal. A token that does not verify is 403, a
// valid one for a user the campaign never had 404: neither changes anything.
func unsubscribeHandler(signer *unsubscribe.Signer, store *campaign.Store, sink *refusalSink, storeWait time.Duration, log *slog.Logger) http.Handler {
	page := func(w http.ResponseWriter, status int, t unsubscribeText) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("Referrer-Policy", "no-referrer")
		w.Header().Set("X-Frame-Options", "DENY")
		w.WriteHeader(status)
		unsubscribePage.Execute(w, t) //nolint:errcheck // the client went away
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token := strings.TrimPrefix(r.URL.Path, unsubscribe.Path)
		link, err := signer.Check(token)
		id, user := link.CampaignID, link.UserID
		if err != nil {
			log.Warn("unsubscribe link refused", "reason", "bad_signature", "remote", r.RemoteAddr,
				"hint", "a forged or damaged link; if every link is refused, UNSUBSCRIBE_SECRET here differs from the workers'")
			page(w, http.StatusForbidden, unsubBad)
			return
		}
		if id == campaign.TestCampaignID {
			// A test send's link (launch --test-to): it works, and the tester's own consent stays.
			log.Info("unsubscribe link of a test send used: nothing recorded", "remote", r.RemoteAddr)
			page(w, http.StatusOK, unsubTest)
			return
		}
		if r.Method == http.MethodPost {
			r.Body = http.MaxBytesReader(w, r.Body, maxUnsubscribeBody)
			// RFC 8058 asks mail clients for multipart/form-data, and allows a URL-encoded form.
			parse := r.ParseForm
			if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt == "multipart/form-data" {
				parse = func() error { return r.ParseMultipartForm(maxUnsubscribeBody) }
			}
			if err := parse(); err != nil || r.PostForm.Get("List-Unsubscribe") != "One-Click" {
				http.Error(w, "400 Bad Request: a one-click unsubscribe POST carries List-Unsubscribe=One-Click (RFC 8058)", http.StatusBadRequest)
				return
			}
			from := "the mail client's one-click POST (RFC 8058)"
			if r.PostForm.Get("via") == "page" {
				from = "the button of the unsubscribe page"
			}
			// Each click is a refusal of its own, dated when it came: one made after the person gave consent
			// again outranks that consent.
			c := oneClick{CampaignID: id, Nonce: link.Nonce, UserID: user, At: time.Now().UTC(), From: from}
			// Held in the refusal spool while Postgres cannot take it (a restart, a failover), as the
			// providers' posts are (without a spool, tried again for up to webhooks --store-wait): a mail
			// client's one-click POST answered 503 may never come again.
			// Recorded even when the mail client hangs up meanwhile, as the providers' posts are.
			wctx, cancel := receipts.StoreContext(r.Context(), storeWait)
			defer cancel()
			var hold func() error
			if sink.spool != nil {
				hold = func() error { return sink.spool.HoldRequest(oneClickKind, 1, c, state.SpooledUser(c.UserID)) }
			}
			// The workers skip the person from now on: the write may wait behind an import.
			announced := sink.spool.Announce([]string{state.SpooledUser(c.UserID)})
			_, err := receipts.StoreOrHold(wctx, storeWait, log, "a one-click unsubscribe", func(ctx context.Context) error {
				return recordOneClick(ctx, store, sink, c, log)
			}, hold)
			announced()
			switch {
			case errors.Is(err, campaign.ErrNoRecipient), errors.Is(err, errNoIYSType):
				log.Warn("unsubscribe link of no recipient", "campaign_id", id, "remote", r.RemoteAddr)
				page(w, http.StatusNotFound, unsubBad)
				return
			case err != nil:
				log.Error("record a one-click unsubscribe", "campaign_id", id, "err", err)
				page(w, http.StatusServiceUnavailable, unsubFailed)
				return
			}
			page(w, http.StatusOK, unsubDone)
			return
		}
		// GET and HEAD: the page with its button, for a link of a recipient of a channel with İYS consent.
		_, ch, _, _, err := store.LinkRecipient(r.Context(), id, link.Nonce, user)
		switch {
		case errors.Is(err, campaign.ErrNoRecipient):
			log.Warn("unsubscribe link of no recipient", "campaign_id", id, "remote", r.RemoteAddr)
			page(w, http.StatusNotFound, unsubBad)
			return
		case err != nil:
			log.Error("unsubscribe link", "campaign_id", id, "err", err)
			page(w, http.StatusServiceUnavailable, unsubFailed)
			return
		case ch.Spec().IYSType == "":
			page(w, http.StatusNotFound, unsubBad)
			return
		}
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			page(w, http.StatusOK, unsubAsk)
			return
		}
		w.Header().Set("Allow", "GET, POST")
		http.Error(w, http.StatusText(http.StatusMethodNotAllowed), http.StatusMethodNotAllowed)
	})
}

// handleOneClicks makes spool record the one-click unsubscribes it holds with recordOneClick.
func handleOneClicks(spool *receipts.Spool, store *campaign.Store, sink *refusalSink, log *slog.Logger) {
	spool.Handle(oneClickKind, func(ctx context.Context, raw json.RawMessage) error {
		var c oneClick
		if err := json.Unmarshal(raw, &c); err != nil {
			return receipts.Final(err)
		}
		return recordOneClick(ctx, store, sink, c, log)
	})
}

// oneClickKind is the refusal spool's kind of a one-click unsubscribe (Spool.HoldRequest).
const oneClickKind = "one_click"

// oneClick is a one-click unsubscribe to record: the link's campaign (with its nonce, when the link
// carries one) and user, when it was used and through what (the mail client's POST or the page's button).
type oneClick struct {
	CampaignID int64     `json:"campaign_id"`
	Nonce      string    `json:"nonce,omitempty"`
	UserID     string    `json:"user_id"`
	At         time.Time `json:"at"`
	From       string    `json:"from"`
}

// errNoIYSType: the link's campaign sends on a channel without İYS consent, which a link cannot refuse.
var errNoIYSType = errors.New("the campaign's channel has no İYS consent to refuse")

// recordOneClick records c: the refusal of the address the campaign was planned to send the user, a local
// RET queued for İYS. A click within a second of the last one recorded for the link is that one again (a
// double click, a client's retry), whichever side of a second's turn they fell, unless a consent was given
// again in between. For a recipient whose outcome is unknown, the used link is also a receipt of the
// message's delivery (see LinkRecipient). campaign.ErrNoRecipient and errNoIYSType come marked
// receipts.Final, as does a refusal Postgres refuses for what it holds.
func recordOneClick(ctx context.Context, store *campaign.Store, sink *refusalSink, c oneClick, log *slog.Logger) error {
	addr, ch, brand, unsure, err := store.LinkRecipient(ctx, c.CampaignID, c.Nonce, c.UserID)
	switch {
	case errors.Is(err, campaign.ErrNoRecipient):
		return receipts.Final(err)
	case err != nil:
		return err
	case ch.Spec().IYSType == "":
		return receipts.Final(errNoIYSType)
	}
	typ := ch.Spec().IYSType
	eventID := fmt.Sprintf("%d:%s:%d", c.CampaignID, c.UserID, c.At.UnixMilli())
	last, err := sink.lastOneClick(ctx, c.CampaignID, c.UserID, addr, typ, c.At)
	if err != nil {
		return err
	}
	if last != "" {
		eventID = last
	}
	log.Info("refusal received", "via", iys.ViaOneClick, "type", typ, "address", providers.MaskAddress(addr), "campaign_id", c.CampaignID)
	if err := sink.record(ctx, []iys.Refusal{{Via: iys.ViaOneClick, EventID: eventID, Kind: iys.ViaOneClick,
		Recipient: addr, Type: typ, CampaignID: c.CampaignID, UserID: c.UserID, At: c.At, Brand: brand,
		Evidence: fmt.Sprintf("unsubscribe link of campaign %d, user %s, through %s", c.CampaignID, providers.MaskUserID(c.UserID), c.From)}}); err != nil {
		return refusedForGood(err)
	}
	if unsure {
		// The link came in the message: used, it proves the message reached the person. For a recipient
		// whose outcome is unknown (its answer lost; or pending again for a resend), that is a receipt of
		// its delivery, as SendGrid's unsubscribe event is: it is sent, and not sent again. (A recipient
		// never sent has no link to use; one sent already needs no proof.)
		if _, err := store.RecordDeliveries(ctx, []campaign.Delivery{{Provider: iys.ViaOneClick, CampaignID: c.CampaignID, UserID: c.UserID,
			Address: addr, Status: receipts.StatusDelivered, EventID: eventID, At: c.At}}); err != nil {
			log.Warn("one-click unsubscribe recorded, but not as a receipt of the message's delivery", "campaign_id", c.CampaignID, "err", err)
		}
	}
	return nil
}

// outboxWatchEvery is how often a running `campaignctl webhooks` looks for refusals overdue in İYS.
const outboxWatchEvery = 10 * time.Minute

// watchOutbox logs an error, at the start and then every outboxWatchEvery, while refusals wait for İYS
// longer than two business days (the law allows three): someone must run campaignctl iys push.
func watchOutbox(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) {
	t := time.NewTicker(outboxWatchEvery)
	defer t.Stop()
	for {
		if sum, err := iys.Outbox(ctx, pool, time.Now()); err == nil && sum.Overdue > 0 {
			log.Error("refusals not registered in İYS two business days after they were received (the law allows three): run campaignctl iys push, and schedule it",
				"overdue", sum.Overdue, "oldest", sum.Oldest)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
