package sandbox

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

// The İYS fake's add endpoints imitate İYS's addConsent(V2), addBatchConsent(V2) and
// searchRequestDetails(V2) (research iys.md §1.4, §2.4, §2.5), each under /v2/sps/... and, as İYS's V1,
// under /sps/...:
//
//	POST …/consents                      add one consent: 200 {"transactionId","creationDate"}
//	POST …/consents/request              a JSON array of up to 1000 consents: 202 {"requestId","subRequests"}
//	GET  …/consents/request/{requestId}  the batch's result: a JSON array, empty until it is processed
//
// A consent is {"recipient","type","recipientType","status","source","consentDate"} (retailerCode and
// retailerAccess are accepted and ignored; anything else gets H118). The requests pass the checks every
// İYS API request does (rate, token, codes, injected IYSFaults: see iys.go), so a client's retries,
// token refresh and fault handling are exercised here too.
//
// # Validation, on arrival
//
// Each consent is checked as İYS checks it when the request arrives, answered 422 with
// {"errors":[{"code","message","location","value","index"}]} (index only in a batch, where the first bad
// item refuses the whole request): H111/H117 type, H116 recipientType (absent means BIREYSEL, as in
// İYS), H114/H120/H121/H166/H464 recipient (see iys.go), H110 status missing, H115 status not ONAY or
// RET, H119 source missing (BIREYSEL; TACIR may leave it out) or not one of İYS's HS_ sources, H408
// HS_KARAR without RET, H112 consentDate missing (BIREYSEL), H113 not "YYYY-MM-DD HH:MM:SS", H156 before
// 2015-05-01, H155 HS_2015 with another date than 2015-05-01 00:00:00, and H162 a consentDate after the
// fake's clock (Options.IYSNow). A batch also gets H164 when empty, H091 with more than 1000 items, and
// H194 when a (recipientType, type, recipient) repeats, at the index of the repeat. H091, H162, H164,
// H174, H175, H178 and H194 are İYS's documented codes; the code of each other rule and every text not
// quoted in the research are the fake's choice. İYS's three-business-day rule (H467) is not imitated.
//
// # Business rules, when processed
//
// A consent is then compared with the key's current one (the same state status and the pull use), and
// refused with 400: H175 when the key has no record and the status is RET (a first add may not be RET),
// H174 when the status is the stored one, H463/H462 when a TACIR record is updated without source or
// consentDate, H178 when the consentDate is earlier than the stored one. An accepted consent is recorded
// like any change, with a new 64-hex transactionId and the fake's time as creationDate: status answers
// it at once, and the pull lists it under source=HS once Options.IYSPullLag has passed. A single add is
// processed at once and refused with the 400; a batch item is processed when the batch is due (below)
// and its refusal shows in the result.
//
// V2 is idempotent, as İYS documents: a V2 consent with the same fields and values, for the same
// iysCode and brandCode, as one a V2 request already stored is answered with that transactionId and
// creationDate (a batch item: success, plus "originalRequestInformation":{"requestId","subRequestId"}
// when a batch stored it) and changes nothing, whatever happened to the key since. Only stored consents
// are remembered; a refused one is judged again. V1 remembers nothing: resending gets H174.
//
// # Batches
//
// A batch's result is [] until IYSSettings.BatchDelayMS (default 200 ms; İYS asks clients to wait at
// least 5 minutes) has passed on the fake's clock since it arrived. Then the first half of its items
// (rounded up) are processed, in order, and the result lists every item: {"index","status",
// "subrequestId"} with status "success" and "transactionId","creationDate", or "failure" and
// "error":{"code","message"}, or "enqueue" for the rest until IYSSettings.BatchEnqueueMS more has passed
// (default 0: the whole batch at once). Due batches are processed before any request to the fake is
// served and before IYSConsents and IYSStats answer, so nothing needs a timer. A result is asked by the
// requestId the 202 gave (404 for an unknown one, 422 H198 for one that cannot be İYS's: over 36
// characters, all letters or all digits); V1 and V2 paths find the same batches.
//
// # Settings and stats
//
// GET /_sandbox/iys/settings answers the IYSSettings; POST /_sandbox/iys/settings replaces them (for
// batches that arrive afterwards), e.g. {"batch_delay_ms":0,"batch_enqueue_ms":0}; SetIYSSettings does
// the same. ResetIYS clears the batches and the idempotence memory but keeps the settings. IYSStats
// counts adds received, accepted, replayed, refused by code, pending and accepted per key
// (IYSAddKey).

// Limits and defaults of the add endpoints.
const (
	iysMaxAddBatch       = 1000
	iysMaxBatchBody      = 8 << 20
	iysDefaultBatchDelay = 200 // ms
	iysMaxSettingMS      = 10 * 60 * 1000
)

// Statuses of a batch item's result.
const (
	iysItemSuccess = "success"
	iysItemFailure = "failure"
	iysItemEnqueue = "enqueue"
)

// iysEpoch is the earliest consentDate İYS accepts, and the only one with HS_2015.
var iysEpoch = time.Date(2015, 5, 1, 0, 0, 0, 0, iysZone)

// Texts of the add endpoints' errors. H175 and H178 are İYS's (research §1.4); the others are the fake's.
const (
	iysMsgFirstRET   = "İlk defa kaydedilen bir iznin durum (status) bilgisi RET olmamalıdır."
	iysMsgSameStatus = "Sistemdeki izin ile aynı durum (status) bilgisine sahip izin kaydedilemez."
	iysMsgOlderDate  = "Sistemdeki iznin tarihinden önceki tarihli izinlerle güncelleme yapılamaz."
	iysMsgFuture     = "İzin tarihi (consentDate) ileri bir tarih olamaz."
	iysMsgBatchSize  = "İzin listesi en fazla 1000 izin içermelidir."
	iysMsgRepeat     = "Aynı alıcı (recipient), alıcı tipi (recipientType) ve izin tipi (type) liste içinde tekrarlanamaz."
	iysMsgNoRequest  = "İstek bulunamadı."
)

// IYSSettings are what can change about the İYS fake's batch adds while the sandbox runs. A change
// applies to the batches that arrive after it.
type IYSSettings struct {
	// BatchDelayMS is how long, on the fake's clock, a batch's result stays empty after it arrived, in
	// milliseconds: 200 at the start; 0 processes it at the next request.
	BatchDelayMS int64 `json:"batch_delay_ms"`
	// BatchEnqueueMS is how much longer the second half of a batch's items stay "enqueue" after the
	// first half was processed; 0 (the start) processes the whole batch at once.
	BatchEnqueueMS int64 `json:"batch_enqueue_ms"`
}

func (x IYSSettings) validate() error {
	for _, f := range []struct {
		name string
		v    int64
	}{{"batch_delay_ms", x.BatchDelayMS}, {"batch_enqueue_ms", x.BatchEnqueueMS}} {
		if f.v < 0 || f.v > iysMaxSettingMS {
			return fmt.Errorf("%s must be between 0 and %d (10 minutes), got %d", f.name, iysMaxSettingMS, f.v)
		}
	}
	return nil
}

// IYSAddKey is the key of IYSStats.AddsAcceptedByKey: recipient (as İYS stores it: E.164, or an e-mail
// address in lower case), type and recipient type joined with "/", e.g. "+905321234567/MESAJ/BIREYSEL".
func IYSAddKey(recipient, typ, recipientType string) string {
	return recipient + "/" + typ + "/" + recipientType
}

// iysAddRequest is one consent of an add request, as decoded. Its JSON, with the path's codes, is the
// V2 idempotence key.
type iysAddRequest struct {
	Recipient      string  `json:"recipient"`
	Type           string  `json:"type"`
	RecipientType  string  `json:"recipientType,omitempty"`
	Status         string  `json:"status"`
	Source         string  `json:"source,omitempty"`
	ConsentDate    string  `json:"consentDate,omitempty"`
	RetailerCode   *int64  `json:"retailerCode,omitempty"`
	RetailerAccess []int64 `json:"retailerAccess,omitempty"`
}

// iysStored is what a V2 add that was stored answered, for an identical request later.
type iysStored struct {
	tx, created      string
	requestID, subID string // the batch and item that stored it; empty for a single add
}

// iysItemResult is one item of a batch's result, in İYS's JSON.
type iysItemResult struct {
	Index         int           `json:"index"`
	Status        string        `json:"status"`
	SubrequestID  string        `json:"subrequestId"`
	TransactionID string        `json:"transactionId,omitempty"`
	CreationDate  string        `json:"creationDate,omitempty"`
	Error         *iysItemError `json:"error,omitempty"`
	Original      *iysOriginal  `json:"originalRequestInformation,omitempty"`
}

type iysItemError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type iysOriginal struct {
	RequestID    string `json:"requestId"`
	SubRequestID string `json:"subRequestId"`
}

// iysBatchItem is one consent of a batch.
type iysBatchItem struct {
	c      IYSConsent // validated, without dates and transactionId
	key    string     // the V2 idempotence key
	sub    string
	ready  time.Time // processed from here on
	done   bool
	result iysItemResult
}

// iysBatch is one batch add.
type iysBatch struct {
	id      string
	brand   string // "iysCode/brandCode" of its path
	v2      bool
	visible time.Time // the result is empty before
	items   []iysBatchItem
	pending int
}

// iysAddState is the add endpoints' part of iysState, guarded by iysState.mu.
type iysAddState struct {
	settings IYSSettings
	open     []*iysBatch // batches with items to process, in order of arrival
	byID     map[string]*iysBatch
	idem     map[string]iysStored
}

func (a *iysAddState) init() {
	a.settings = IYSSettings{BatchDelayMS: iysDefaultBatchDelay}
	a.byID = make(map[string]*iysBatch)
	a.idem = make(map[string]iysStored)
}

// reset forgets the batches and the idempotence memory; the settings stay.
func (a *iysAddState) reset() {
	a.open = nil
	clear(a.byID)
	clear(a.idem)
}

// iysAddRoutes registers the add endpoints, V2 and V1, and their settings.
func (s *Server) iysAddRoutes() {
	for _, prefix := range []string{"/v2", ""} {
		v2 := prefix != ""
		base := prefix + "/sps/{iysCode}/brands/{brandCode}/consents"
		s.mux.HandleFunc("POST "+base, func(w http.ResponseWriter, r *http.Request) { s.iysAddOne(w, r, v2) })
		s.mux.HandleFunc("POST "+base+"/request", func(w http.ResponseWriter, r *http.Request) { s.iysAddBatch(w, r, v2) })
		s.mux.HandleFunc("GET "+base+"/request/{requestId}", s.iysAddResults)
	}
	s.mux.HandleFunc("GET /_sandbox/iys/settings", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.IYSSettings())
	})
	s.mux.HandleFunc("POST /_sandbox/iys/settings", func(w http.ResponseWriter, r *http.Request) {
		var x IYSSettings
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&x); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "decode İYS settings: " + err.Error()})
			return
		}
		if err := s.SetIYSSettings(x); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		s.logger.Info("sandbox iys settings set", "batch_delay_ms", x.BatchDelayMS, "batch_enqueue_ms", x.BatchEnqueueMS)
		writeJSON(w, http.StatusOK, x)
	})
}

// IYSSettings returns the İYS fake's current batch add settings.
func (s *Server) IYSSettings() IYSSettings {
	s.iys.mu.Lock()
	defer s.iys.mu.Unlock()
	return s.iys.add.settings
}

// SetIYSSettings replaces the batch add settings, for the batches that arrive from now on. It refuses
// negative values and values over 10 minutes.
func (s *Server) SetIYSSettings(x IYSSettings) error {
	if err := x.validate(); err != nil {
		return fmt.Errorf("İYS settings: %w", err)
	}
	s.iys.mu.Lock()
	s.iys.add.settings = x
	s.iys.mu.Unlock()
	return nil
}

// refuseAdds counts n adds received and refused with code.
func (st *iysState) refuseAdds(n int, code string) {
	st.count(func(x *IYSStats) {
		x.AddsReceived += n
		x.AddsRefused[code] += n
	})
}

// iysAddOne imitates POST [/v2]/sps/…/consents (addConsent, addConsentV2).
func (s *Server) iysAddOne(w http.ResponseWriter, r *http.Request, v2 bool) {
	const op = "add"
	ok, malformed := s.iysBegin(w, r, op)
	if !ok {
		return
	}
	st := s.iys
	var req iysAddRequest
	if status, e, ok := iysDecode(w, r, &req); !ok {
		st.refuseAdds(1, e.Code)
		s.iysFail(w, op, "", status, e)
		return
	}
	now := st.now()
	c, e, ok := iysCheckAdd(req, now, nil)
	if !ok {
		st.refuseAdds(1, e.Code)
		s.iysFail(w, op, req.Recipient, http.StatusUnprocessableEntity, e)
		return
	}
	key := iysIdemKey(r, req)
	st.mu.Lock()
	st.stats.AddsReceived++
	if prev, hit := st.add.idem[key]; v2 && hit {
		st.stats.AddsReplayed++
		st.mu.Unlock()
		s.iysReply(w, op, c.Recipient, http.StatusOK, map[string]string{"transactionId": prev.tx, "creationDate": prev.created}, malformed)
		return
	}
	rec, e, ok := st.applyLocked(c, now)
	if ok && v2 {
		st.add.idem[key] = iysStored{tx: rec.TransactionID, created: rec.CreationDate}
	}
	st.mu.Unlock()
	if !ok {
		s.iysFail(w, op, c.Recipient, http.StatusBadRequest, e)
		return
	}
	s.iysReply(w, op, c.Recipient, http.StatusOK, map[string]string{"transactionId": rec.TransactionID, "creationDate": rec.CreationDate}, malformed)
}

// iysAddBatch imitates POST [/v2]/sps/…/consents/request (addBatchConsent, addBatchConsentV2).
func (s *Server) iysAddBatch(w http.ResponseWriter, r *http.Request, v2 bool) {
	const op = "add_batch"
	ok, malformed := s.iysBegin(w, r, op)
	if !ok {
		return
	}
	st := s.iys
	var reqs []iysAddRequest
	if status, e, ok := iysDecodeLimit(w, r, &reqs, iysMaxBatchBody); !ok {
		st.refuseAdds(1, e.Code)
		s.iysFail(w, op, "", status, e)
		return
	}
	n := len(reqs)
	fail := func(e iysErrorItem) {
		st.refuseAdds(max(n, 1), e.Code)
		s.iysFail(w, op, "", http.StatusUnprocessableEntity, e)
	}
	switch {
	case n == 0:
		fail(iysErrorItem{Code: "H164", Value: []string{}, Message: "İzin listesi boş olmamalıdır."})
		return
	case n > iysMaxAddBatch:
		fail(iysErrorItem{Code: "H091", Message: iysMsgBatchSize})
		return
	}
	now := st.now()
	items := make([]iysBatchItem, n)
	seen := make(map[iysKey]bool, n)
	for i, req := range reqs {
		c, e, ok := iysCheckAdd(req, now, &i)
		if !ok {
			fail(e)
			return
		}
		k := iysKey{c.Recipient, c.Type, c.RecipientType}
		if seen[k] {
			fail(iysErrorItem{Code: "H194", Index: &i, Value: req.Recipient, Message: iysMsgRepeat})
			return
		}
		seen[k] = true
		items[i] = iysBatchItem{c: c, key: iysIdemKey(r, req), sub: newUUID()}
	}
	b := &iysBatch{id: newUUID(), brand: r.PathValue("iysCode") + "/" + r.PathValue("brandCode"), v2: v2, items: items, pending: n}
	sub := make([]map[string]string, n)
	created := now.In(iysZone).Format(iysDateLayout)
	st.mu.Lock()
	set := st.add.settings
	b.visible = now.Add(time.Duration(set.BatchDelayMS) * time.Millisecond)
	for i := range items {
		items[i].ready = b.visible
		if i >= (n+1)/2 {
			items[i].ready = b.visible.Add(time.Duration(set.BatchEnqueueMS) * time.Millisecond)
		}
		c := items[i].c
		sub[i] = map[string]string{"subrequestId": items[i].sub, "recipient": c.Recipient, "type": c.Type, "recipientType": c.RecipientType,
			"status": c.Status, "source": c.Source, "consentDate": c.ConsentDate, "creationDate": created}
	}
	st.add.open = append(st.add.open, b)
	st.add.byID[b.id] = b
	st.stats.AddBatches++
	st.stats.AddsReceived += n
	st.stats.AddsPending += n
	st.mu.Unlock()
	s.logger.Debug("sandbox iys batch add", "items", n, "v2", v2, "delay_ms", set.BatchDelayMS)
	s.iysReply(w, op, "", http.StatusAccepted, map[string]any{"requestId": b.id, "subRequests": sub}, malformed)
}

// iysAddResults imitates GET [/v2]/sps/…/consents/request/{requestId} (searchRequestDetails(V2)).
func (s *Server) iysAddResults(w http.ResponseWriter, r *http.Request) {
	const op = "add_results"
	ok, malformed := s.iysBegin(w, r, op)
	if !ok {
		return
	}
	id := r.PathValue("requestId")
	if !iysValidRequestID(id) {
		s.iysFail(w, op, "", http.StatusUnprocessableEntity, iysErrorItem{Code: "H198", Location: []any{"requestId"}, Value: id,
			Message: "requestId en fazla 36 karakter olmalı; yalnız harf veya yalnız rakamdan oluşamaz."})
		return
	}
	st := s.iys
	now := st.now()
	st.mu.Lock()
	b := st.add.byID[id]
	if b == nil || b.brand != r.PathValue("iysCode")+"/"+r.PathValue("brandCode") {
		st.mu.Unlock()
		s.iysFail(w, op, "", http.StatusNotFound, iysErrorItem{Message: iysMsgNoRequest})
		return
	}
	list := make([]iysItemResult, 0, len(b.items))
	if !now.Before(b.visible) {
		for i, it := range b.items {
			if it.done {
				list = append(list, it.result)
				continue
			}
			list = append(list, iysItemResult{Index: i, Status: iysItemEnqueue, SubrequestID: it.sub})
		}
	}
	st.stats.AddResultQueries++
	if len(list) == 0 {
		st.stats.AddResultsEmpty++
	}
	st.mu.Unlock()
	s.iysReply(w, op, "", http.StatusOK, list, malformed)
}

// iysValidRequestID is İYS's rule for a requestId: at most 36 characters, neither all letters nor all
// digits.
func iysValidRequestID(id string) bool {
	if id == "" || len(id) > 36 {
		return false
	}
	return strings.Trim(id, "0123456789") != "" &&
		strings.Trim(id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") != ""
}

// iysIdemKey is the V2 idempotence key of one consent: the path's codes and the consent's fields.
func iysIdemKey(r *http.Request, req iysAddRequest) string {
	data, _ := json.Marshal(req)
	return r.PathValue("iysCode") + "/" + r.PathValue("brandCode") + "\x00" + string(data)
}

// iysCheckAdd validates one consent to add as İYS does when the request arrives, and returns it as it
// would be stored, without dates of its own and transactionId. idx is the item's index in a batch, nil
// for a single add.
func iysCheckAdd(req iysAddRequest, now time.Time, idx *int) (IYSConsent, iysErrorItem, bool) {
	fail := func(e iysErrorItem) (IYSConsent, iysErrorItem, bool) {
		e.Index = idx
		return IYSConsent{}, e, false
	}
	if e, ok := iysCheckType(req.Type); !ok {
		return fail(e)
	}
	rt := cmp.Or(req.RecipientType, iysIndividual) // İYS's documented default
	if e, ok := iysCheckRecipientType(rt); !ok {
		return fail(e)
	}
	rcpt, e, ok := iysCheckRecipient(req.Type, req.Recipient, []any{"recipient"})
	if !ok {
		return fail(e)
	}
	switch req.Status {
	case iysApproved, iysRejected:
	case "":
		return fail(iysErrorItem{Code: "H110", Location: []any{"status"}, Message: "İzin durumu (status) bulunamadı."})
	default:
		return fail(iysErrorItem{Code: "H115", Location: []any{"status"}, Value: req.Status, Message: "İzin durumu (status) için uygun değerler: ONAY, RET"})
	}
	merchant := rt == iysMerchant
	sourceMsg := "İzin kaynağı (source) için uygun değerler: " + strings.Join(iysHSSources, ", ")
	switch {
	case req.Source == "" && merchant:
	case req.Source == "":
		return fail(iysErrorItem{Code: "H119", Location: []any{"source"}, Message: sourceMsg})
	case !slices.Contains(iysHSSources, req.Source):
		return fail(iysErrorItem{Code: "H119", Location: []any{"source"}, Value: req.Source, Message: sourceMsg})
	case req.Source == "HS_KARAR" && req.Status != iysRejected:
		return fail(iysErrorItem{Code: "H408", Location: []any{"status"}, Value: req.Status, Message: "HS_KARAR kaynağı ile yalnız RET durumu kaydedilebilir."})
	}
	if req.ConsentDate == "" {
		if !merchant {
			return fail(iysErrorItem{Code: "H112", Location: []any{"consentDate"}, Message: "İzin tarihi (consentDate) bulunamadı."})
		}
	} else {
		t, err := time.ParseInLocation(iysDateLayout, req.ConsentDate, iysZone)
		switch {
		case err != nil:
			return fail(iysErrorItem{Code: "H113", Location: []any{"consentDate"}, Value: req.ConsentDate, Message: "İzin tarihi (consentDate) YYYY-MM-DD HH:mm:ss biçiminde olmalıdır."})
		case t.Before(iysEpoch):
			return fail(iysErrorItem{Code: "H156", Location: []any{"consentDate"}, Value: req.ConsentDate, Message: "İzin tarihi (consentDate) 2015-05-01 00:00:00 tarihinden önce olamaz."})
		case req.Source == "HS_2015" && !t.Equal(iysEpoch):
			return fail(iysErrorItem{Code: "H155", Location: []any{"consentDate"}, Value: req.ConsentDate, Message: "HS_2015 kaynağı ile izin tarihi (consentDate) 2015-05-01 00:00:00 olmalıdır."})
		case t.After(now):
			return fail(iysErrorItem{Code: "H162", Location: []any{"consentDate"}, Value: req.ConsentDate, Message: iysMsgFuture})
		}
	}
	return IYSConsent{Recipient: rcpt, Type: req.Type, RecipientType: rt, Status: req.Status, Source: req.Source, ConsentDate: req.ConsentDate}, iysErrorItem{}, true
}

// applyLocked applies İYS's business rules to c against the key's current consent and, when they
// pass, records it as a change made at created. It counts the outcome. st.mu must be held.
func (st *iysState) applyLocked(c IYSConsent, created time.Time) (IYSConsent, iysErrorItem, bool) {
	refuse := func(code, msg string, loc ...any) (IYSConsent, iysErrorItem, bool) {
		st.stats.AddsRefused[code]++
		return IYSConsent{}, iysErrorItem{Code: code, Message: msg, Location: loc}, false
	}
	cur, found := st.current[iysKey{c.Recipient, c.Type, c.RecipientType}]
	switch {
	case !found && c.Status == iysRejected:
		return refuse("H175", iysMsgFirstRET, "status")
	case found && cur.c.Status == c.Status:
		return refuse("H174", iysMsgSameStatus, "status")
	case found && c.RecipientType == iysMerchant && c.Source == "":
		return refuse("H463", "TACIR izni güncellenirken izin kaynağı (source) zorunludur.", "source")
	case found && c.RecipientType == iysMerchant && c.ConsentDate == "":
		return refuse("H462", "TACIR izni güncellenirken izin tarihi (consentDate) zorunludur.", "consentDate")
	}
	if found && c.ConsentDate != "" && cur.c.ConsentDate != "" {
		have, err1 := time.ParseInLocation(iysDateLayout, cur.c.ConsentDate, iysZone)
		got, err2 := time.ParseInLocation(iysDateLayout, c.ConsentDate, iysZone)
		if err1 == nil && err2 == nil && got.Before(have) {
			return refuse("H178", iysMsgOlderDate, "consentDate")
		}
	}
	c.CreationDate = created.In(iysZone).Format(iysDateLayout)
	c.TransactionID = newTransactionID()
	st.recordLocked(c, created)
	st.stats.AddsAccepted++
	st.stats.AddsAcceptedByKey[IYSAddKey(c.Recipient, c.Type, c.RecipientType)]++
	return c, iysErrorItem{}, true
}

// settle processes the batch items due by the fake's clock.
func (st *iysState) settle() {
	now := st.now()
	st.mu.Lock()
	defer st.mu.Unlock()
	st.settleLocked(now)
}

// settleLocked processes, in the order they fell due (then of arrival, then of index), every batch
// item whose time has come, and drops the batches left with none to process. st.mu must be held.
func (st *iysState) settleLocked(now time.Time) {
	if len(st.add.open) == 0 {
		return
	}
	type due struct {
		b *iysBatch
		i int
	}
	var ds []due
	for _, b := range st.add.open {
		for i := range b.items {
			if it := &b.items[i]; !it.done && !it.ready.After(now) {
				ds = append(ds, due{b, i})
			}
		}
	}
	slices.SortStableFunc(ds, func(x, y due) int { return x.b.items[x.i].ready.Compare(y.b.items[y.i].ready) })
	for _, d := range ds {
		st.processLocked(d.b, d.i)
	}
	st.add.open = slices.DeleteFunc(st.add.open, func(b *iysBatch) bool { return b.pending == 0 })
}

// processLocked processes one batch item and stores its result. st.mu must be held.
func (st *iysState) processLocked(b *iysBatch, i int) {
	it := &b.items[i]
	it.done = true
	b.pending--
	st.stats.AddsPending--
	res := iysItemResult{Index: i, SubrequestID: it.sub}
	if prev, hit := st.add.idem[it.key]; b.v2 && hit {
		st.stats.AddsReplayed++
		res.Status, res.TransactionID, res.CreationDate = iysItemSuccess, prev.tx, prev.created
		if prev.requestID != "" {
			res.Original = &iysOriginal{RequestID: prev.requestID, SubRequestID: prev.subID}
		}
		it.result = res
		return
	}
	rec, e, ok := st.applyLocked(it.c, it.ready)
	if !ok {
		res.Status, res.Error = iysItemFailure, &iysItemError{Code: e.Code, Message: e.Message}
		it.result = res
		return
	}
	res.Status, res.TransactionID, res.CreationDate = iysItemSuccess, rec.TransactionID, rec.CreationDate
	if b.v2 {
		st.add.idem[it.key] = iysStored{tx: rec.TransactionID, created: rec.CreationDate, requestID: b.id, subID: it.sub}
	}
	it.result = res
}
