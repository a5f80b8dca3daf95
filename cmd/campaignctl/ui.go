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

	"github.com/hibiken/asynqmon"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/campaignctl/campaignctl/worker"
)

// uiRealm is the realm of the UI's Basic auth challenge.
const uiRealm = "campaignctl ui"

func (a *app) newUICmd() *cobra.Command {
	var addr, authFile, prometheusAddr string
	var readOnly bool
	cmd := &cobra.Command{
		Use:   "ui",
		Short: "Serve the Asynq web UI (asynqmon) for the campaign queues, and campaign pages at /campaigns",
		Long: `Serve the Asynq web UI (asynqmon, built in: no Node.js, no npm) on the Redis of REDIS_URL/--redis-url:
queues, pending, scheduled, retrying and archived (dead-letter) batches, workers and Redis itself. A campaign
batch shows as "campaign 42, batch 7".

It listens on loopback (127.0.0.1:8080) by default. asynqmon has no login of its own and can delete, run
and archive tasks, so any other address (0.0.0.0, a LAN IP, a host name other than localhost) needs
credentials, from either
  --basic-auth-file FILE   one line user:password; the file must not be readable by other users (chmod 600)
  ` + uiAuthEnv + `      user:password (the file wins when both are given)
With credentials, every request (on loopback too) needs HTTP Basic auth. Without them, the loopback UI
answers only to the host names localhost, 127.0.0.1 and ::1 (no DNS rebinding). Cross-site requests that
change anything are refused in every mode.

/campaigns lists the campaigns (progress, outcomes, rate, ETA, what each waits on) from the engine database
(DATABASE_URL, opened on the first visit); /campaigns/ID shows one, with its sends per second and its
batches in the queue, and pause, resume and cancel buttons (the commands of the same names).

--read-only hides the buttons and refuses every request that would change a queue or a task (405), or a
campaign (403).
--prometheus-addr turns on asynqmon's metrics view: the Prometheus server that scrapes the workers'
--metrics-addr (no user name or password: the pages show the address). The UI stops gracefully on SIGINT or SIGTERM.`,
		Example: `  campaignctl ui                                   # http://127.0.0.1:8080/, this machine only
  campaignctl ui --read-only --addr 127.0.0.1:9000

  # from your laptop, through SSH (then open http://127.0.0.1:8080/)
  ssh -L 8080:127.0.0.1:8080 ops@queue-host campaignctl ui

  # on the network: credentials first
  (umask 077; printf 'ops:%s\n' "$(openssl rand -base64 24)" > /etc/campaignctl/ui.auth)
  campaignctl ui --addr 0.0.0.0:8080 --basic-auth-file /etc/campaignctl/ui.auth --read-only
  ` + uiAuthEnv + `="ops:$UI_PASSWORD" campaignctl ui --addr 10.0.0.5:8080

  # with the metrics view
  campaignctl ui --prometheus-addr http://prometheus.monitoring:9090`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			host, err := checkListenAddr(addr, "127.0.0.1:8080 (this machine only) or 0.0.0.0:8080 (every interface, with credentials)")
			if err != nil {
				return err
			}
			promURL, err := uiCheckPrometheus(prometheusAddr)
			if err != nil {
				return err
			}
			creds, err := a.basicAuthFrom(authFile)
			if err != nil {
				return err
			}
			loopback := isLoopbackHost(host)
			if !loopback && creds == nil {
				return usagef("--addr %s is not a loopback address and asynqmon has no login of its own: give credentials with --basic-auth-file FILE (one line user:password, chmod 600) or %s=user:password, or listen on 127.0.0.1",
					addr, uiAuthEnv)
			}

			// The same Redis as every other command, checked before anything is served.
			rdb, err := a.openRedis(ctx)
			if err != nil {
				return err
			}
			defer rdb.Close()
			ropt := *rdb.Options()

			mon := asynqmon.New(asynqmon.Options{
				RootPath:          "/",
				RedisConnOpt:      uiRedisOpt{opt: ropt},
				PayloadFormatter:  uiPayloadFormatter,
				PrometheusAddress: promURL,
				ReadOnly:          readOnly,
			})
			defer mon.Close()

			log := a.logger()
			// The campaign pages share the server, so the cross-origin check and the credentials below
			// guard them as they guard asynqmon, which keeps every other path.
			camp := &uiCampaigns{open: a.openEngine, redis: rdb, readOnly: readOnly, log: log}
			defer camp.Close()
			mux := http.NewServeMux()
			mux.Handle("/", mon)
			camp.register(mux)
			var h http.Handler = http.NewCrossOriginProtection().Handler(mux)
			if creds != nil {
				h = creds.require(uiRealm, "this UI needs its user name and password", h, log)
			} else {
				h = uiLocalHostOnly(h)
			}

			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return usagef("--addr %s: %v", addr, err)
			}
			srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
			stopped := make(chan struct{})
			go func() {
				defer close(stopped)
				<-ctx.Done()
				shut, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				srv.Shutdown(shut) //nolint:errcheck // best effort on the way out
			}()

			var notes []string
			if !loopback {
				notes = append(notes, "reachable from the network")
			}
			if creds != nil {
				notes = append(notes, fmt.Sprintf("basic auth as %q from %s", creds.user, creds.source))
			}
			if readOnly {
				notes = append(notes, "read-only")
			}
			if promURL != "" {
				notes = append(notes, "metrics from "+redact(promURL))
			}
			line := fmt.Sprintf("Asynq web UI at http://%s/ and campaigns at http://%s/campaigns (Redis %s)", ln.Addr(), ln.Addr(), ropt.Addr)
			if len(notes) > 0 {
				line += "; " + strings.Join(notes, ", ")
			}
			fmt.Fprintln(a.stderr, line)

			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			<-stopped
			fmt.Fprintln(a.stderr, "Asynq web UI stopped")
			return nil
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:8080", "listen address host:port; anything but loopback needs credentials")
	cmd.Flags().BoolVar(&readOnly, "read-only", false, "view only: no pausing, deleting, running or archiving")
	cmd.Flags().StringVar(&authFile, "basic-auth-file", "", "file holding one line user:password (mode 600): every request must log in with it (else $"+uiAuthEnv+")")
	cmd.Flags().StringVar(&prometheusAddr, "prometheus-addr", "", "Prometheus server URL for the metrics view, e.g. http://127.0.0.1:9090")
	return cmd
}

// uiCheckPrometheus validates --prometheus-addr: an http(s) URL with a host, returned without a trailing
// slash (asynqmon appends /api/v1/...).
func uiCheckPrometheus(raw string) (string, error) {
	if raw == "" {
		return "", nil
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return "", usagef("--prometheus-addr %q: give the Prometheus server's base URL, e.g. http://127.0.0.1:9090", redact(raw))
	}
	if u.User != nil {
		// asynqmon writes the address into every page it serves, for every viewer to read.
		return "", usagef("--prometheus-addr %q holds a user name or password, and asynqmon writes the address into every page it serves: give the URL of a Prometheus the UI reaches without credentials (in the cluster, or a local proxy that adds them), e.g. http://127.0.0.1:9090", redact(raw))
	}
	return strings.TrimSuffix(raw, "/"), nil
}

// uiRedisOpt hands asynqmon clients with the options of the Redis every other command uses (REDIS_URL or
// --redis-url). Each call makes a client of its own, which asynqmon closes.
type uiRedisOpt struct{ opt redis.Options }

func (o uiRedisOpt) MakeRedisClient() any {
	opt := o.opt
	return redis.NewClient(&opt)
}

// uiPayloadFormatter shows a campaign batch as "campaign 42, batch 7"; other payloads as asynqmon would.
var uiPayloadFormatter = asynqmon.PayloadFormatterFunc(func(taskType string, payload []byte) string {
	if taskType == worker.TaskBatch {
		var p struct {
			CampaignID *int64 `json:"campaign_id"`
			Batch      *int   `json:"batch"`
		}
		if err := json.Unmarshal(payload, &p); err == nil && p.CampaignID != nil && p.Batch != nil {
			return fmt.Sprintf("campaign %d, batch %d", *p.CampaignID, *p.Batch)
		}
	}
	return asynqmon.DefaultPayloadFormatter.FormatPayload(taskType, payload)
})

// uiLocalHostOnly refuses requests whose Host is not a loopback name, so that a web page on a name that
// resolves to 127.0.0.1 (DNS rebinding) cannot drive an unauthenticated loopback UI.
func uiLocalHostOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if !isLoopbackHost(host) {
			http.Error(w, fmt.Sprintf("403 Forbidden: without credentials this UI answers only to localhost, 127.0.0.1 or [::1], not to %q; open http://127.0.0.1:PORT/ or start it with --basic-auth-file", r.Host),
				http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}
