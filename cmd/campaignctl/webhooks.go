package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/providers/receipts"
)

// Receipt routes of `campaignctl webhooks`.
const (
	twilioReceiptPath   = "/twilio/status"
	sendgridReceiptPath = "/sendgrid/events"
)

func (a *app) newWebhooksCmd() *cobra.Command {
	var addr, publicURL string
	cmd := &cobra.Command{
		Use:   "webhooks",
		Short: "Receive delivery receipts (Twilio status callbacks, SendGrid's signed Event Webhook) and record them",
		Long: `Receive the providers' delivery receipts and record, per recipient, whether the message was delivered,
undelivered, bounced or dropped (campaignctl status shows accepted against delivered).

  POST ` + twilioReceiptPath + `     Twilio status callbacks, verified with X-Twilio-Signature and TWILIO_AUTH_TOKEN.
                         Workers ask for them when TWILIO_STATUS_CALLBACK is this URL.
  POST ` + sendgridReceiptPath + `   SendGrid's signed Event Webhook, verified with the ECDSA public key in
                         SENDGRID_WEBHOOK_PUBLIC_KEY (base64, from SendGrid's Mail Settings).
  GET  /stats            accepted and refused requests, by reason.

Unsigned, wrongly signed or (SendGrid) stale requests are refused with 403 and counted. Twilio signs the
URL it called: behind a proxy or tunnel, give that public URL with --public-url.`,
		Example: `  TWILIO_AUTH_TOKEN=... SENDGRID_WEBHOOK_PUBLIC_KEY=... campaignctl webhooks --addr 127.0.0.1:8090
  campaignctl webhooks --addr 0.0.0.0:8090 --public-url https://hooks.example.com`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if publicURL == "" {
				publicURL = "http://" + addr
			}
			if u, err := url.Parse(publicURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return usagef("--public-url %q: give the scheme and host the providers call, e.g. https://hooks.example.com", publicURL)
			}
			publicURL = strings.TrimSuffix(publicURL, "/")
			engine, err := a.openEngine(ctx)
			if err != nil {
				return err
			}
			defer engine.Close()
			store := campaign.NewStore(engine)
			log := a.logger()
			batcher := newDeliveryBatcher(store)
			go batcher.run(ctx)
			sink := receipts.SinkFunc(func(ctx context.Context, rs []receipts.Receipt) error {
				ds := make([]campaign.Delivery, len(rs))
				for i, r := range rs {
					ds[i] = campaign.Delivery{Provider: r.Provider, MessageID: r.MessageID, CampaignID: r.CampaignID, UserID: r.UserID,
						Status: r.Status, Error: r.Error, EventID: r.EventID, At: r.At}
				}
				return batcher.record(ctx, ds)
			})
			mux := http.NewServeMux()
			handlers := map[string]*receipts.Handler{}
			if token := a.getenv("TWILIO_AUTH_TOKEN"); token != "" {
				handlers["twilio"] = receipts.TwilioHandler(token, publicURL, sink, log)
				mux.Handle("POST "+twilioReceiptPath, handlers["twilio"])
			}
			if key := a.getenv("SENDGRID_WEBHOOK_PUBLIC_KEY"); key != "" {
				h, err := receipts.SendGridHandler(key, sink, log)
				if err != nil {
					return usagef("SENDGRID_WEBHOOK_PUBLIC_KEY is not a base64 ECDSA public key (%v); copy it from SendGrid's signed Event Webhook settings", err)
				}
				handlers["sendgrid"] = h
				mux.Handle("POST "+sendgridReceiptPath, h)
			}
			if len(handlers) == 0 {
				return usagef("no receipts to receive: set TWILIO_AUTH_TOKEN (Twilio status callbacks) and/or SENDGRID_WEBHOOK_PUBLIC_KEY (SendGrid events)")
			}
			mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) {
				stats := map[string]receipts.Stats{}
				for name, h := range handlers {
					stats[name] = h.Stats()
				}
				writeJSONResponse(w, stats)
			})
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return usagef("--addr %s: %v", addr, err)
			}
			srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
			go func() {
				<-ctx.Done()
				shut, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				srv.Shutdown(shut) //nolint:errcheck // best effort on the way out
			}()
			for name := range handlers {
				path := twilioReceiptPath
				if name == "sendgrid" {
					path = sendgridReceiptPath
				}
				fmt.Fprintf(a.stderr, "receiving %s receipts at %s%s\n", name, publicURL, path)
			}
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:8090", "listen address")
	cmd.Flags().StringVar(&publicURL, "public-url", "", "the URL the providers call (scheme://host[:port]), if not http://ADDR")
	return cmd
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
}

type deliveryRequest struct {
	ds   []campaign.Delivery
	done chan error
}

// maxDeliveryBatch bounds one statement.
const maxDeliveryBatch = 2000

func newDeliveryBatcher(store *campaign.Store) *deliveryBatcher {
	return &deliveryBatcher{store: store, in: make(chan deliveryRequest, 1024)}
}

func (b *deliveryBatcher) record(ctx context.Context, ds []campaign.Delivery) error {
	req := deliveryRequest{ds: ds, done: make(chan error, 1)}
	select {
	case b.in <- req:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
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
		all := make([]campaign.Delivery, 0, n)
		for _, r := range batch {
			all = append(all, r.ds...)
		}
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		_, err := b.store.RecordDeliveries(wctx, all)
		cancel()
		for _, r := range batch {
			r.done <- err
		}
	}
}
