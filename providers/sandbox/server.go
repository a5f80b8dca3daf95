package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"
)

// Options configure a Server. The zero value is a sandbox that accepts any well-formed credentials, adds
// no latency, injects no faults, has no rate limit and logs nothing.
type Options struct {
	// TwilioAccountSID and TwilioAuthToken are the credentials accepted. Empty means any alphanumeric pair
	// whose username equals the account SID in the path.
	TwilioAccountSID, TwilioAuthToken string
	// TwilioInboundURL receives the incoming SMS that POST /_sandbox/twilio/inbound makes up, as Twilio
	// posts them to a number's messaging URL, signed with TwilioAuthToken; empty means none can be sent.
	TwilioInboundURL string
	// Latency is added to every provider request (not to the control API).
	Latency time.Duration
	// Faults are injected into provider requests; change them later with SetFaults.
	Faults Faults
	// TwilioRate caps each account's requests per second; the excess gets a real 429 (code 20429).
	// 0 means no cap.
	TwilioRate float64
	// Logger receives one debug record per provider request; nil discards them.
	Logger *slog.Logger

	// NetgsmUserCode and NetgsmPassword are the Netgsm credentials accepted (Basic auth); both empty
	// means any non-empty pair.
	NetgsmUserCode, NetgsmPassword string
	// NetgsmPerNumber is how many messages one number takes from Netgsm within a minute of the first:
	// beyond it, Netgsm answers code 85 (Netgsm's own limit is 20). 0 means no limit.
	NetgsmPerNumber int
	// NetgsmReportsPerMinute is how many report queries (POST /sms/rest/v2/report) Netgsm answers in a
	// minute; beyond it, code 80. 0 means Netgsm's own 10; a negative number, no limit.
	NetgsmReportsPerMinute int

	// SendGridAPIKey is the API key accepted (Authorization: Bearer). Empty means any non-empty key.
	SendGridAPIKey string
	// SendGridRate caps each API key's mail/send requests per second; the excess gets a real 429. 0 = no cap.
	SendGridRate float64
	// SendGridEventURL receives the signed Event Webhook posts (processed, delivered, bounce, ...); empty
	// means none are sent.
	SendGridEventURL string

	// WebhookSecret is the HMAC secret the generic webhook receiver (POST /webhook) verifies; empty means
	// any signature is refused.
	WebhookSecret string

	// FCMRate caps each project's messages per second; the excess gets a real 429 QUOTA_EXCEEDED. 0 = no cap.
	FCMRate float64

	// Limits are the hidden limits per API, keyed by its name in APIs ("twilio", "netgsm", "sendgrid",
	// "fcm", "webhook"): the provider's 429 without Retry-After over a rate, a number of requests in
	// flight, or (Twilio) SMS segments a second. Change them later with SetLimits. New panics on an
	// entry ValidateLimits refuses.
	Limits map[string]Limit
	// Outages are outage windows, their After counted from New. Add more later with StartOutage. New
	// panics on a plan its Validate refuses.
	Outages []OutagePlan

	// ReceiptDelay is how long after acceptance delivery receipts (Twilio status callbacks, SendGrid
	// events) are sent. Default 200 ms.
	ReceiptDelay time.Duration

	// IYSUsername and IYSPassword are the İYS API credentials accepted; both empty means any non-empty pair.
	IYSUsername, IYSPassword string
	// IYSCode and IYSBrandCode are the service provider's and the brand's İYS numbers accepted in paths
	// (403 H353 for others); 0 means any.
	IYSCode, IYSBrandCode int64
	// IYSRate caps each client IP's İYS requests per second (İYS allows 10); the excess gets a real 429
	// H124. 0 = no cap.
	IYSRate float64
	// IYSTokenPerHour caps each client IP's İYS token requests per hour (429 H084). 0 = no cap.
	IYSTokenPerHour int
	// IYSTokenTTL and IYSRefreshTTL are the İYS access and refresh token lifetimes; 0 means İYS's 2 h and 4 h.
	IYSTokenTTL, IYSRefreshTTL time.Duration
	// IYSPullLag is how recent a consent change may be and still be left out of the İYS pull: 0 means İYS's
	// 1 h, a negative value lists changes at once.
	IYSPullLag time.Duration
	// IYSMultiStatusMax is the most recipients one İYS multi-status request may carry; 0 means 1000.
	IYSMultiStatusMax int
	// IYSNow is the İYS fake's clock (token expiry, the pull's window, change dates); nil means time.Now.
	IYSNow func() time.Time
}

// Server imitates the providers' HTTP APIs and records what they were asked to send. It is an
// http.Handler and is safe for concurrent use.
type Server struct {
	opts   Options
	logger *slog.Logger
	// conns counts the connections opened to the server (ConnState), since it started or was Reset.
	conns  atomic.Int64
	mux    *http.ServeMux
	faults atomic.Pointer[Faults]
	log    *messageLog
	twilio *rateLimiter
	// Per-provider state of the other fakes, set up by their route registration.
	sendgrid *sendgridState
	fcm      *fcmState
	receipts *receiptState
	inbound  *twilioInboundState
	netgsm   netgsmNumbers
	// netgsmJobs are the Netgsm jobs accepted, for its reports.
	netgsmJobs netgsmReports
	iys        *iysState
	// push holds the hidden limits, the outage windows and the timeline; epoch and now are the clock they
	// read.
	push  pushback
	epoch time.Time
	now   func() time.Time
}

// New returns a Server with the given options.
func New(opts Options) *Server {
	s := &Server{
		opts:   opts,
		logger: opts.Logger,
		mux:    http.NewServeMux(),
		log:    newMessageLog(),
		twilio: newRateLimiter(opts.TwilioRate),
		now:    time.Now,
	}
	s.epoch = s.now()
	if err := ValidateLimits(opts.Limits); err != nil {
		panic("sandbox: Options.Limits: " + err.Error())
	}
	var limits [numAPIs]Limit
	for name, l := range opts.Limits {
		a, _ := apiNamed(name)
		limits[a] = l
	}
	s.push.limits.Store(&limits)
	for _, p := range opts.Outages {
		if _, err := s.push.outages.add(p, s.epoch); err != nil {
			panic("sandbox: Options.Outages: " + err.Error())
		}
	}
	if s.logger == nil {
		s.logger = slog.New(slog.DiscardHandler)
	}
	s.SetFaults(opts.Faults)
	if s.opts.ReceiptDelay == 0 {
		s.opts.ReceiptDelay = 200 * time.Millisecond
	}
	s.controlRoutes()
	s.twilioRoutes()
	s.netgsmRoutes()
	s.sendgridRoutes()
	s.fcmRoutes()
	s.receiptRoutes()
	s.iysRoutes()
	return s
}

// ServeHTTP serves the provider APIs and the /_sandbox/ control API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mux.ServeHTTP(w, r)
}

// Messages returns every message accepted since the start or the last Reset, in the order accepted.
func (s *Server) Messages() []Message {
	return s.log.list("")
}

// SetFaults replaces the injected faults. Rates outside 0..1 are clamped.
func (s *Server) SetFaults(f Faults) {
	clamp := func(v *float64) {
		if !(*v >= 0) { // negative or NaN
			*v = 0
		}
		*v = min(*v, 1)
	}
	for _, v := range []*float64{&f.Rate429, &f.Rate500, &f.Rate503, &f.RateRaw503, &f.RateTimeout, &f.RateReset} {
		clamp(v)
	}
	s.faults.Store(&f)
}

// Stats returns the counters since the start or the last Reset, and the outage windows.
func (s *Server) Stats() Stats {
	st := s.log.snapshot()
	st.Connections = s.conns.Load()
	if ws := s.Outages(); len(ws) > 0 {
		st.Outages = ws
	}
	return st
}

// Reset clears the message log, the stats, the timeline and the rate buckets and windows. Faults,
// limits and outage windows stay as they are.
func (s *Server) Reset() {
	s.log.reset()
	s.conns.Store(0)
	s.twilio.reset()
	s.sendgrid.limiter.reset()
	s.sendgrid.sent.reset()
	s.ResetFCM()
	s.push.timeline.reset()
	for a := range s.push.rate {
		s.push.rate[a].reset()
	}
	s.push.segments.reset()
	s.netgsmJobs.reset()
}

func (s *Server) controlRoutes() {
	s.mux.HandleFunc("GET /_sandbox/messages", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.log.list(r.URL.Query().Get("to")))
	})
	s.mux.HandleFunc("GET /_sandbox/stats", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.Stats())
	})
	s.mux.HandleFunc("GET /_sandbox/faults", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.faults.Load())
	})
	s.mux.HandleFunc("POST /_sandbox/faults", func(w http.ResponseWriter, r *http.Request) {
		var f Faults
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&f); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "decode faults: " + err.Error()})
			return
		}
		if err := f.validate(); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		s.SetFaults(f)
		s.logger.Info("sandbox faults set", "faults", f)
		writeJSON(w, http.StatusOK, f)
	})
	s.mux.HandleFunc("POST /_sandbox/reset", func(w http.ResponseWriter, r *http.Request) {
		s.Reset()
		w.WriteHeader(http.StatusNoContent)
	})
	s.pushbackRoutes()
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// ConnState is the http.Server hook that counts the connections clients open (Stats.Connections): a
// sender that keeps its connections opens each once; one whose pool is too small for its sends in flight
// opens them again and again (against a real provider, a TLS handshake each time).
func (s *Server) ConnState(_ net.Conn, st http.ConnState) {
	if st == http.StateNew {
		s.conns.Add(1)
	}
}

// shutdownTimeout bounds how long ListenAndServe waits for requests in flight (a long Latency) to finish.
const shutdownTimeout = 10 * time.Second

// ListenAndServe serves s on addr until ctx is done, then shuts down gracefully: it stops accepting,
// releases requests held by the timeout fault (their connections are dropped without an answer) and
// waits up to 10s for the others to finish. It returns nil after a clean shutdown.
func ListenAndServe(ctx context.Context, addr string, s *Server) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("sandbox listen: %w", err)
	}
	return Serve(ctx, ln, s)
}

// Serve is ListenAndServe on a listener already open (closed when it returns).
func Serve(ctx context.Context, ln net.Listener, s *Server) error {
	stop := make(chan struct{})
	srv := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext: func(net.Listener) context.Context {
			return context.WithValue(context.Background(), shutdownKey{}, (<-chan struct{})(stop))
		},
		ErrorLog:  slog.NewLogLogger(s.logger.Handler(), slog.LevelDebug),
		ConnState: s.ConnState,
	}
	srv.RegisterOnShutdown(func() { close(stop) })

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	s.logger.Info("sandbox listening", "addr", ln.Addr().String())

	select {
	case err := <-errc:
		return fmt.Errorf("sandbox serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
		return fmt.Errorf("sandbox shutdown: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("sandbox serve: %w", err)
	}
	return nil
}
