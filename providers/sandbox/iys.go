package sandbox

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/campaignctl/campaignctl/providers"
)

// The İYS fake imitates the consent API of İYS (İleti Yönetim Sistemi, the Turkish commercial-message
// consent registry) as the official OpenAPI document 3.2.0 describes it (research iys.md §2):
//
//	POST /oauth2/token                                                      password and refresh_token grants
//	POST /sps/{iysCode}/brands/{brandCode}/consents/status                  one consent
//	POST /sps/{iysCode}/brands/{brandCode}/consents/{recipientType}/status/{type}
//	                                                                        which of ≤1000 recipients are ONAY
//	GET  /sps/{iysCode}/brands/{brandCode}/consents/changes?after=&limit=&source=
//	                                                                        the consent-changes pull
//	POST /v2/sps/{iysCode}/brands/{brandCode}/consents                      add one consent, idempotent
//	POST /v2/sps/{iysCode}/brands/{brandCode}/consents/request              asynchronous batch add (≤1000)
//	GET  /v2/sps/{iysCode}/brands/{brandCode}/consents/request/{requestId}  the batch's result
//	                                                                        (each also without /v2: İYS's V1,
//	                                                                        not idempotent; see iys_add.go)
//	POST /_sandbox/iys/consents          act as a citizen (or seed): record changes; JSON object or array
//	GET  /_sandbox/iys/consents          the current consents, as status answers them (JSON array)
//	GET  /_sandbox/iys/stats             IYSStats as JSON
//	GET  /_sandbox/iys/faults            the pending IYSFaults
//	POST /_sandbox/iys/faults            replace them, e.g. {"malformed":2} or {"rate_limited":1}
//	POST /_sandbox/iys/tokens/expire     every access token issued expires now (refresh tokens stay valid)
//	POST /_sandbox/iys/tokens/revoke     forget every access and refresh token
//	GET  /_sandbox/iys/settings          the IYSSettings (batch add delays)
//	POST /_sandbox/iys/settings          change them, e.g. {"batch_delay_ms":0,"batch_enqueue_ms":0}
//	POST /_sandbox/iys/reset             clear consents, changes, batches, IYSStats, faults and the rate
//	                                     buckets (the IYSSettings stay)
//
// # Token
//
// The token endpoint takes JSON or a form, as İYS does. grant_type=password checks username and password
// against Options.IYSUsername and IYSPassword (when both are empty any non-empty pair is accepted);
// grant_type=refresh_token takes a refresh token it issued and not yet used: a refresh rotates it, so
// the old one is refused afterwards. The answer is {"access_token","refresh_token","expires_in",
// "refresh_expires_in","token_type":"bearer"}, the tokens JWT-shaped, living Options.IYSTokenTTL (default
// 7200 s) and IYSRefreshTTL (default 14400 s) by Options.IYSNow. Refusals are 400 with İYS's OAuth JSON
// and its texts, e.g. {"error":"invalid_request","error_description":"Kullanıcı kimlik bilgileri
// geçersiz."} for wrong credentials; an unknown or used refresh token gets invalid_grant (the text is the
// fake's: İYS documents none). Options.IYSTokenPerHour caps token requests per client IP and hour with
// 429 H084; as İYS warns, a request refused for it restarts the hour.
//
// # API
//
// Every API request goes through, in order: the per-IP rate (Options.IYSRate requests per second, a token
// bucket holding one second's worth: 429 H124 with Retry-After, which İYS itself does not document), the
// bearer token (401 H351 when missing, unknown or expired), the path's iysCode and brandCode (403 H353
// unless they are Options.IYSCode and IYSBrandCode; when those are 0 any number is accepted and every
// brand shares one set of consents), the injected IYSFaults, then validation. Errors have İYS's shape,
// {"errors":[{"code","message","location","value"}]}, with its codes and texts: 400 H014 for a body that
// is not JSON, 422 H111/H117 (type), H170/H116 (recipientType), H114 (recipient), H118 (unknown field),
// H120 (e-mail), H121 (phone not E.164, or a trunk zero as in +9005...), H166 (phone over 15 characters),
// H464 (an e-mail for MESAJ or ARAMA, a phone for EPOSTA), H168/H478/H164 (recipients missing, not a
// list, empty), H193 (a repeated recipient), H506 (source) and H507 (limit).
//
// Single status answers the stored consent with consentDate, source, recipientType, status, type,
// recipient, creationDate and transactionId; for a key with no record it answers 404
// {"errors":[{"message":"İzin bulunamadı."}]}, the fake's choice since İYS documents none. Multi-status
// answers {"requestId","list"} with the requested recipients whose status is ONAY, in request order; more
// than Options.IYSMultiStatusMax recipients (default 1000, İYS's documented maximum) get 422 H127, the
// error table's "recipients list too long" code. E-mail addresses are compared in lower case, as İYS
// stores them.
//
// The pull lists recorded changes oldest first by creationDate, then transactionId: only those of the
// last 7 days and older than Options.IYSPullLag (İYS leaves out the last hour; default 1 h, negative
// means none), only sources HS_* for source=HS and IYS_* for source=IYS (the default), at most limit
// (default and maximum 1000) after the cursor. The answer is {"after","list"}, after being
// "<epoch ms>_<transactionId>" of the last item, or 204 with no body when nothing is left. A cursor the
// fake cannot read gets 400 H097.
//
// # Acting as a citizen
//
// POST /_sandbox/iys/consents takes IYSConsent objects: recipient, type, status (ONAY or RET), source
// (an IYS_* value such as IYS_KISAMESAJ, IYS_MOBIL or IYS_WEB for a citizen's own action, or an HS_*
// value for the brand's own records), and optionally recipientType (default BIREYSEL), consentDate
// (default now; for TACIR absent means none, as in İYS) and creationDate (default now; an earlier time
// backdates the change, so that it clears the pull's one-hour lag at once). Each becomes a change with a
// new 64-hex transactionId and the key's current state; the answer, 201, is what was recorded. No
// business rule (H174, H175...) applies here: a citizen may refuse a brand that never had a record.
//
// # Faults and logs
//
// IYSFaults (POST /_sandbox/iys/faults) count down per API request, in field order: rate_limited answers
// 429 H124 with Retry-After: 1, server_error 500 H103, unavailable 503 H192, and malformed a 200 whose JSON
// body is cut in half. The shared Faults and Server.Reset do not touch the İYS fake; Options.Latency
// delays it like the others. Each request is counted in IYSStats, not in Stats. The debug log names the
// operation, the answer and the recipient masked with providers.MaskAddress; it never shows a password,
// a token or a cursor.

// İYS enumerations, spelled as İYS spells them.
const (
	iysTypeMessage  = "MESAJ"
	iysTypeEmail    = "EPOSTA"
	iysTypeCall     = "ARAMA"
	iysIndividual   = "BIREYSEL"
	iysMerchant     = "TACIR"
	iysApproved     = "ONAY"
	iysRejected     = "RET"
	iysPullHS       = "HS"
	iysPullIYS      = "IYS"
	iysDateLayout   = "2006-01-02 15:04:05"
	iysMaxPull      = 1000
	iysDefaultMulti = 1000
	iysWindow       = 7 * 24 * time.Hour
	iysDefaultLag   = time.Hour
	iysMaxBody      = 1 << 20
	iysMaxBatchLog  = 10_000
)

// iysZone is Turkey's time, a fixed UTC+3 since 2016; İYS dates carry no zone and are read in it.
var iysZone = time.FixedZone("TRT", 3*60*60)

// iysHSSources are the sources a service provider may send (error H119 lists them).
var iysHSSources = []string{
	"HS_FIZIKSEL_ORTAM", "HS_ISLAK_IMZA", "HS_WEB", "HS_CAGRI_MERKEZI", "HS_SOSYAL_MEDYA", "HS_EPOSTA",
	"HS_MESAJ", "HS_MOBIL", "HS_EORTAM", "HS_ETKINLIK", "HS_2015", "HS_ATM", "HS_KARAR",
}

// IYSConsent is one consent in İYS's JSON shape: what the control API records and what status and the
// pull answer. Dates are "YYYY-MM-DD HH:MM:SS" in Turkish time.
type IYSConsent struct {
	Recipient     string `json:"recipient"`
	Type          string `json:"type"`
	RecipientType string `json:"recipientType,omitempty"`
	Status        string `json:"status"`
	Source        string `json:"source"`
	ConsentDate   string `json:"consentDate,omitempty"`
	CreationDate  string `json:"creationDate,omitempty"`
	TransactionID string `json:"transactionId,omitempty"`
}

// IYSStats counts what the İYS fake saw since the start or the last ResetIYS.
type IYSStats struct {
	// TokenRequests is every request to POST /oauth2/token.
	TokenRequests int `json:"token_requests"`
	// PasswordGrants and RefreshGrants count the tokens issued by each grant.
	PasswordGrants int `json:"password_grants"`
	RefreshGrants  int `json:"refresh_grants"`
	// TokensRefused counts token requests answered 400 or 429.
	TokensRefused int `json:"tokens_refused"`
	// Requests is every request to the consent API (the token endpoint and the control API excluded).
	Requests int `json:"requests"`
	// Unauthenticated counts 401 H351 answers.
	Unauthenticated int `json:"unauthenticated"`
	// RateLimited counts 429 answers (H124 and H084), the injected ones included.
	RateLimited int `json:"rate_limited"`
	// StatusQueries, MultiStatusQueries and ChangesQueries count the requests that got an answer
	// (malformed included, errors excluded); ChangesEmpty counts the pulls answered 204.
	StatusQueries      int `json:"status_queries"`
	MultiStatusQueries int `json:"multi_status_queries"`
	ChangesQueries     int `json:"changes_queries"`
	ChangesEmpty       int `json:"changes_empty"`
	// MultiStatusBatches is the number of recipients in each multi-status request, in order of arrival,
	// those refused included (the first 10,000 requests).
	MultiStatusBatches []int `json:"multi_status_batches"`
	// ByCode counts error answers by İYS code ("H124"), or by OAuth error for the token endpoint.
	ByCode map[string]int `json:"by_code"`
	// Consents is the number of keys with a current consent; Changes the number of changes recorded.
	Consents int `json:"consents"`
	Changes  int `json:"changes"`

	// AddsReceived counts the consents the add endpoints received, one per single add and one per item
	// of a batch, once the request passed the rate, token, codes and injected faults (a request refused
	// by those is not received). AddsReceived = AddsAccepted + AddsReplayed + the sum of AddsRefused +
	// AddsPending.
	AddsReceived int `json:"adds_received"`
	// AddsAccepted counts the adds that changed a consent (each recorded as a change with an HS_ source).
	AddsAccepted int `json:"adds_accepted"`
	// AddsReplayed counts the V2 adds identical to one already stored, answered with its transactionId
	// and recording nothing.
	AddsReplayed int `json:"adds_replayed"`
	// AddsRefused counts refused adds by İYS code: H174, H175, H178 (single adds and batch items) and the
	// validation codes (H162, H112, H014...); a batch refused whole (H091, H194, an invalid item) counts
	// each of its items under the refusal's code, an empty or unreadable one counts once.
	AddsRefused map[string]int `json:"adds_refused"`
	// AddsPending is the number of batch items not processed yet.
	AddsPending int `json:"adds_pending"`
	// AddsAcceptedByKey counts AddsAccepted per consent key, IYSAddKey(recipient, type, recipientType)
	// ("+905321234567/MESAJ/BIREYSEL"), the recipient as İYS stores it: a test can check that a refusal
	// arrived exactly once, however often the client retried.
	AddsAcceptedByKey map[string]int `json:"adds_accepted_by_key"`
	// AddBatches counts the batch adds accepted (202); AddResultQueries the result queries answered,
	// AddResultsEmpty those answered with an empty list (not processed yet).
	AddBatches       int `json:"add_batches"`
	AddResultQueries int `json:"add_result_queries"`
	AddResultsEmpty  int `json:"add_results_empty"`
}

// newIYSStats returns zero counters with their maps made.
func newIYSStats() IYSStats {
	return IYSStats{ByCode: make(map[string]int), AddsRefused: make(map[string]int), AddsAcceptedByKey: make(map[string]int)}
}

// IYSFaults are the failures the İYS fake injects into its next API answers (the token endpoint is
// spared). Each field is a count of answers still to fail that way; they are used up in field order.
type IYSFaults struct {
	// RateLimited answers 429 H124 with Retry-After: 1.
	RateLimited int `json:"rate_limited"`
	// ServerError answers 500 H103.
	ServerError int `json:"server_error"`
	// Unavailable answers 503 H192.
	Unavailable int `json:"unavailable"`
	// Malformed answers 200 with the first half of the real JSON body (a 204 becomes a broken page).
	Malformed int `json:"malformed"`
}

type iysKey struct{ recipient, typ, recipientType string }

// iysEvent is one recorded change. Events are kept sorted by (creation in ms, transactionId), the order
// of the pull and of its cursor.
type iysEvent struct {
	c       IYSConsent
	created time.Time
	ms      int64
}

// iysState is the İYS fake's state.
type iysState struct {
	opts     Options
	now      func() time.Time
	lag      time.Duration
	multiMax int
	limiter  *rateLimiter
	jwtKey   [32]byte

	mu      sync.Mutex
	access  map[string]time.Time // access token → expiry
	refresh map[string]time.Time // refresh token → expiry
	tokenHr map[string]*hourWindow
	events  []iysEvent
	current map[iysKey]iysEvent
	faults  IYSFaults
	stats   IYSStats
	add     iysAddState // the add endpoints' batches, idempotence memory and settings (iys_add.go)
}

// hourWindow counts token requests of one client IP in the current hour.
type hourWindow struct {
	start time.Time
	n     int
}

// iysRoutes registers the İYS fake.
func (s *Server) iysRoutes() {
	st := &iysState{
		opts:     s.opts,
		now:      s.opts.IYSNow,
		lag:      s.opts.IYSPullLag,
		multiMax: s.opts.IYSMultiStatusMax,
		limiter:  newRateLimiter(s.opts.IYSRate),
		access:   make(map[string]time.Time),
		refresh:  make(map[string]time.Time),
		tokenHr:  make(map[string]*hourWindow),
		current:  make(map[iysKey]iysEvent),
	}
	if st.now == nil {
		st.now = time.Now
	}
	switch {
	case st.lag == 0:
		st.lag = iysDefaultLag
	case st.lag < 0:
		st.lag = 0
	}
	if st.multiMax <= 0 {
		st.multiMax = iysDefaultMulti
	}
	_, _ = rand.Read(st.jwtKey[:])
	st.stats = newIYSStats()
	st.add.init()
	s.iys = st

	s.mux.HandleFunc("POST /oauth2/token", s.iysToken)
	s.mux.HandleFunc("POST /sps/{iysCode}/brands/{brandCode}/consents/status", s.iysStatus)
	s.mux.HandleFunc("POST /sps/{iysCode}/brands/{brandCode}/consents/{recipientType}/status/{type}", s.iysMultiStatus)
	s.mux.HandleFunc("GET /sps/{iysCode}/brands/{brandCode}/consents/changes", s.iysChanges)
	s.iysAddRoutes()
	s.iysControlRoutes()
}

func (st *iysState) count(fn func(*IYSStats)) {
	st.mu.Lock()
	fn(&st.stats)
	st.mu.Unlock()
}

// iysErrorItem is one entry of İYS's error list.
type iysErrorItem struct {
	Code     string `json:"code,omitempty"`
	Message  string `json:"message"`
	Location []any  `json:"location,omitempty"`
	Value    any    `json:"value,omitempty"`
	Index    *int   `json:"index,omitempty"` // the item of a list request the error is about
}

// iysFail answers with İYS's error JSON and counts it.
func (s *Server) iysFail(w http.ResponseWriter, op, recipient string, status int, e iysErrorItem) {
	s.iys.count(func(st *IYSStats) {
		if e.Code != "" {
			st.ByCode[e.Code]++
		}
		switch status {
		case http.StatusTooManyRequests:
			st.RateLimited++
		case http.StatusUnauthorized:
			st.Unauthenticated++
		}
	})
	s.iysLog(op, recipient, status, e.Code)
	writeJSON(w, status, map[string][]iysErrorItem{"errors": {e}})
}

// iysLog writes one debug record per request; the recipient is masked, nothing secret is passed in.
func (s *Server) iysLog(op, recipient string, status int, code string) {
	s.logger.Debug("sandbox iys request",
		"op", op,
		"recipient", providers.MaskAddress(recipient),
		"status", status,
		"error_code", code)
}

// Texts of the İYS errors the fake answers, verbatim from the API's documentation.
const (
	iysMsgRate        = "Saniyede kabul edilen istek limitine ulaşıldı. Lütfen daha sonra tekrar deneyiniz."
	iysMsgToken       = "Eksik veya geçersiz jeton!"
	iysMsgCodeIYS     = "iysCode, kullanıcı izinleriyle eşleştirilemiyor"
	iysMsgCodeBrand   = "brandCode, kullanıcı izinleriyle eşleştirilemiyor"
	iysMsgJSON        = "Gönderilen istek JSON formatına uygun olmalıdır."
	iysMsgServer      = "Sunucuda arama yapılamadı."
	iysMsgTimeout     = "İstek zaman aşımına uğradı."
	iysMsgQuery       = "İzin sorgulama isteği geçerli olmalıdır."
	iysMsgNotFound    = "İzin bulunamadı."
	iysMsgHourlyToken = "Saatte kabul edilen kimlik doğrulama istek limitine ulaşıldı. Lütfen daha sonra tekrar deneyiniz."
)

// iysBegin runs the checks every API request passes before its own validation, answering the first
// that fails. It reports whether to go on and whether the answer must be malformed.
func (s *Server) iysBegin(w http.ResponseWriter, r *http.Request, op string) (ok, malformed bool) {
	st := s.iys
	st.count(func(x *IYSStats) { x.Requests++ })
	sleep(r.Context(), s.opts.Latency)
	st.settle() // batches due by now are processed before anything this request sees
	if !st.limiter.allow(clientIP(r)) {
		// The bucket refills one token every 1/rate seconds: the earliest a retry can pass.
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int(math.Ceil(1/s.opts.IYSRate)))))
		s.iysFail(w, op, "", http.StatusTooManyRequests, iysErrorItem{Code: "H124", Message: iysMsgRate})
		return false, false
	}
	if !st.authorized(r) {
		s.iysFail(w, op, "", http.StatusUnauthorized, iysErrorItem{Code: "H351", Message: iysMsgToken})
		return false, false
	}
	if msg := st.checkCodes(r.PathValue("iysCode"), r.PathValue("brandCode")); msg != "" {
		s.iysFail(w, op, "", http.StatusForbidden, iysErrorItem{Code: "H353", Message: msg})
		return false, false
	}
	switch st.takeFault() {
	case "rate_limited":
		w.Header().Set("Retry-After", "1")
		s.iysFail(w, op, "", http.StatusTooManyRequests, iysErrorItem{Code: "H124", Message: iysMsgRate})
		return false, false
	case "server_error":
		s.iysFail(w, op, "", http.StatusInternalServerError, iysErrorItem{Code: "H103", Message: iysMsgServer})
		return false, false
	case "unavailable":
		s.iysFail(w, op, "", http.StatusServiceUnavailable, iysErrorItem{Code: "H192", Message: iysMsgTimeout})
		return false, false
	case "malformed":
		return true, true
	}
	return true, false
}

// checkCodes returns H353's message when the path's codes are not the configured ones.
func (st *iysState) checkCodes(iysCode, brandCode string) string {
	want := func(got string, code int64) bool {
		n, err := strconv.ParseInt(got, 10, 64)
		return err == nil && n > 0 && (code == 0 || n == code)
	}
	if !want(iysCode, st.opts.IYSCode) {
		return iysMsgCodeIYS
	}
	if !want(brandCode, st.opts.IYSBrandCode) {
		return iysMsgCodeBrand
	}
	return ""
}

// takeFault uses up one injected fault, if any is left.
func (st *iysState) takeFault() string {
	st.mu.Lock()
	defer st.mu.Unlock()
	f := &st.faults
	for _, c := range []struct {
		n    *int
		name string
	}{{&f.RateLimited, "rate_limited"}, {&f.ServerError, "server_error"}, {&f.Unavailable, "unavailable"}, {&f.Malformed, "malformed"}} {
		if *c.n > 0 {
			*c.n--
			return c.name
		}
	}
	return ""
}

// iysReply answers v with status, or, when malformed, a 200 with the first half of its JSON.
func (s *Server) iysReply(w http.ResponseWriter, op, recipient string, status int, v any, malformed bool) {
	if !malformed {
		s.iysLog(op, recipient, status, "")
		if status == http.StatusNoContent {
			w.WriteHeader(status)
			return
		}
		writeJSON(w, status, v)
		return
	}
	data, _ := json.Marshal(v)
	if v == nil || status == http.StatusNoContent {
		data = []byte(`{"after":"","list":[{"recipient":"+905`)
	}
	s.iysLog(op, recipient, http.StatusOK, "malformed")
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(data[:len(data)/2])
}

// clientIP is the key of the per-IP limits.
func clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// iysDecode reads a JSON object body strictly: unknown fields get H118, as İYS's do.
func iysDecode(w http.ResponseWriter, r *http.Request, v any) (int, iysErrorItem, bool) {
	return iysDecodeLimit(w, r, v, iysMaxBody)
}

// iysDecodeLimit is iysDecode for a body of up to limit bytes.
func iysDecodeLimit(w http.ResponseWriter, r *http.Request, v any, limit int64) (int, iysErrorItem, bool) {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		return http.StatusBadRequest, iysErrorItem{Code: "H014", Message: iysMsgJSON}, false
	}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			return http.StatusUnprocessableEntity, iysErrorItem{Code: "H118", Location: []any{strings.Trim(f, `"`)},
				Message: "Alan değeri kabul edilemedi. İstek gövdesinde bulunabilecek değerler: recipientType, retailerAccess, recipient, retailerCode, source, type, consentDate, status olmalıdır."}, false
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field == "recipients" {
			return http.StatusUnprocessableEntity, iysErrorItem{Code: "H478", Location: []any{"recipients"}, Message: "Alıcı listesi (recipients) liste olmalıdır."}, false
		}
		return http.StatusBadRequest, iysErrorItem{Code: "H014", Message: iysMsgJSON}, false
	}
	if dec.More() {
		return http.StatusBadRequest, iysErrorItem{Code: "H014", Message: iysMsgJSON}, false
	}
	return 0, iysErrorItem{}, true
}

// iysCheckType validates a consent type.
func iysCheckType(typ string) (iysErrorItem, bool) {
	switch typ {
	case iysTypeMessage, iysTypeEmail, iysTypeCall:
		return iysErrorItem{}, true
	case "":
		return iysErrorItem{Code: "H111", Location: []any{"type"}, Message: "İzin tipi (type) bulunamadı."}, false
	}
	return iysErrorItem{Code: "H117", Location: []any{"type"}, Value: typ, Message: "İzin tipi (type) için uygun değerler: ARAMA, MESAJ, EPOSTA"}, false
}

func iysCheckRecipientType(rt string) (iysErrorItem, bool) {
	switch rt {
	case iysIndividual, iysMerchant:
		return iysErrorItem{}, true
	case "":
		return iysErrorItem{Code: "H170", Location: []any{"recipientType"}, Message: "Alıcı tipi (recipientType) bulunamadı. "}, false
	}
	return iysErrorItem{Code: "H116", Location: []any{"recipientType"}, Value: rt, Message: "Alıcı tipi (recipientType) için uygun değerler: BIREYSEL, TACIR"}, false
}

// iysCheckRecipient validates recipient for typ the way İYS does and returns it as İYS stores it (e-mails
// in lower case). loc is the error's location; nil for the control API.
func iysCheckRecipient(typ, recipient string, loc []any) (string, iysErrorItem, bool) {
	if recipient == "" {
		return "", iysErrorItem{Code: "H114", Location: loc, Message: "Alıcı (recipient) bulunamadı."}, false
	}
	looksPhone := strings.HasPrefix(recipient, "+") || strings.Trim(recipient, "0123456789") == ""
	if typ == iysTypeEmail {
		if looksPhone {
			return "", iysErrorItem{Code: "H464", Location: loc, Value: recipient, Message: "İzin tipi (type) EPOSTA için, alıcı (recipient) e-posta formatında olmalıdır."}, false
		}
		if !iysValidEmail(recipient) {
			return "", iysErrorItem{Code: "H120", Location: loc, Value: recipient, Message: "Alıcı (recipient) kabul edilemedi. Geçerli bir eposta adresi giriniz."}, false
		}
		return strings.ToLower(recipient), iysErrorItem{}, true
	}
	if strings.Contains(recipient, "@") {
		return "", iysErrorItem{Code: "H464", Location: loc, Value: recipient, Message: "İzin tipi (type) MESAJ için, alıcı (recipient) telefon formatında olmalıdır."}, false
	}
	if len(recipient) > 15 {
		return "", iysErrorItem{Code: "H166", Location: loc, Value: recipient, Message: "Alıcı için telefon numaraları 15 karakterden uzun olmamalıdır."}, false
	}
	digits := strings.TrimPrefix(recipient, "+")
	bad := !strings.HasPrefix(recipient, "+") || len(digits) < 8 || strings.Trim(digits, "0123456789") != "" ||
		digits[0] == '0' || (strings.HasPrefix(digits, "90") && len(digits) != 12) || strings.HasPrefix(digits, "900")
	if bad {
		return "", iysErrorItem{Code: "H121", Location: loc, Value: recipient,
			Message: "Alıcı (recipient) için E164 uluslararası([+][country code][area code][local phone number]) formata uygun bir telefon numarası girilmelidir. (örn. +905992000000)"}, false
	}
	return recipient, iysErrorItem{}, true
}

// iysValidEmail is İYS's documented shape: 6–265 ASCII characters, no spaces, x@xx.xx at least, and no
// special characters in the local part but + . _ -.
func iysValidEmail(s string) bool {
	if len(s) < 6 || len(s) > 265 {
		return false
	}
	local, domain, ok := strings.Cut(s, "@")
	if !ok || local == "" || strings.Contains(domain, "@") || !strings.Contains(domain, ".") ||
		strings.HasPrefix(domain, ".") || strings.HasSuffix(domain, ".") {
		return false
	}
	for _, c := range []byte(local) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("+._-", c) >= 0) {
			return false
		}
	}
	for _, c := range []byte(domain) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// iysStatus imitates POST …/consents/status (consentDetail).
func (s *Server) iysStatus(w http.ResponseWriter, r *http.Request) {
	const op = "status"
	ok, malformed := s.iysBegin(w, r, op)
	if !ok {
		return
	}
	var req struct {
		Recipient     string `json:"recipient"`
		RecipientType string `json:"recipientType"`
		Type          string `json:"type"`
	}
	if status, e, ok := iysDecode(w, r, &req); !ok {
		s.iysFail(w, op, "", status, e)
		return
	}
	if e, ok := iysCheckType(req.Type); !ok {
		s.iysFail(w, op, req.Recipient, http.StatusUnprocessableEntity, e)
		return
	}
	if e, ok := iysCheckRecipientType(req.RecipientType); !ok {
		s.iysFail(w, op, req.Recipient, http.StatusUnprocessableEntity, e)
		return
	}
	rcpt, e, ok := iysCheckRecipient(req.Type, req.Recipient, []any{"recipient"})
	if !ok {
		s.iysFail(w, op, req.Recipient, http.StatusUnprocessableEntity, e)
		return
	}
	st := s.iys
	st.mu.Lock()
	ev, found := st.current[iysKey{rcpt, req.Type, req.RecipientType}]
	st.mu.Unlock()
	c := ev.c
	if !found && !malformed {
		s.iysFail(w, op, rcpt, http.StatusNotFound, iysErrorItem{Message: iysMsgNotFound})
		return
	}
	st.count(func(x *IYSStats) { x.StatusQueries++ })
	s.iysReply(w, op, rcpt, http.StatusOK, c, malformed)
}

// iysMultiStatus imitates POST …/consents/{recipientType}/status/{type} (batchConsentStatus).
func (s *Server) iysMultiStatus(w http.ResponseWriter, r *http.Request) {
	const op = "multi_status"
	ok, malformed := s.iysBegin(w, r, op)
	if !ok {
		return
	}
	var req struct {
		Recipients *[]string `json:"recipients"`
	}
	status, e, decoded := iysDecode(w, r, &req)
	n := 0
	if decoded && req.Recipients != nil {
		n = len(*req.Recipients)
	}
	s.iys.count(func(x *IYSStats) {
		if len(x.MultiStatusBatches) < iysMaxBatchLog {
			x.MultiStatusBatches = append(x.MultiStatusBatches, n)
		}
	})
	if !decoded {
		s.iysFail(w, op, "", status, e)
		return
	}
	typ, rt := r.PathValue("type"), r.PathValue("recipientType")
	if e, ok := iysCheckRecipientType(rt); !ok {
		s.iysFail(w, op, "", http.StatusUnprocessableEntity, e)
		return
	}
	if e, ok := iysCheckType(typ); !ok {
		s.iysFail(w, op, "", http.StatusUnprocessableEntity, e)
		return
	}
	switch {
	case req.Recipients == nil:
		s.iysFail(w, op, "", http.StatusUnprocessableEntity, iysErrorItem{Code: "H168", Location: []any{"recipients"}, Message: "Alıcı listesi (recipients) bulunamadı."})
		return
	case n == 0:
		s.iysFail(w, op, "", http.StatusUnprocessableEntity, iysErrorItem{Code: "H164", Location: []any{"recipients"}, Value: []string{}, Message: "Alıcı listesi (recipients) kabul edilemedi. Liste boş olmamalıdır."})
		return
	case n > s.iys.multiMax:
		s.iysFail(w, op, "", http.StatusUnprocessableEntity, iysErrorItem{Code: "H127", Location: []any{"recipients"},
			Message: fmt.Sprintf("Alıcı listesi (recipients) uzunluğu en fazla %d olmalıdır.", s.iys.multiMax)})
		return
	}
	canon := make([]string, n)
	seen := make(map[string]bool, n)
	for i, raw := range *req.Recipients {
		c, e, ok := iysCheckRecipient(typ, raw, []any{"recipients", i})
		if !ok {
			s.iysFail(w, op, raw, http.StatusUnprocessableEntity, e)
			return
		}
		if seen[c] {
			s.iysFail(w, op, raw, http.StatusUnprocessableEntity, iysErrorItem{Code: "H193", Location: []any{"recipients", i}, Value: raw,
				Message: "Alıcı (recipient) değeri liste içinde tekrarlanamaz."})
			return
		}
		seen[c] = true
		canon[i] = c
	}
	list := make([]string, 0, n)
	st := s.iys
	st.mu.Lock()
	for i, c := range canon {
		if cur, ok := st.current[iysKey{c, typ, rt}]; ok && cur.c.Status == iysApproved {
			list = append(list, (*req.Recipients)[i])
		}
	}
	st.mu.Unlock()
	st.count(func(x *IYSStats) { x.MultiStatusQueries++ })
	s.logger.Debug("sandbox iys multi-status", "recipients", n, "approved", len(list))
	s.iysReply(w, op, "", http.StatusOK, map[string]any{"requestId": newUUID(), "list": list}, malformed)
}

// iysChanges imitates GET …/consents/changes (PullPerBrandCode).
func (s *Server) iysChanges(w http.ResponseWriter, r *http.Request) {
	const op = "changes"
	ok, malformed := s.iysBegin(w, r, op)
	if !ok {
		return
	}
	q := r.URL.Query()
	source := iysPullIYS
	if q.Has("source") {
		source = q.Get("source")
	}
	if source != iysPullHS && source != iysPullIYS {
		s.iysFail(w, op, "", http.StatusUnprocessableEntity, iysErrorItem{Code: "H506", Location: []any{"source"}, Value: source, Message: "İzin kaynağı (source) bulunamadı."})
		return
	}
	limit := iysMaxPull
	if q.Has("limit") {
		n, err := strconv.Atoi(q.Get("limit"))
		if err != nil || n < 1 || n > iysMaxPull {
			s.iysFail(w, op, "", http.StatusUnprocessableEntity, iysErrorItem{Code: "H507", Location: []any{"limit"}, Value: q.Get("limit"), Message: "limit alanı için karakter üst sınırı 1000 olmalıdır."})
			return
		}
		limit = n
	}
	var afterMS int64 = math.MinInt64
	afterTx := ""
	if a := q.Get("after"); a != "" {
		ms, tx, ok := strings.Cut(a, "_")
		n, err := strconv.ParseInt(ms, 10, 64)
		if !ok || err != nil || tx == "" {
			s.iysFail(w, op, "", http.StatusBadRequest, iysErrorItem{Code: "H097", Message: iysMsgQuery})
			return
		}
		afterMS, afterTx = n, tx
	}

	st := s.iys
	now := st.now()
	from, to := now.Add(-iysWindow), now.Add(-st.lag)
	st.mu.Lock()
	i, _ := slices.BinarySearchFunc(st.events, iysEvent{ms: afterMS, c: IYSConsent{TransactionID: afterTx}}, cmpEvent)
	var list []IYSConsent
	last := ""
	for ; i < len(st.events) && len(list) < limit; i++ {
		ev := &st.events[i]
		if ev.ms == afterMS && ev.c.TransactionID == afterTx {
			continue
		}
		if ev.created.After(to) {
			break // sorted by creation: everything further is newer still
		}
		if !ev.created.After(from) || strings.HasPrefix(ev.c.Source, "HS_") != (source == iysPullHS) {
			continue
		}
		list = append(list, ev.c)
		last = strconv.FormatInt(ev.ms, 10) + "_" + ev.c.TransactionID
	}
	st.stats.ChangesQueries++
	if len(list) == 0 {
		st.stats.ChangesEmpty++
	}
	st.mu.Unlock()
	if len(list) == 0 {
		s.iysReply(w, op, "", http.StatusNoContent, nil, malformed)
		return
	}
	s.logger.Debug("sandbox iys changes", "source", source, "items", len(list))
	s.iysReply(w, op, "", http.StatusOK, map[string]any{"after": last, "list": list}, malformed)
}

func cmpEvent(a, b iysEvent) int {
	return cmp.Or(cmp.Compare(a.ms, b.ms), strings.Compare(a.c.TransactionID, b.c.TransactionID))
}

// record stores one change and makes it the key's current consent. c must be validated and complete.
func (st *iysState) record(c IYSConsent, created time.Time) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.recordLocked(c, created)
}

// recordLocked is record with st.mu held.
func (st *iysState) recordLocked(c IYSConsent, created time.Time) {
	ev := iysEvent{c: c, created: created, ms: created.UnixMilli()}
	i, _ := slices.BinarySearchFunc(st.events, ev, cmpEvent)
	st.events = slices.Insert(st.events, i, ev)
	k := iysKey{c.Recipient, c.Type, c.RecipientType}
	// A backdated change does not replace a later one: the current state is the latest by creation.
	if cur, ok := st.current[k]; !ok || !cur.created.After(created) {
		st.current[k] = ev
	}
	st.stats.Changes++
	st.stats.Consents = len(st.current)
}

func newTransactionID() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
