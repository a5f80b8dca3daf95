package iys

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Sources of the consent-changes pull (Changes' source; research §2.9).
const (
	// PullHS lists the changes the brand itself (or its partners) registered: HS_* sources.
	PullHS = "HS"
	// PullIYS lists the changes citizens made in İYS itself (the 3338 short number, web, app, e-Devlet):
	// IYS_* sources. It is İYS's default.
	PullIYS = "IYS"
)

// Limits of the İYS API (research §2.1, §2.7, §2.9).
const (
	// DefaultRatePerSecond is İYS's limit per IP, and Config.RatePerSecond's default.
	DefaultRatePerSecond = 10
	// MaxMultiStatus is the most recipients one multi-status request may carry.
	MaxMultiStatus = 1000
	// MaxPullLimit is the largest page of the consent-changes pull.
	MaxPullLimit = 1000
	// PullLag is how long İYS keeps a change out of the consent-changes pull ("son 1 saat içerisinde
	// gerçekleşen izin hareketleri bu metot cevabında listelenmez"): a pull brings the consents up to
	// date with İYS as it was that long before, and a RET given since reaches it only later.
	PullLag = time.Hour
)

// multiStatusFallback is the list length İYS's error table gives with H127 ("recipients ... en fazla
// 100"). The method's own description says 1000; if the live API ever refuses 1000 with H127, the client
// falls back to this size rather than failing the pass.
const multiStatusFallback = 100

// multiStatusWorkers bounds the multi-status requests in flight: the pacer keeps the rate, and a few
// requests in flight keep it when each takes longer than the pacer's interval.
const multiStatusWorkers = 4

const (
	defaultTimeout      = 30 * time.Second
	defaultMaxRetries   = 3
	defaultMaxRetryWait = 30 * time.Second
)

// Config configures a Client. Every field but the credentials and codes has a default; the caller reads
// the environment (IYS_BASE_URL, IYS_USERNAME, IYS_PASSWORD, IYS_CODE, IYS_BRAND_CODE).
type Config struct {
	// BaseURL is the API's root: https://api.iys.org.tr live, https://api.sandbox.iys.org.tr for İYS's test
	// environment, or the campaignctl sandbox.
	BaseURL string
	// Username and Password are the API user's credentials for the password grant. They never appear in
	// an error or a log.
	Username, Password string
	// IYSCode is the service provider's İYS number and BrandCode the brand's; both are digits.
	IYSCode, BrandCode string
	// RatePerSecond caps the client's requests per second, token requests and retries included. 0 means
	// DefaultRatePerSecond, İYS's limit per IP; clients sharing an IP must share it out.
	RatePerSecond float64
	// Timeout bounds each HTTP attempt. 0 means 30 s.
	Timeout time.Duration
	// HTTPClient sends the requests; nil means a client of its own.
	HTTPClient *http.Client
	// MaxRetries is how many times a request is retried after a 429 (per-second limit), a 5xx or a network
	// error; 0 means 3, a negative value none. Hourly limits (H084, H086, H089) are never retried.
	MaxRetries int
	// MaxRetryWait is the longest wait the client accepts before a retry (Retry-After or back-off); an
	// answer asking for longer is returned at once. 0 means 30 s.
	MaxRetryWait time.Duration
	// PageSize is the limit PullAll asks each page with; 0 means MaxPullLimit.
	PageSize int
	// MultiStatusBatch is the number of recipients per multi-status request; 0 means MaxMultiStatus.
	MultiStatusBatch int
	// Logger receives a debug record per request and an info record per retry; nil discards them.
	// Records name the operation, never a credential, a token or an unmasked recipient.
	Logger *slog.Logger
	// Now is the clock tokens are timed by; nil means time.Now.
	Now func() time.Time
}

// String hides the password, so that printing a Config by mistake leaks nothing.
func (c Config) String() string {
	pw := ""
	if c.Password != "" {
		pw = "***"
	}
	return fmt.Sprintf("iys.Config{BaseURL:%q Username:%q Password:%q IYSCode:%q BrandCode:%q}",
		c.BaseURL, c.Username, pw, c.IYSCode, c.BrandCode)
}

// GoString is String, for %#v.
func (c Config) GoString() string { return c.String() }

// LogValue is String, for slog.
func (c Config) LogValue() slog.Value { return slog.StringValue(c.String()) }

// Client talks to the İYS consent API for one brand: single and multi-status queries, the
// consent-changes pull, and adding consents (AddConsent, AddConsents and AddResults, in add.go). It gets and caches its OAuth2 token (refreshing it with the refresh token before
// it expires, logging in again when that fails, and once more on a 401), keeps under RatePerSecond, and
// retries 429s (after Retry-After), 5xx and network errors a bounded number of times. It is safe for
// concurrent use.
type Client struct {
	cfg        Config
	base       string
	http       *http.Client
	log        *slog.Logger
	now        func() time.Time
	pace       *pacer
	tokens     *tokenSource
	multiBatch atomic.Int64
	sleep      func(ctx context.Context, d time.Duration) error
}

// BrandCode is the İYS brand code the client works for.
func (c *Client) BrandCode() string { return c.cfg.BrandCode }

// NewClient checks cfg and returns a Client. It does not contact İYS.
func NewClient(cfg Config) (*Client, error) {
	u, err := url.Parse(cfg.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errors.New("iys client: base URL must be http(s)://host, e.g. https://api.iys.org.tr (IYS_BASE_URL)")
	}
	if cfg.Username == "" || cfg.Password == "" {
		return nil, errors.New("iys client: username and password are required (IYS_USERNAME, IYS_PASSWORD)")
	}
	if !isDigits(cfg.IYSCode) || !isDigits(cfg.BrandCode) {
		return nil, errors.New("iys client: İYS code and brand code must be İYS numbers, digits only (IYS_CODE, IYS_BRAND_CODE)")
	}
	switch {
	case cfg.RatePerSecond == 0:
		cfg.RatePerSecond = DefaultRatePerSecond
	case !(cfg.RatePerSecond > 0):
		return nil, fmt.Errorf("iys client: rate %v must be positive", cfg.RatePerSecond)
	}
	if cfg.PageSize == 0 {
		cfg.PageSize = MaxPullLimit
	}
	if cfg.PageSize < 1 || cfg.PageSize > MaxPullLimit {
		return nil, fmt.Errorf("iys client: page size %d must be between 1 and %d", cfg.PageSize, MaxPullLimit)
	}
	if cfg.MultiStatusBatch == 0 {
		cfg.MultiStatusBatch = MaxMultiStatus
	}
	if cfg.MultiStatusBatch < 1 || cfg.MultiStatusBatch > MaxMultiStatus {
		return nil, fmt.Errorf("iys client: multi-status batch %d must be between 1 and %d", cfg.MultiStatusBatch, MaxMultiStatus)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = defaultTimeout
	}
	switch {
	case cfg.MaxRetries == 0:
		cfg.MaxRetries = defaultMaxRetries
	case cfg.MaxRetries < 0:
		cfg.MaxRetries = 0
	}
	if cfg.MaxRetryWait <= 0 {
		cfg.MaxRetryWait = defaultMaxRetryWait
	}
	c := &Client{
		cfg:   cfg,
		base:  strings.TrimRight(cfg.BaseURL, "/"),
		http:  cfg.HTTPClient,
		log:   cfg.Logger,
		now:   cfg.Now,
		pace:  newPacer(cfg.RatePerSecond),
		sleep: sleepCtx,
	}
	if c.http == nil {
		c.http = &http.Client{}
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if c.now == nil {
		c.now = time.Now
	}
	c.multiBatch.Store(int64(cfg.MultiStatusBatch))
	c.tokens = &tokenSource{c: c, sem: make(chan struct{}, 1)}
	return c, nil
}

func isDigits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// Record is one consent as the İYS API reports it: a status answer, or one change of the pull.
type Record struct {
	// Recipient is in canonical form (CanonicalRecipient); as İYS gave it if it has none.
	Recipient string `json:"recipient"`
	// Type is MESAJ, EPOSTA or ARAMA; RecipientType BIREYSEL or TACIR; Status ONAY or RET.
	Type          string `json:"type"`
	RecipientType string `json:"recipient_type"`
	Status        string `json:"status"`
	// Source is where the consent was given: HS_* (the brand) or IYS_* (the citizen, in İYS).
	Source string `json:"source"`
	// ConsentDate is when the consent was given, in Europe/Istanbul; zero when İYS has none (a TACIR
	// record added without one).
	ConsentDate time.Time `json:"consent_date"`
	// CreationDate is when İYS recorded it, in Europe/Istanbul.
	CreationDate time.Time `json:"creation_date"`
	// TransactionID is İYS's ID of the change (64 hex characters): the key of an idempotent upsert.
	TransactionID string `json:"transaction_id"`
}

// Page is one answer of the consent-changes pull.
type Page struct {
	// Source is the pull source asked for: PullHS or PullIYS.
	Source string
	// Changes are the consent changes, oldest first; empty when there was nothing new (204).
	Changes []Record
	// After is the cursor to send next time: the answer's, or the one asked with when nothing was new.
	// Store it in the same transaction as Changes.
	After string
}

// wireConsent is a consent in İYS's JSON. Fields the client does not use (retailerCode, retailerTitle,
// citizenName...) are ignored; citizenName is personal data the engine has no use for.
type wireConsent struct {
	Recipient     string `json:"recipient"`
	Type          string `json:"type"`
	RecipientType string `json:"recipientType"`
	Status        string `json:"status"`
	Source        string `json:"source"`
	ConsentDate   string `json:"consentDate"`
	CreationDate  string `json:"creationDate"`
	TransactionID string `json:"transactionId"`
}

// record checks a consent İYS sent and converts it. Any field the engine depends on that is missing or
// out of its enumeration fails the whole answer: a consent half understood is worse than none.
func (w wireConsent) record() (Record, error) {
	r := Record{Type: w.Type, RecipientType: w.RecipientType, Status: w.Status, Source: w.Source, TransactionID: w.TransactionID}
	if r.RecipientType == "" {
		r.RecipientType = RecipientIndividual // İYS's documented default
	}
	switch {
	case r.Type != TypeMessage && r.Type != TypeEmail && r.Type != TypeCall:
		return Record{}, fmt.Errorf("type %q", w.Type)
	case r.RecipientType != RecipientIndividual && r.RecipientType != RecipientMerchant:
		return Record{}, fmt.Errorf("recipientType %q", w.RecipientType)
	case r.Status != StatusApproved && r.Status != StatusRejected:
		return Record{}, fmt.Errorf("status %q", w.Status)
	case strings.TrimSpace(w.Recipient) == "":
		return Record{}, errors.New("no recipient")
	case w.TransactionID == "":
		return Record{}, errors.New("no transactionId")
	}
	r.Recipient = canonicalOrRaw(r.Type, w.Recipient)
	var err error
	if r.CreationDate, err = parseIYSDate(w.CreationDate); err != nil || r.CreationDate.IsZero() {
		return Record{}, fmt.Errorf("creationDate %q", w.CreationDate)
	}
	if r.ConsentDate, err = parseIYSDate(w.ConsentDate); err != nil {
		return Record{}, fmt.Errorf("consentDate %q", w.ConsentDate)
	}
	return r, nil
}

// canonicalOrRaw canonicalises a recipient İYS sent. İYS validated it when it was stored, so one the
// canonicaliser refuses is kept as İYS spells it rather than failing the answer.
func canonicalOrRaw(typ, raw string) string {
	if c, err := CanonicalRecipient(typ, raw); err == nil {
		return c
	}
	return strings.TrimSpace(raw)
}

// parseIYSDate reads İYS's "YYYY-MM-DD HH:MM:SS" in Europe/Istanbul; empty gives the zero time.
func parseIYSDate(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	return time.ParseInLocation(DateLayout, s, istanbul)
}

func checkKey(recipientType, typ string) error {
	if typ != TypeMessage && typ != TypeEmail && typ != TypeCall {
		return fmt.Errorf("%w %q: must be MESAJ, EPOSTA or ARAMA", ErrInvalidType, typ)
	}
	if recipientType != RecipientIndividual && recipientType != RecipientMerchant {
		return fmt.Errorf("recipient type %q must be BIREYSEL or TACIR", recipientType)
	}
	return nil
}

func (c *Client) brandPath() string {
	return "/sps/" + c.cfg.IYSCode + "/brands/" + c.cfg.BrandCode + "/consents"
}

// Status asks İYS for one recipient's consent of type typ (MESAJ, EPOSTA, ARAMA) and recipientType
// (BIREYSEL, TACIR). The recipient is canonicalised first (errors wrap ErrInvalidPhone or
// ErrInvalidEmail). When İYS has no record the error wraps ErrNoConsent (and is an *APIError, 404).
//
// İYS allows 1000 single-status queries an hour per IP (429 H086, not retried): use it for spot checks;
// MultiStatus and the pull are for bulk.
func (c *Client) Status(ctx context.Context, recipientType, typ, recipient string) (Record, error) {
	if err := checkKey(recipientType, typ); err != nil {
		return Record{}, fmt.Errorf("iys status: %w", err)
	}
	canon, err := CanonicalRecipient(typ, recipient)
	if err != nil {
		return Record{}, fmt.Errorf("iys status: %w", err)
	}
	body, _ := json.Marshal(map[string]string{"recipient": canon, "recipientType": recipientType, "type": typ})
	_, data, err := c.do(ctx, call{op: opStatus, method: http.MethodPost, path: c.brandPath() + "/status", body: body})
	if err != nil {
		return Record{}, err
	}
	var w wireConsent
	if err := decodeStrict(data, &w); err != nil {
		return Record{}, malformed(opStatus, err)
	}
	r, err := w.record()
	if err != nil {
		return Record{}, malformed(opStatus, err)
	}
	if r.Recipient != canon || r.Type != typ || r.RecipientType != recipientType {
		return Record{}, malformed(opStatus, errors.New("the answer is about another consent than the one asked"))
	}
	return r, nil
}

// MultiStatus asks İYS which of recipients have consent status ONAY for type typ and recipientType, in
// requests of up to MaxMultiStatus recipients (Config.MultiStatusBatch). Recipients are canonicalised
// and de-duplicated first; an invalid one fails the call before any request, with its index (errors wrap
// ErrInvalidPhone or ErrInvalidEmail).
//
// The result maps each approved recipient's canonical form to a Record with Status ONAY. A recipient
// absent from it is RET or has no record: İYS's answer does not tell them apart, and neither may be sent
// commercial messages. Source, dates and TransactionID are empty: multi-status reports none. If any
// request fails the result is nil: never a partial answer.
func (c *Client) MultiStatus(ctx context.Context, recipientType, typ string, recipients []string) (map[string]Record, error) {
	if err := checkKey(recipientType, typ); err != nil {
		return nil, fmt.Errorf("iys multi-status: %w", err)
	}
	canon := make([]string, 0, len(recipients))
	seen := make(map[string]bool, len(recipients))
	for i, raw := range recipients {
		r, err := CanonicalRecipient(typ, raw)
		if err != nil {
			return nil, fmt.Errorf("iys multi-status: recipient %d: %w", i, err)
		}
		if !seen[r] {
			seen[r] = true
			canon = append(canon, r)
		}
	}
	approved := make(map[string]Record)
	if len(canon) == 0 {
		return approved, nil
	}
	size := int(c.multiBatch.Load())
	jobs := make(chan []string)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	workers := min(multiStatusWorkers, (len(canon)+size-1)/size)
	for range workers {
		wg.Go(func() {
			for chunk := range jobs {
				list, err := c.multiStatusChunk(ctx, recipientType, typ, chunk)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
					cancel()
				}
				for _, r := range list {
					approved[r] = Record{Recipient: r, Type: typ, RecipientType: recipientType, Status: StatusApproved}
				}
				mu.Unlock()
			}
		})
	}
	for start := 0; start < len(canon); start += size {
		select {
		case jobs <- canon[start:min(start+size, len(canon))]:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(jobs)
	wg.Wait()
	if firstErr == nil && ctx.Err() != nil {
		firstErr = fmt.Errorf("iys multi-status: %w", ctx.Err())
	}
	if firstErr != nil {
		return nil, firstErr
	}
	return approved, nil
}

// multiStatusChunk queries one list and returns the approved recipients, canonical. If İYS refuses the
// list's length with H127, the list is asked again in lists of multiStatusFallback, and so are all later
// ones.
func (c *Client) multiStatusChunk(ctx context.Context, recipientType, typ string, chunk []string) ([]string, error) {
	body, _ := json.Marshal(map[string][]string{"recipients": chunk})
	path := c.brandPath() + "/" + recipientType + "/status/" + typ
	_, data, err := c.do(ctx, call{op: opMultiStatus, method: http.MethodPost, path: path, body: body})
	var ae *APIError
	if errors.As(err, &ae) && ae.Code == "H127" && len(chunk) > multiStatusFallback {
		c.multiBatch.Store(multiStatusFallback)
		c.log.Info("iys multi-status list too long for İYS; using shorter lists", "op", opMultiStatus,
			"refused", len(chunk), "batch", multiStatusFallback)
		var out []string
		for start := 0; start < len(chunk); start += multiStatusFallback {
			list, err := c.multiStatusChunk(ctx, recipientType, typ, chunk[start:min(start+multiStatusFallback, len(chunk))])
			if err != nil {
				return nil, err
			}
			out = append(out, list...)
		}
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	var resp struct {
		RequestID string    `json:"requestId"`
		List      *[]string `json:"list"`
	}
	if err := decodeStrict(data, &resp); err != nil {
		return nil, malformed(opMultiStatus, err)
	}
	if resp.List == nil {
		return nil, malformed(opMultiStatus, errors.New("no list"))
	}
	asked := make(map[string]bool, len(chunk))
	for _, r := range chunk {
		asked[r] = true
	}
	out := make([]string, 0, len(*resp.List))
	for _, raw := range *resp.List {
		r := canonicalOrRaw(typ, raw)
		if !asked[r] {
			return nil, malformed(opMultiStatus, errors.New("the list names a recipient that was not asked about"))
		}
		out = append(out, r)
	}
	return out, nil
}

// Changes fetches one page of the consent-changes pull: the changes recorded after the cursor after
// (empty: from the start of İYS's window), at most limit of them (0 means MaxPullLimit), from source
// PullHS or PullIYS. İYS lists the last 7 days of changes, leaving out the last hour, oldest first; a
// page with no changes (İYS's 204) is not an error and keeps the cursor. A malformed answer returns an
// error wrapping ErrMalformedResponse and an empty Page.
func (c *Client) Changes(ctx context.Context, source, after string, limit int) (Page, error) {
	if source != PullHS && source != PullIYS {
		return Page{}, fmt.Errorf("iys changes: source %q must be HS or IYS", source)
	}
	if limit == 0 {
		limit = MaxPullLimit
	}
	if limit < 1 || limit > MaxPullLimit {
		return Page{}, fmt.Errorf("iys changes: limit %d must be between 1 and %d", limit, MaxPullLimit)
	}
	q := url.Values{"source": {source}, "limit": {strconv.Itoa(limit)}}
	if after != "" {
		q.Set("after", after)
	}
	status, data, err := c.do(ctx, call{op: opChanges, method: http.MethodGet, path: c.brandPath() + "/changes", query: q})
	if err != nil {
		return Page{}, err
	}
	if status == http.StatusNoContent {
		return Page{Source: source, After: after}, nil
	}
	var resp struct {
		After string         `json:"after"`
		List  *[]wireConsent `json:"list"`
	}
	if err := decodeStrict(data, &resp); err != nil {
		return Page{}, malformed(opChanges, err)
	}
	if resp.List == nil || len(*resp.List) == 0 {
		if resp.After != "" {
			after = resp.After
		}
		return Page{Source: source, After: after}, nil
	}
	if resp.After == "" {
		return Page{}, malformed(opChanges, errors.New("changes without an after cursor"))
	}
	page := Page{Source: source, After: resp.After, Changes: make([]Record, len(*resp.List))}
	for i, w := range *resp.List {
		r, err := w.record()
		if err != nil {
			return Page{}, malformed(opChanges, fmt.Errorf("change %d: %w", i, err))
		}
		page.Changes[i] = r
	}
	return page, nil
}

// PullAll pages through the consent-changes pull of source from the cursor after until İYS has nothing
// new, calling fn with each page that has changes, in order. fn should store the page's changes and its
// After in one transaction, so that a crash between pages resumes where the store left off. PullAll
// stops at the first error, from İYS or from fn; fn's is returned unwrapped.
func (c *Client) PullAll(ctx context.Context, source, after string, fn func(Page) error) error {
	for {
		page, err := c.Changes(ctx, source, after, c.cfg.PageSize)
		if err != nil {
			return err
		}
		if len(page.Changes) == 0 {
			return nil
		}
		if page.After == after {
			return malformed(opChanges, errors.New("the after cursor did not move"))
		}
		if err := fn(page); err != nil {
			return err
		}
		after = page.After
	}
}

// decodeStrict decodes a whole JSON object; trailing data or a truncated body is an error.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(strings.NewReader(string(data)))
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("data after the JSON value")
	}
	return nil
}

// malformed wraps ErrMalformedResponse. The detail comes from the decoder or the checks above and never
// quotes the body, which holds recipients.
func malformed(op string, err error) error {
	return fmt.Errorf("iys %s: %w: %v", op, ErrMalformedResponse, err)
}
