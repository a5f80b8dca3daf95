package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
	"github.com/campaignctl/campaignctl/providers/twilio"
	"github.com/campaignctl/campaignctl/supervisor"
	"github.com/campaignctl/campaignctl/worker"
)

// maxWorkerProcesses bounds --max: a typo such as --max 5000 should not fork-bomb the machine.
const maxWorkerProcesses = 1000

type workersOptions struct {
	min, max int
	interval time.Duration
	cooldown time.Duration
	// hungAfter: a worker with no heartbeat for this long is killed and replaced (0: never).
	hungAfter time.Duration
	worker    workerOptions
	// extra are worker flags given after "--", passed through as they are.
	extra []string
}

func (o *workersOptions) validate() error {
	switch {
	case o.min < 0:
		return usagef("--min %d: give 0 or more worker processes, e.g. --min 1", o.min)
	case o.max < 1:
		return usagef("--max %d: give 1 or more worker processes, e.g. --max 8", o.max)
	case o.max > maxWorkerProcesses:
		return usagef("--max %d: at most %d worker processes on one machine; run more machines for more", o.max, maxWorkerProcesses)
	case o.min > o.max:
		return usagef("--min %d is above --max %d: give --min ≤ --max, e.g. --min 1 --max 8", o.min, o.max)
	case o.interval <= 0:
		return usagef("--interval %v: give a positive duration, e.g. --interval 5s", o.interval)
	case o.cooldown < 0:
		return usagef("--cooldown %v: give zero or more, e.g. --cooldown 30s", o.cooldown)
	case o.hungAfter < 0 || o.hungAfter > 0 && o.hungAfter < 2*state.WorkerTTL:
		return usagef("--hung-after %v: give 0 (never) or %v or more (a worker's heartbeat lives %v), e.g. --hung-after 1m", o.hungAfter, 2*state.WorkerTTL, state.WorkerTTL)
	}
	for _, arg := range o.extra {
		for _, flag := range []string{"--metrics-addr", "--pprof-addr"} {
			if (arg == flag || strings.HasPrefix(arg, flag+"=")) && o.max > 1 {
				return usagef("%s after --: every worker would listen on the same address and all but one would fail; run workers with %s each under its own supervisor or process manager, or use --max 1", flag, flag)
			}
		}
	}
	return o.worker.validate()
}

func (a *app) newWorkersCmd() *cobra.Command {
	// The workers' --record-wait is theirs alone (give it after --): the supervisor checks their flags
	// with its default.
	o := workersOptions{worker: workerOptions{recordWait: worker.DefaultRecordWait}}
	cmd := &cobra.Command{
		Use:   "workers --min N --max M [flags] [-- worker flags]",
		Short: "Run worker processes and scale them with the backlog and the rate caps",
		Long: `Run between --min and --max worker processes (campaignctl worker, this same binary, with the same
environment) and scale them with the batch queue. Their output goes to this command's stdout and stderr
as it is.

Every --interval the supervisor reads the queue (Asynq's pending, active, and scheduled or retrying tasks
due within two intervals, and its latency) and the running campaigns' rate caps, and sizes the pool:

  backlog    = pending + active + due
  need       = ceil(backlog / --concurrency)    a slot for every batch ready now
  rate_limit = the workers running now           when the campaigns send at 90 % of their caps or more
             = ceil(rate_cap / per_worker)       otherwise, once a worker's rate has been seen
  wanted     = min(need, rate_limit), clamped to [--min, --max]

rate_cap is, per provider, the lower of its cap (TWILIO_RATE, SENDGRID_RATE, FCM_RATE, WEBHOOK_RATE) and
the sum of its running campaigns' --rate, summed over the providers; per_worker is the messages per second
one worker sent while every slot was busy. More workers than the caps let send would only wait for
tokens.

Supervisors on the same queue (one a machine) count each other in Redis at every look, and each keeps
its share: need and rate_limit divided by the number of supervisors, rounded up; --min and --max stay
each one's own. One that stops (SIGTERM) leaves at once; one that is killed or cut off from Redis stops
counting after three intervals (at least 15s), and the others take its share.

It scales up at once. It scales down one worker at a time, once fewer have been enough for --cooldown
(and --cooldown after the last change) and no pending batch has waited 5s or more, with SIGTERM: the
worker finishes the send in flight and hands its batches back within --shutdown-timeout, and is
SIGKILLed only 10s after that. A worker that exits by itself is started again (after 1s, doubling up to
30s while workers keep dying young); one that exits with status 2 (bad flag or configuration) stops the
supervisor. A worker that has sent no heartbeat for --hung-after (frozen by SIGSTOP or a paused
container, hung, cut off from Redis while the supervisor is not) is killed at once and another started
in its place: it sent nothing but counted as running. SIGTERM or Ctrl-C stops every worker the same
graceful way, then the supervisor exits 0.

Each decision is logged with its figures and a reason (backlog, max, rate_cap, idle, backlog_shrank,
cooldown, min, queue_paused, tasks_waiting). Worker flags this command does not have go after --, as
they are.`,
		Example: `  campaignctl workers --min 1 --max 8
  campaignctl workers --min 2 --max 16 --concurrency 8 --cooldown 1m
  campaignctl workers --min 0 --max 4 --provider-timeout 5s --interval 2s
  TWILIO_RATE=50 campaignctl workers --min 1 --max 4 --log-level debug     # every hold logged too`,
		Args: func(cmd *cobra.Command, args []string) error {
			if dash := cmd.ArgsLenAtDash(); dash > 0 || (dash < 0 && len(args) > 0) {
				return usagef("workers takes no arguments; give worker flags after --, e.g. campaignctl workers --max 4 -- --provider-timeout 5s")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			o.extra = args
			if err := o.validate(); err != nil {
				return err
			}
			return a.workers(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.min, "min", 1, "fewest worker processes, kept even when the queue is empty")
	f.IntVar(&o.max, "max", 4, "most worker processes")
	f.DurationVar(&o.interval, "interval", 5*time.Second, "how often the queue is read and the pool sized")
	f.DurationVar(&o.cooldown, "cooldown", 30*time.Second, "how long fewer workers must be enough before one is stopped")
	f.DurationVar(&o.hungAfter, "hung-after", time.Minute, "kill and replace a worker that has sent no heartbeat for this long (they beat every 10s); 0: never")
	f.IntVar(&o.worker.concurrency, "concurrency", 16, "batches each worker sends at once (the worker's --concurrency)")
	f.DurationVar(&o.worker.timeout, "provider-timeout", twilio.DefaultTimeout, "the workers' --provider-timeout")
	f.DurationVar(&o.worker.shutdown, "shutdown-timeout", 30*time.Second, "the workers' --shutdown-timeout; a stopped worker still running 10s past it is SIGKILLed")
	return cmd
}

// workers runs the supervisor until ctx is done.
func (a *app) workers(ctx context.Context, o workersOptions) error {
	// The workers would refuse to start without a provider: say so once, now, with the fix.
	if _, err := a.providers(sendOpts{timeout: o.worker.timeout}); err != nil {
		return err
	}
	caps, inSegments := map[string]float64{}, map[string]bool{}
	for _, ch := range campaign.Channels() {
		r, segments, err := a.channelRate(ch.Name)
		if err != nil {
			return err
		}
		caps[string(ch.Name)], inSegments[string(ch.Name)] = r, segments
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("cannot find this program to start workers: %w", err)
	}
	svc, err := a.openServices(ctx, 0)
	if err != nil {
		return err
	}
	defer svc.Close()

	// The supervisor's log lines and the workers' output share stderr.
	stderr := supervisor.LockWriter(a.stderr)
	la := *a
	la.stderr = stderr
	log := la.logger().With("component", "supervisor")

	// Supervisors on one queue (one a machine) each keep their share of the pool; one that stops looking
	// for three intervals no longer counts.
	obs := &worker.QueueObserver{
		Store:          svc.store,
		Redis:          svc.redis,
		Caps:           caps,
		CapsInSegments: inSegments,
		Lookahead:      2 * o.interval,
		DueLimit:       o.max * o.worker.concurrency,
		Name:           state.LocalOwner() + ":" + state.Token()[:8],
		Alive:          3 * max(o.interval, 5*time.Second),
		JoinWait:       time.Second,
	}
	sup := supervisor.New(supervisor.Config{
		Policy:          supervisor.Policy{Min: o.min, Max: o.max, Concurrency: o.worker.concurrency, Cooldown: o.cooldown},
		Interval:        o.interval,
		ShutdownTimeout: o.worker.shutdown,
		HungAfter:       hungAfter(o.hungAfter),
		Path:            exe,
		Args:            a.workerArgs(o),
		Env:             a.workerEnv(),
		Stdout:          a.stdout,
		Stderr:          stderr,
		Observer:        obs,
		Logger:          log,
	})
	err = sup.Run(ctx)
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if lerr := obs.Leave(lctx); lerr != nil {
		log.Warn("not taken out of the supervisors on the queue; the others take its share once its last look is older than "+obs.Alive.String(), "err", lerr)
	}
	if errors.Is(err, supervisor.ErrWorkerUsage) {
		return usageError{fmt.Errorf("%w; fix what its message above says, then start the supervisor again", err)}
	}
	return err
}

// workerArgs is the worker command line: the flags the supervisor knows, then those after "--". No
// secret goes here (a command line is visible to every user of the machine): URLs go in the environment.
func (a *app) workerArgs(o workersOptions) []string {
	args := []string{"worker",
		"--log-level", a.logLevel,
		"--concurrency", strconv.Itoa(o.worker.concurrency),
		"--provider-timeout", o.worker.timeout.String(),
		"--shutdown-timeout", o.worker.shutdown.String(),
	}
	return append(args, o.extra...)
}

// workerEnv is the supervisor's environment, with the URLs given as flags turned into the variables the
// workers read (the last value of a variable wins).
func (a *app) workerEnv() []string {
	env := os.Environ()
	if a.databaseURL != "" {
		env = append(env, "DATABASE_URL="+a.databaseURL)
	}
	if a.redisURL != "" {
		env = append(env, "REDIS_URL="+a.redisURL)
	}
	if a.audienceURL != "" {
		env = append(env, "AUDIENCE_DATABASE_URL="+a.audienceURL)
	}
	return env
}

// hungAfter is the supervisor's HungAfter for --hung-after: the time a worker's heartbeat has been gone from
// Redis, which is its time without a beat less the heartbeat's life (state.WorkerTTL). 0 (never) is
// negative there.
func hungAfter(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d - state.WorkerTTL
}
