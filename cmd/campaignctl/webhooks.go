package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/internal/unsubscribe"
	"github.com/campaignctl/campaignctl/providers/netgsm"
	"github.com/campaignctl/campaignctl/providers/receipts"
)

// Receipt routes of `campaignctl webhooks`.
const (
	twilioReceiptPath   = "/twilio/status"
	twilioInboundPath   = "/twilio/inbound"
	sendgridReceiptPath = "/sendgrid/events"
)

// webhooksRealm is the realm of the Basic auth challenge of GET /stats.
const webhooksRealm = "campaignctl webhooks"

// The receipts server's limits, for provider callbacks: a provider sends its headers at once and its
// body right after (the body's own pace is the receipts handlers' business: 2 s, plus 1 s per 256 KiB,
// see package receipts; no other route reads a body), reuses a connection for its next post within
// seconds, and sends a few hundred bytes of headers. ReadTimeout is only a backstop: every route sets
// the deadline of its body itself. WriteTimeout leaves room for a slow Postgres (a batch of receipts is
// given 30 s), after which the provider gets no answer and posts again.
const (
	webhooksReadHeaderTimeout = 5 * time.Second
	webhooksReadTimeout       = 10 * time.Second
	webhooksWriteTimeout      = 30 * time.Second
	webhooksIdleTimeout       = 30 * time.Second
	webhooksMaxHeaderBytes    = 32 << 10
)

// refusalsHeldFor is how long the workers wait on a note that this process's spool holds refusals, unless
// it is renewed (each replay, about twice a second, while any wait): a process that died with its spool
// full holds them no longer than that.
const refusalsHeldFor = 5 * time.Second

// refusalsAnnouncedMargin is how long, past --store-wait, the workers skip who a refusal being recorded
// names (state.AnnounceRefusals) unless it is taken back first: the time to hold it in the spool once the
// wait ran out, with room to spare. A process that died mid-write blocks them no longer than that.
const refusalsAnnouncedMargin = 10 * time.Second

func (a *app) newWebhooksCmd() *cobra.Command {
	var addr, publicURL, authFile, spoolDir string
	var netgsmEvery, storeWait time.Duration
	var keywords []string
	cmd := &cobra.Command{
		Use:   "webhooks",
		Short: "Receive delivery receipts and refusals (Twilio, SendGrid, one-click unsubscribe links), poll Netgsm's reports, and record them",
		Long: `Receive the providers' delivery receipts and record, per recipient, whether the message was delivered,
undelivered, bounced or dropped (campaignctl status shows accepted against delivered).

  POST ` + twilioReceiptPath + `     Twilio status callbacks, verified with X-Twilio-Signature and TWILIO_AUTH_TOKEN.
                         Workers ask for them when TWILIO_STATUS_CALLBACK is this URL.
  POST ` + sendgridReceiptPath + `   SendGrid's signed Event Webhook, verified with the ECDSA public key in
                         SENDGRID_WEBHOOK_PUBLIC_KEY (base64, from SendGrid's Mail Settings). Its
                         unsubscribe, group_unsubscribe and spamreport events are refusals.
  POST ` + twilioInboundPath + `    Twilio's incoming-message webhook (set it on the sender number or messaging
                         service), verified like the status callbacks: an SMS whose first word is a
                         refusal keyword (--refusal-keywords: RET, IPTAL, STOP) is a refusal of its number.
  GET|POST /u/TOKEN      the one-click unsubscribe links of commercial e-mails (List-Unsubscribe, RFC 8058),
                         with WEBHOOKS_PUBLIC_URL (this server as recipients reach it) and UNSUBSCRIBE_SECRET
                         (as on the workers): GET shows a page with a button, POST records the refusal.

Netgsm posts no receipts: with NETGSM_USERCODE and NETGSM_PASSWORD set (and NETGSM_BASE_URL, as on the
workers), its report API is asked, every --netgsm-report-interval, about 100 of the messages sent through
it in the last 3 days whose delivery is not known, in turn. A report of status 16 (İYS holds no consent)
turns that person's stored consent RET here, as a send refused with code 50 does. Of several webhooks
processes on one database, one polls at a time (a Postgres advisory lock); another takes over within a
minute when it stops.

A refusal is a local RET at once (a running campaign skips the person from its next chunk; the next launch
excludes them as consent_ret) and waits in the İYS outbox: campaignctl iys push registers it in İYS.
  GET  /stats            accepted and refused requests, by reason: from this machine (loopback), or
                         elsewhere with the user:password of --basic-auth-file or ` + uiAuthEnv + `
                         (the UI's credentials); otherwise 403, or 401 when credentials are set.
  GET  /healthz          200 while serving, for probes.

Unsigned, wrongly signed or (SendGrid) stale requests are refused with 403 and counted. Twilio signs the
URL it called: behind a proxy or tunnel, that is WEBHOOKS_PUBLIC_URL (where recipients and providers reach
this server), or --public-url when the providers call another (scheme, host and path prefix only: no user
name or password, no query).

Limits, for what the providers send: a Twilio callback (under 1 KiB) may be up to ` + byteSize(receipts.MaxTwilioBody) + `, a SendGrid
batch (posted at about 768 KB) up to ` + byteSize(receipts.MaxSendGridBody) + `; a larger Content-Length is refused (413) unread.
Signature headers are checked before a body is read, the signature before anything in the body is
decoded. The bodies being read at once are bounded per provider (beyond that: 503 with Retry-After, and
the provider posts again). Headers must arrive within ` + webhooksReadHeaderTimeout.String() + `, a body within 2s plus 1s per 256 KiB
(else 408); an idle connection is closed after ` + webhooksIdleTimeout.String() + `.

While Postgres cannot take what a request carries (a restart, a failover), its refusals and receipts are
written to the spool (--spool-dir, one synced file a request) after one failed attempt, and the request is
answered as recorded: Twilio does not post an incoming SMS or a status callback again after a 500 unless
its URL asks it to (connection overrides such as #rc=3&rp=5xx,ct on the webhook URL). They are recorded
as soon as Postgres is back (tried every 0.25 to 0.5 s), by this process or by the next one started on
the same directory, so a stop or a crash meanwhile loses nothing. A one-click unsubscribe POST is spooled
the same way. While the spool holds requests, the workers send no SMS or commercial e-mail (they are told
through REDIS_URL): the consents they would read miss those refusals. With a spool, webhooks also starts while Postgres is away. Without one (--spool-dir ''),
such a request is held and tried again for up to --store-wait, then answered 500. On SIGTERM, the
requests under way are answered before the process ends.`,
		Example: `  TWILIO_AUTH_TOKEN=... SENDGRID_WEBHOOK_PUBLIC_KEY=... campaignctl webhooks --addr 127.0.0.1:8090
  campaignctl webhooks --addr 0.0.0.0:8090 --public-url https://hooks.example.com
  curl http://127.0.0.1:8090/stats                     # on the same machine
  campaignctl webhooks --addr 0.0.0.0:8090 --basic-auth-file /etc/campaignctl/ui.auth   # /stats from elsewhere too`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if _, err := checkListenAddr(addr, "127.0.0.1:8090 (this machine only) or 0.0.0.0:8090 (every interface)"); err != nil {
				return err
			}
			if storeWait < 0 || storeWait > webhooksWriteTimeout-5*time.Second {
				return usagef("--store-wait %v: give 0 (answer 500 at once) up to %v (the server's write timeout less 5 s), e.g. 10s", storeWait, webhooksWriteTimeout-5*time.Second)
			}
			// The providers reach this server where recipients do (WEBHOOKS_PUBLIC_URL, the base of the
			// unsubscribe links), unless --public-url says otherwise: behind a proxy, Twilio signs that URL.
			publicName := "--public-url"
			if !cmd.Flags().Changed("public-url") {
				publicURL, publicName = a.getenv(publicURLEnv), publicURLEnv
			}
			if publicURL != "" {
				u, err := webhooksPublicURL(publicName, publicURL)
				if err != nil {
					return err
				}
				publicURL = u
			}
			creds, err := a.basicAuthFrom(authFile)
			if err != nil {
				return err
			}
			log := a.logger()
			brand, err := a.brandCode()
			if err != nil {
				return err
			}
			refusals := &refusalSink{brand: brand, log: log}
			deliveries := &batchedDeliveries{} // its batcher is set before anything is served
			sink := deliveryAndRefusalSink{MatchingSink: deliveries, refusalSink: refusals}
			handlers := map[string]*receipts.Handler{}
			if key := a.getenv("SENDGRID_WEBHOOK_PUBLIC_KEY"); key != "" {
				h, err := receipts.SendGridHandler(key, sink, log)
				if err != nil {
					return usagef("SENDGRID_WEBHOOK_PUBLIC_KEY is not a base64 ECDSA public key (%v); copy it from SendGrid's signed Event Webhook settings", err)
				}
				handlers["sendgrid"] = h
			}
			token := a.getenv("TWILIO_AUTH_TOKEN")
			signer, err := a.unsubscribeSigner()
			if err != nil {
				return err
			}
			if netgsmEvery < 0 {
				return usagef("--netgsm-report-interval %v: give a duration of zero (no polling) or more, e.g. 6s (Netgsm answers 10 report queries a minute)", netgsmEvery)
			}
			reporter, err := a.netgsmReporter(netgsmEvery)
			if err != nil {
				return err
			}
			if token == "" && len(handlers) == 0 && signer == nil && reporter == nil {
				netgsmHow := "NETGSM_USERCODE with NETGSM_PASSWORD (Netgsm's reports)"
				if netgsmEvery == 0 && a.getenv("NETGSM_USERCODE") != "" {
					netgsmHow = "a --netgsm-report-interval above 0 (Netgsm's reports: 0 turns them off)"
				}
				return usagef("nothing to receive: set TWILIO_AUTH_TOKEN (Twilio status callbacks and incoming SMS), SENDGRID_WEBHOOK_PUBLIC_KEY (SendGrid events), WEBHOOKS_PUBLIC_URL with UNSUBSCRIBE_SECRET (one-click unsubscribe links) and/or %s", netgsmHow)
			}

			dir, err := a.refusalSpoolDir(spoolDir)
			if err != nil {
				return err
			}
			var spool *receipts.Spool
			if dir != "" {
				spool = receipts.NewSpool(dir, refusals, log)
				if err := spool.Check(); err != nil {
					if cmd.Flags().Changed("spool-dir") {
						return usagef("--spool-dir %s: %v; give a directory this process may write, or --spool-dir '' for none", spoolDir, err)
					}
					fmt.Fprintf(a.stderr, "warning: no refusal spool (%v): a refusal Postgres cannot take within --store-wait is answered 500; give --spool-dir\n", err)
					spool = nil
				}
			}
			ctx, stop := context.WithCancelCause(ctx)
			defer stop(nil)
			engine, err := a.openEngine(ctx)
			if err != nil {
				// With a spool, Postgres being away is no reason not to serve: a refusal posted now is held
				// and recorded when it is back (a provider's post to a server that is down is lost as surely
				// as one answered 500). The schema is checked then.
				if spool == nil || !postgresAway(err) {
					return err
				}
				away := err
				if engine, err = a.openEngineLater(ctx); err != nil {
					return err
				}
				fmt.Fprintf(a.stderr, "warning: serving while Postgres is away (%v): refusals and receipts wait in the spool until it is back\n", away)
				go awaitSchema(ctx, engine, stop, log)
			}
			defer engine.Close()
			refusals.pool = engine
			deliveries.batcher = newDeliveryBatcher(campaign.NewStore(engine))
			deliveries.batcher.log = log
			go deliveries.batcher.run(ctx)
			if spool != nil {
				// While refusals wait in the spool, the workers lease nothing to send: the consents they would
				// read miss them (Postgres was away). They are told through Redis, theirs.
				if rdb, where, err := a.newRedis(); err != nil {
					fmt.Fprintf(a.stderr, "warning: %s: %v: the workers cannot be told to wait while refusals wait in the spool\n", a.redisName(), err)
				} else {
					defer rdb.Close()
					holder := state.LocalOwner()
					spool.OnHeld = func(ctx context.Context, held bool) error {
						if held {
							return state.NoteRefusalsHeld(ctx, rdb, holder, refusalsHeldFor)
						}
						return state.ClearRefusalsHeld(ctx, rdb, holder)
					}
					spool.OnSpooled = func(ctx context.Context, ids []string, held bool) error {
						if held {
							return state.NoteSpooled(ctx, rdb, ids)
						}
						return state.ForgetSpooled(ctx, rdb, ids)
					}
					spool.OnAnnounce = func(ctx context.Context, ids []string, on bool) error {
						if on {
							// Past the longest a request is recorded or held (the wait, the spool's write).
							return state.AnnounceRefusals(ctx, rdb, ids, storeWait+refusalsAnnouncedMargin)
						}
						return state.WithdrawRefusals(ctx, rdb, ids)
					}
					log.Debug("the workers wait while refusals wait in the spool", "redis", where)
				}
				handleOneClicks(spool, campaign.NewStore(engine), refusals, log)
				spool.HandleReceipts(deliveries)
				refusals.spool = spool
				go spool.Run(ctx)
				// The directory goes with the process when nothing waits in it (os.Remove leaves one that is
				// not empty).
				defer os.Remove(dir) //nolint:errcheck
			}
			go watchOutbox(ctx, engine, log)
			go retryEarlyReceipts(ctx, campaign.NewStore(engine), earlyReceiptsEvery, log)
			var poller *receipts.NetgsmPoller
			if reporter != nil {
				poller = netgsmPoller(reporter, campaign.NewStore(engine), deliveries, netgsmEvery, log)
				go pollAlone(ctx, engine, poller.Run, netgsmPollLock, time.Minute, 2*time.Second, log)
				if netgsmEvery < 6*time.Second {
					fmt.Fprintf(a.stderr, "warning: --netgsm-report-interval %v: Netgsm answers 10 report queries a minute, and refuses the rest (the poller then waits a minute)\n", netgsmEvery)
				}
			}

			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return usagef("--addr %s: %v", addr, err)
			}
			// Without --public-url, Twilio's signatures are checked against the URL each request was sent to
			// (its Host): the listening address says nothing of it when it is every interface (0.0.0.0),
			// and every signed refusal would be refused.
			shown := publicURL
			if shown == "" {
				shown = "http://" + ln.Addr().String()
			}
			if token != "" {
				handlers["twilio"] = receipts.TwilioHandler(token, publicURL, deliveryAndRefusalSink{MatchingSink: deliveries, refusalSink: refusals}, log)
				handlers["twilio_inbound"] = receipts.TwilioInboundHandler(token, publicURL, keywords, refusals, log)
			}
			var extra map[string]http.Handler
			if signer != nil {
				u := unsubscribeHandler(signer, campaign.NewStore(engine), refusals, storeWait, log)
				extra = map[string]http.Handler{"GET " + unsubscribe.Path: u, "HEAD " + unsubscribe.Path: u, "POST " + unsubscribe.Path: u}
			}
			var polled map[string]func() receipts.Stats
			if poller != nil {
				polled = map[string]func() receipts.Stats{"netgsm": poller.Stats}
			}
			for _, h := range handlers {
				h.SetStoreWait(storeWait)
				h.SetSpool(spool)
			}
			srv := webhooksServer(webhooksMux(handlers, creds, log, extra, polled))
			// On the way out, the requests under way are answered, what they carry recorded or held in the
			// spool, before the process ends: Serve returns as soon as Shutdown begins, and a process that
			// ended then dropped them (the provider got no answer, and Twilio does not post again). A
			// request holds at most one attempt with a spool, the store wait and its margin without one.
			shutDone := make(chan struct{})
			go func() {
				defer close(shutDone)
				<-ctx.Done()
				shut, cancel := context.WithTimeout(context.Background(), max(10*time.Second, storeWait+6*time.Second))
				defer cancel()
				srv.Shutdown(shut) //nolint:errcheck // best effort on the way out
			}()
			stats := "GET /stats from this machine only"
			if creds != nil {
				stats = fmt.Sprintf("GET /stats from this machine, or elsewhere with basic auth as %q from %s", creds.user, creds.source)
			}
			fmt.Fprintf(a.stderr, "receipts endpoint listening on http://%s; %s\n", ln.Addr(), stats)
			for _, name := range slices.Sorted(maps.Keys(handlers)) {
				what := name + " receipts"
				if name == "twilio_inbound" {
					what = "twilio incoming SMS (refusals)"
				}
				fmt.Fprintf(a.stderr, "receiving %s at %s%s\n", what, shown, webhooksPaths[name])
			}
			if handlers["sendgrid"] == nil && a.getenv("SENDGRID_API_KEY") != "" {
				// E-mail is sent from this configuration, and its refusals would go unheard: SendGrid's
				// unsubscribes and spam reports are consents withdrawn (law 6563), and it gives up after 24 h.
				fmt.Fprintf(a.stderr, "warning: SENDGRID_API_KEY is set but SENDGRID_WEBHOOK_PUBLIC_KEY is not: SendGrid's events (unsubscribes, spam reports, bounces, deliveries) are not received here (%s answers 404) and are lost once SendGrid stops retrying after 24 h; set it from SendGrid's signed Event Webhook settings\n", sendgridReceiptPath)
			}
			if spool != nil {
				fmt.Fprintf(a.stderr, "refusals and receipts Postgres cannot take are held in %s until it can\n", spool.Dir())
			}
			if poller != nil {
				fmt.Fprintf(a.stderr, "asking Netgsm for the reports of its messages every %v, while no other webhooks process on this database does\n", netgsmEvery)
			}
			if signer != nil {
				fmt.Fprintf(a.stderr, "serving one-click unsubscribe links at %s%s…\n", strings.TrimSuffix(a.getenv(publicURLEnv), "/"), unsubscribe.Path)
			}
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			<-shutDone
			if err := context.Cause(ctx); errors.Is(err, campaign.ErrSchema) {
				return err
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:8090", "listen address host:port")
	cmd.Flags().StringVar(&publicURL, "public-url", "", "the URL the providers call (scheme://host[:port][/prefix], no credentials); default $"+publicURLEnv+", else http://ADDR")
	cmd.Flags().StringSliceVar(&keywords, "refusal-keywords", receipts.DefaultRefusalKeywords, "the first words that make an incoming SMS a refusal (case and İ/ı folded)")
	cmd.Flags().DurationVar(&netgsmEvery, "netgsm-report-interval", 6*time.Second, "with NETGSM_USERCODE and NETGSM_PASSWORD: how often to ask Netgsm for reports (it answers 10 a minute); 0: never")
	cmd.Flags().DurationVar(&storeWait, "store-wait", receipts.DefaultStoreWait, "without a spool: how long a request whose receipts or refusals Postgres cannot take is held and tried again before it is answered 500; 0: at once")
	cmd.Flags().StringVar(&spoolDir, "spool-dir", a.defaultSpoolDir(), "where refusals and receipts wait that Postgres could not take, to be recorded when it is back (in a subdirectory per database; the default is under $XDG_STATE_HOME, else ~/.local/state); '': none (such a post is held for --store-wait, then answered 500)")
	cmd.Flags().StringVar(&authFile, "basic-auth-file", "", "file holding one line user:password (mode 600) that GET /stats takes from elsewhere than loopback (else $"+uiAuthEnv+")")
	return cmd
}

// webhooksPaths are the receipt routes by provider.
var webhooksPaths = map[string]string{"twilio": twilioReceiptPath, "twilio_inbound": twilioInboundPath, "sendgrid": sendgridReceiptPath}

// webhooksPublicURL validates --public-url and returns it without a trailing slash. No message quotes
// its credentials: a URL with any is refused (the endpoint checks the providers' signatures, not HTTP
// authentication, and a password in it would end up in the logs), and every quote goes through redact.
func webhooksPublicURL(name, raw string) (string, error) {
	const want = "give scheme://host[:port] and any path prefix the proxy strips, e.g. https://hooks.example.com"
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return "", usagef("%s %s is not a valid URL: %s", name, redact(raw), want)
	case u.Scheme != "http" && u.Scheme != "https" || u.Host == "" || u.Opaque != "":
		return "", usagef("%s %s: %s", name, redact(raw), want)
	case u.User != nil:
		return "", usagef("%s %s holds a user name or password: the providers' signatures are what this endpoint checks, and a password in the URL would end up in the logs; %s",
			name, redact(raw), want)
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		bare := *u // a query may hold a token too: it is not quoted
		bare.RawQuery, bare.ForceQuery, bare.Fragment = "", false, ""
		return "", usagef("%s %s?… has a query or fragment: the receipt paths (%s, %s) are appended to it; %s",
			name, redact(bare.String()), twilioReceiptPath, sendgridReceiptPath, want)
	}
	return strings.TrimSuffix(raw, "/"), nil
}

// webhooksServer is the receipts server, with the limits above.
func webhooksServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: webhooksReadHeaderTimeout,
		ReadTimeout:       webhooksReadTimeout,
		WriteTimeout:      webhooksWriteTimeout,
		IdleTimeout:       webhooksIdleTimeout,
		MaxHeaderBytes:    webhooksMaxHeaderBytes,
	}
}

// webhooksMux routes the receipts of each handler, the extra routes (pattern → handler: the unsubscribe
// links, whose POST bodies are read within a few seconds), GET /stats (loopback, or with creds) and GET
// /healthz. GET /stats holds the handlers' counts and those of the pollers (polled: name → their Stats).
func webhooksMux(handlers map[string]*receipts.Handler, creds *basicAuth, log *slog.Logger, extra map[string]http.Handler, polled map[string]func() receipts.Stats) http.Handler {
	mux := http.NewServeMux()
	receiptRoutes := map[string]bool{}
	for name, h := range handlers {
		mux.Handle("POST "+webhooksPaths[name], h)
		receiptRoutes["POST "+webhooksPaths[name]] = true
	}
	extraRoutes := map[string]bool{}
	for pattern, h := range extra {
		mux.Handle(pattern, h)
		extraRoutes[pattern] = true
	}
	mux.Handle("GET /stats", statsAccess(creds, log, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		stats := map[string]receipts.Stats{}
		for name, h := range handlers {
			stats[name] = h.Stats()
		}
		for name, f := range polled {
			stats[name] = f()
		}
		writeJSONResponse(w, stats)
	})))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n") //nolint:errcheck // the client went away
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, pattern := mux.Handler(r)
		if extraRoutes[pattern] && r.ContentLength != 0 {
			// A one-click POST is a few bytes: it comes at once or not at all.
			http.NewResponseController(w).SetReadDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck // not a real server
		} else if !receiptRoutes[pattern] && r.ContentLength != 0 {
			// Only the receipts read a body (at a pace of their own): elsewhere the server does not wait
			// for one either, and answers at once.
			http.NewResponseController(w).SetReadDeadline(time.Now()) //nolint:errcheck // not a real server
		}
		mux.ServeHTTP(w, r)
	})
}

// statsAccess serves next to a request from loopback (see fromLoopback) or one with creds; it answers
// others 401 with a challenge when there are credentials to give, else 403 saying how to read it.
func statsAccess(creds *basicAuth, log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var wrong bool
		if creds != nil {
			var ok bool
			if ok, wrong = creds.allows(r); ok {
				next.ServeHTTP(w, r)
				return
			}
		}
		if fromLoopback(r) {
			next.ServeHTTP(w, r)
			return
		}
		if creds == nil {
			http.Error(w, "403 Forbidden: /stats answers only on this machine (curl http://127.0.0.1:PORT/stats there); to read it from elsewhere, start campaignctl webhooks with --basic-auth-file FILE or "+uiAuthEnv+"=user:password",
				http.StatusForbidden)
			return
		}
		if wrong {
			log.Warn("wrong credentials", "realm", webhooksRealm, "remote", r.RemoteAddr, "path", r.URL.Path)
		}
		challenge(w, webhooksRealm, "/stats needs the user name and password of --basic-auth-file or "+uiAuthEnv)
	})
}

// byteSize writes a power-of-two size for help texts: "16 KiB", "2 MiB".
func byteSize(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

func writeJSONResponse(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v) //nolint:errcheck // the client went away
}

// deliveryBatcher writes the receipts of many concurrent requests in one statement (group commit): Twilio
// posts one callback per message and status, thousands a second during a campaign, and one statement per
// callback would queue them up behind the connection pool. Each request still answers only after its
// receipts are committed, so the provider retries whatever failed.
type deliveryBatcher struct {
	store *campaign.Store
	in    chan deliveryRequest
	log   *slog.Logger // nil: no warning of second messages
}

type deliveryRequest struct {
	ds   []campaign.Delivery
	done chan deliveryResult
}

// deliveryResult is what became of one request's receipts: the positions of those that named no
// recipient and of those kept until their send is recorded, or the statement's error.
type deliveryResult struct {
	receipts.Matched
	err error
}

// batchedDeliveries is the webhooks' receipts.MatchingSink: receipts go through the batcher.
type batchedDeliveries struct {
	batcher *deliveryBatcher
}

func (d *batchedDeliveries) Record(ctx context.Context, rs []receipts.Receipt) error {
	_, err := d.RecordMatched(ctx, rs)
	return err
}

func (d *batchedDeliveries) RecordMatched(ctx context.Context, rs []receipts.Receipt) (receipts.Matched, error) {
	ds := make([]campaign.Delivery, len(rs))
	for i, r := range rs {
		ds[i] = campaign.Delivery{Provider: r.Provider, MessageID: r.MessageID, CampaignID: r.CampaignID, UserID: r.UserID, CampaignNonce: r.CampaignNonce,
			Address: r.Address, Status: r.Status, Error: r.Error, EventID: r.EventID, At: r.At}
	}
	m, err := d.batcher.record(ctx, ds)
	return m, refusedForGood(err)
}

// maxDeliveryBatch bounds one statement.
const maxDeliveryBatch = 2000

func newDeliveryBatcher(store *campaign.Store) *deliveryBatcher {
	return &deliveryBatcher{store: store, in: make(chan deliveryRequest, 1024)}
}

// record writes ds with other requests' receipts and returns the positions in ds of those that named no
// recipient, and of those kept until their send is recorded.
func (b *deliveryBatcher) record(ctx context.Context, ds []campaign.Delivery) (receipts.Matched, error) {
	req := deliveryRequest{ds: ds, done: make(chan deliveryResult, 1)}
	select {
	case b.in <- req:
	case <-ctx.Done():
		return receipts.Matched{}, ctx.Err()
	}
	select {
	case res := <-req.done:
		return res.Matched, res.err
	case <-ctx.Done():
		return receipts.Matched{}, ctx.Err()
	}
}

// run collects whatever requests are waiting (at most maxDeliveryBatch receipts) and writes them together;
// while one statement runs, the next batch gathers.
func (b *deliveryBatcher) run(ctx context.Context) {
	for {
		var first deliveryRequest
		select {
		case first = <-b.in:
		case <-ctx.Done():
			return
		}
		batch := []deliveryRequest{first}
		n := len(first.ds)
	gather:
		for n < maxDeliveryBatch {
			select {
			case r := <-b.in:
				batch = append(batch, r)
				n += len(r.ds)
			default:
				break gather
			}
		}
		results := b.write(ctx, batch, n)
		if len(batch) > 1 && results[0].err != nil {
			// One request's receipts must not fail another's: the statement failed for all of them, so
			// each is written alone, and only the one at fault (or all, when Postgres is down) fails.
			for i := range batch {
				results[i] = b.write(ctx, batch[i:i+1], len(batch[i].ds))[0]
			}
		}
		for i, r := range batch {
			r.done <- results[i]
		}
	}
}

// write records the receipts of batch (n in all) in one statement and returns each request's result: the
// positions among its own receipts that named no recipient, or the statement's error.
func (b *deliveryBatcher) write(ctx context.Context, batch []deliveryRequest, n int) []deliveryResult {
	all := make([]campaign.Delivery, 0, n)
	for _, r := range batch {
		all = append(all, r.ds...)
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	applied, err := b.store.RecordDeliveries(wctx, all)
	cancel()
	if applied.SecondSends > 0 && b.log != nil {
		b.log.Warn("receipts proved second messages: recipients sent again by resume --resend-unknown had got their first message too (audited in send_log)",
			"second_messages", applied.SecondSends)
	}
	results := make([]deliveryResult, len(batch))
	for i := range results {
		results[i].err = err
	}
	for _, each := range []struct {
		in  []int
		out func(r *deliveryResult) *[]int
	}{
		{applied.Unmatched, func(r *deliveryResult) *[]int { return &r.Unmatched }},
		{applied.Early, func(r *deliveryResult) *[]int { return &r.Early }},
	} {
		start, req := 0, 0
		for _, u := range each.in {
			for u >= start+len(batch[req].ds) {
				start += len(batch[req].ds)
				req++
			}
			p := each.out(&results[req])
			*p = append(*p, u-start)
		}
	}
	return results
}

// netgsmReportWindow is how far back the messages whose Netgsm reports are asked for were sent.
const netgsmReportWindow = 72 * time.Hour

// netgsmReporter is the client of Netgsm's report API when NETGSM_USERCODE and NETGSM_PASSWORD are set
// and every is not zero; nil otherwise.
func (a *app) netgsmReporter(every time.Duration) (*netgsm.Provider, error) {
	user, pass := a.getenv("NETGSM_USERCODE"), a.getenv("NETGSM_PASSWORD")
	if every == 0 || (user == "" && pass == "") {
		return nil, nil
	}
	p, err := netgsm.NewReporter(netgsm.Config{UserCode: user, Password: pass, BaseURL: a.getenv("NETGSM_BASE_URL")})
	if err != nil {
		return nil, usageError{err}
	}
	return p, nil
}

// netgsmPoller asks reporter about the messages store says are due a report, into deliveries (the
// webhooks' receipts) and, for İYS's refusals, the consents.
func netgsmPoller(reporter receipts.NetgsmReporter, store *campaign.Store, deliveries receipts.Sink, every time.Duration, log *slog.Logger) *receipts.NetgsmPoller {
	return &receipts.NetgsmPoller{
		Reporter: reporter,
		Due: func(ctx context.Context, afterCampaign int64, afterUser string, limit int) ([]receipts.DueMessage, error) {
			ds, err := store.ReportsDue(ctx, "netgsm", time.Now().Add(-netgsmReportWindow), afterCampaign, afterUser, limit)
			out := make([]receipts.DueMessage, len(ds))
			for i, d := range ds {
				out[i] = receipts.DueMessage(d) // the same fields: the store's row, in the receipts' terms
			}
			return out, err
		},
		Sink: deliveries,
		NoConsent: func(ctx context.Context, id int64, ns []receipts.NoConsent) error {
			c, err := store.Get(ctx, id)
			if err != nil {
				return err
			}
			rs := make([]campaign.ProviderRefusal, len(ns))
			for i, n := range ns {
				rs[i] = campaign.ProviderRefusal{Addr: n.Address, Source: n.Evidence, At: n.At}
			}
			revoked, err := store.ProviderNoConsents(ctx, c, rs)
			if err != nil {
				return err
			}
			// A number whose consent was given again after its send keeps it (revoked counts fewer).
			log.Warn("netgsm reports: İYS held no consent for numbers Netgsm was asked to send to; the consents stored from before those sends turned RET here",
				"campaign_id", id, "numbers", len(ns), "consents_revoked", revoked)
			return nil
		},
		Every:       every,
		Idle:        time.Minute,
		GiveUpAfter: 3,
		Log:         log,
	}
}

// netgsmPollLock is the session advisory lock held by the one webhooks process that polls Netgsm's reports.
const netgsmPollLock = 0x6e657467 // "netg"

// pollAlone runs poll while this process holds the session advisory lock key, on a connection of its
// own (not one of pool's, which poll needs), so that of several webhooks processes on one database
// (replicas) one asks Netgsm at a time: the account answers 10 report queries a minute in all. The others
// try for the lock every retry; when the holder dies, or its connection does (Postgres restarted), its
// session ends and the lock with it, and the next try anywhere takes over, 2 × check after it took the
// lock (the old holder's poll's context is cancelled once its connection stops answering a check, every
// check, within check), so that two never poll at once. A holder whose poll gives up (its rounds keep
// failing: its address is not on the account's allow-list, say) lets go, and tries again only after
// 5 × retry, so that another process can take over.
func pollAlone(ctx context.Context, pool *pgxpool.Pool, poll func(context.Context) (gaveUp bool), key int64, retry, check time.Duration, log *slog.Logger) {
	for {
		wait := retry
		held, gaveUp, err := holdAndRun(ctx, pool, poll, key, check, func() {
			log.Info("netgsm reports: this process polls them (it holds the lock)")
		})
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			log.Warn("netgsm reports: cannot take the lock that lets one webhooks process poll them", "err", err, "retry_in", retry.String())
		case gaveUp:
			wait = 5 * retry
			log.Warn("netgsm reports: the rounds keep failing here; another webhooks process may poll them", "retry_in", wait.String())
		case held:
			log.Warn("netgsm reports: lost the lock (its connection to Postgres failed); polling stopped here", "retry_in", retry.String())
		default:
			log.Debug("netgsm reports: another webhooks process polls them", "retry_in", retry.String())
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// holdAndRun takes the lock on a connection of its own and runs poll until ctx is done, poll gives up or
// the connection fails; it reports whether it held the lock and whether poll gave up. took is called once
// the lock is held.
func holdAndRun(ctx context.Context, pool *pgxpool.Pool, poll func(context.Context) bool, key int64, check time.Duration, took func()) (held, gaveUp bool, err error) {
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if err != nil {
		return false, false, err
	}
	// The session's end releases the lock: closing the connection says so whatever state it is in.
	defer conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck // a dead connection is closed already
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&held); err != nil || !held {
		return false, false, err
	}
	took()
	// A holder whose session ended keeps polling until its next check fails: let it notice first.
	select {
	case <-ctx.Done():
		return true, false, nil
	case <-time.After(2 * check):
	}
	runCtx, cancel := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			select {
			case <-runCtx.Done():
				return
			case <-time.After(check):
			}
			ping, done := context.WithTimeout(runCtx, check)
			err := conn.Ping(ping)
			done()
			if err != nil && runCtx.Err() == nil {
				cancel()
				return
			}
		}
	}()
	gaveUp = poll(runCtx)
	cancel()
	<-watched
	return true, gaveUp, nil
}

// earlyReceiptsEvery is how often webhooks applies again the receipts that came before their sends were
// recorded.
const earlyReceiptsEvery = 2 * time.Second

// retryEarlyReceipts applies, every every, the receipts that named only a message ID no recorded send
// carried when they came (campaign.Store.RetryEarlyReceipts): the worker records its chunk's sends after
// the provider's answers, and a receipt may come first. Those that no send carries after
// campaign.EarlyReceiptsKept are dropped as strays.
//
// A round reads each kept receipt's message ID in the audit's index: with a callback on a provider account
// that other senders use too, their receipts wait here as well, by the thousand. The pause after a round
// is at least four times the round's own time, so that such rounds take at most a fifth of a Postgres
// backend.
func retryEarlyReceipts(ctx context.Context, store *campaign.Store, every time.Duration, log *slog.Logger) {
	failing := false
	var took time.Duration
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(max(every, 4*took)):
		}
		began := time.Now()
		res, err := store.RetryEarlyReceipts(ctx, 5000, campaign.EarlyReceiptsKept)
		took = time.Since(began)
		switch {
		case err != nil && ctx.Err() == nil:
			if !failing {
				log.Warn("receipts that came before their sends were recorded cannot be applied yet; trying again", "err", err)
			}
			failing = true
			continue
		case err != nil:
			return
		}
		failing = false
		if res.Applied > 0 {
			log.Info("receipts that came before their sends were recorded applied", "receipts", res.Applied, "waiting", res.Waiting)
		}
		if res.Dropped > 0 {
			log.Warn("receipts that named no message sent by this engine for "+campaign.EarlyReceiptsKept.String()+" dropped", "receipts", res.Dropped)
		}
	}
}
