package sandbox_test

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/campaignctl/campaignctl/providers/sandbox"
)

var (
	iysBaseV2 = "/v2" + iysBase
	txRE      = regexp.MustCompile(`^[0-9a-f]{64}$`)
	uuidRE    = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
)

// addBody is one consent to add, in İYS's JSON.
func addBody(recipient, typ, status, source, consentDate string) string {
	b, _ := json.Marshal(map[string]string{"recipient": recipient, "type": typ, "recipientType": "BIREYSEL",
		"status": status, "source": source, "consentDate": consentDate})
	return string(b)
}

type addAnswer struct {
	TransactionID string `json:"transactionId"`
	CreationDate  string `json:"creationDate"`
}

func (a iysAnswer) added(t *testing.T) addAnswer {
	t.Helper()
	var out addAnswer
	if a.status != 200 || json.Unmarshal([]byte(a.body), &out) != nil || !txRE.MatchString(out.TransactionID) {
		t.Fatalf("add: %d %s", a.status, a.body)
	}
	return out
}

// code is the first error's code, after checking the HTTP status.
func (a iysAnswer) code(t *testing.T, status int) string {
	t.Helper()
	if a.status != status {
		t.Fatalf("status %d, want %d: %s", a.status, status, a.body)
	}
	c, _ := a.errs(t)[0]["code"].(string)
	return c
}

func (e *iysEnv) status(t *testing.T, tok, recipient, typ string) sandbox.IYSConsent {
	t.Helper()
	a := e.do(t, "POST", iysBase+"/status", tok, "application/json",
		fmt.Sprintf(`{"recipient":%q,"recipientType":"BIREYSEL","type":%q}`, recipient, typ))
	var c sandbox.IYSConsent
	if a.status != 200 || json.Unmarshal([]byte(a.body), &c) != nil {
		t.Fatalf("status: %d %s", a.status, a.body)
	}
	return c
}

func (e *iysEnv) settings(t *testing.T, body string) iysAnswer {
	t.Helper()
	return e.do(t, "POST", "/_sandbox/iys/settings", "", "application/json", body)
}

// A single add changes the stored consent, shows in status and in the HS pull; İYS's rules refuse
// what they refuse, with their codes, and V2 answers an identical request as the first time.
func TestIYSAddOne(t *testing.T) {
	e := newIYSSandbox(t, sandbox.Options{})
	tok := e.login(t).Access
	now := e.clock.Now()
	e.add(t,
		sandbox.IYSConsent{Recipient: "+905321234567", Type: "MESAJ", Status: "ONAY", Source: "HS_WEB", ConsentDate: at(now.Add(-48 * time.Hour)), CreationDate: at(now.Add(-48 * time.Hour))},
		sandbox.IYSConsent{Recipient: "musteri@example.com", Type: "EPOSTA", Status: "ONAY", Source: "IYS_MOBIL", ConsentDate: at(now.Add(-time.Hour)), CreationDate: at(now.Add(-time.Hour))},
	)
	before := e.s.IYSStats()

	ret := addBody("+905321234567", "MESAJ", "RET", "HS_MESAJ", at(now.Add(-time.Minute)))
	got := e.do(t, "POST", iysBaseV2, tok, "application/json", ret).added(t)
	if got.CreationDate != at(now) {
		t.Errorf("creationDate %q, want %q", got.CreationDate, at(now))
	}
	if c := e.status(t, tok, "+905321234567", "MESAJ"); c.Status != "RET" || c.Source != "HS_MESAJ" || c.TransactionID != got.TransactionID ||
		c.ConsentDate != at(now.Add(-time.Minute)) {
		t.Errorf("status after the add: %+v", c)
	}

	// V2: the identical request gets the same answer and changes nothing; V1 judges it again: H174.
	e.clock.Advance(time.Second)
	if again := e.do(t, "POST", iysBaseV2, tok, "application/json", ret).added(t); again != got {
		t.Errorf("V2 resend answered %+v, want %+v", again, got)
	}
	if code := e.do(t, "POST", iysBase, tok, "application/json", ret).code(t, 400); code != "H174" {
		t.Errorf("V1 resend: %s, want H174", code)
	}
	// First add as RET, an older consent date, a future one.
	if code := e.do(t, "POST", iysBaseV2, tok, "application/json", addBody("+905329998877", "MESAJ", "RET", "HS_MESAJ", at(now))).code(t, 400); code != "H175" {
		t.Errorf("first add as RET: %s", code)
	}
	if code := e.do(t, "POST", iysBaseV2, tok, "application/json", addBody("MUSTERI@example.com", "EPOSTA", "RET", "HS_EPOSTA", at(now.Add(-2*time.Hour)))).code(t, 400); code != "H178" {
		t.Errorf("older consent date: %s", code)
	}
	a := e.do(t, "POST", iysBaseV2, tok, "application/json", addBody("musteri@example.com", "EPOSTA", "RET", "HS_EPOSTA", at(e.clock.Now().Add(time.Second))))
	if code := a.code(t, 422); code != "H162" || a.errs(t)[0]["location"].([]any)[0] != "consentDate" {
		t.Errorf("future date: %s", a.body)
	}
	// The e-mail refusal, with a later date, passes; the address is stored in lower case.
	email := e.do(t, "POST", iysBase, tok, "application/json", addBody("Musteri@Example.com", "EPOSTA", "RET", "HS_EPOSTA", at(now))).added(t)

	st := e.s.IYSStats()
	if st.AddsReceived != 7 || st.AddsAccepted != 2 || st.AddsReplayed != 1 || st.AddsPending != 0 {
		t.Errorf("received %d, accepted %d, replayed %d, pending %d", st.AddsReceived, st.AddsAccepted, st.AddsReplayed, st.AddsPending)
	}
	if diff := cmp.Diff(map[string]int{"H174": 1, "H175": 1, "H178": 1, "H162": 1}, st.AddsRefused); diff != "" {
		t.Errorf("refused (-want +got):\n%s", diff)
	}
	wantKeys := map[string]int{
		sandbox.IYSAddKey("+905321234567", "MESAJ", "BIREYSEL"):        1,
		sandbox.IYSAddKey("musteri@example.com", "EPOSTA", "BIREYSEL"): 1,
	}
	if diff := cmp.Diff(wantKeys, st.AddsAcceptedByKey); diff != "" {
		t.Errorf("accepted by key (-want +got):\n%s", diff)
	}
	if st.Changes != before.Changes+2 || st.ByCode["H174"] != 1 || st.Requests != before.Requests+8 {
		t.Errorf("changes %d (before %d), requests %d (before %d), by code %v", st.Changes, before.Changes, st.Requests, before.Requests, st.ByCode)
	}

	// The pull lists the adds under source=HS once the hour's lag has passed, oldest first.
	if a := e.do(t, "GET", iysBase+"/changes?source=HS", tok, "", ""); a.status != 200 || strings.Contains(a.body, got.TransactionID) {
		t.Errorf("the add was listed within the pull's lag: %d %s", a.status, a.body)
	}
	e.clock.Advance(time.Hour + time.Minute)
	var page struct {
		List []sandbox.IYSConsent `json:"list"`
	}
	a = e.do(t, "GET", iysBase+"/changes?source=HS", tok, "", "")
	if err := json.Unmarshal([]byte(a.body), &page); err != nil {
		t.Fatalf("pull: %d %s", a.status, a.body)
	}
	var txs []string
	for _, c := range page.List {
		txs = append(txs, c.TransactionID)
		if c.TransactionID == email.TransactionID && (c.Recipient != "musteri@example.com" || c.Source != "HS_EPOSTA" || c.Status != "RET") {
			t.Errorf("pulled e-mail refusal %+v", c)
		}
	}
	if diff := cmp.Diff([]string{page.List[0].TransactionID, got.TransactionID, email.TransactionID}, txs); diff != "" || page.List[0].Source != "HS_WEB" {
		t.Errorf("HS pull (-want +got):\n%s", diff)
	}
	if a := e.do(t, "GET", iysBase+"/changes?source=IYS", tok, "", ""); strings.Contains(a.body, got.TransactionID) {
		t.Errorf("an HS add listed under source=IYS")
	}
}

// Validation on arrival, with İYS's error shape; the client's errors count as refused adds.
func TestIYSAddValidation(t *testing.T) {
	e := newIYSSandbox(t, sandbox.Options{})
	tok := e.login(t).Access
	now := at(e.clock.Now().Add(-time.Minute))
	for _, tt := range []struct {
		name, body string
		status     int
		code, loc  string
	}{
		{"not JSON", `{"recipient":`, 400, "H014", ""},
		{"unknown field", `{"recipient":"+905321234567","type":"MESAJ","status":"RET","source":"HS_MESAJ","consentDate":"` + now + `","name":"Ali"}`, 422, "H118", "name"},
		{"no type", `{"recipient":"+905321234567","status":"RET","source":"HS_MESAJ","consentDate":"` + now + `"}`, 422, "H111", "type"},
		{"bad type", addBody("+905321234567", "SMS", "RET", "HS_MESAJ", now), 422, "H117", "type"},
		{"bad recipient type", `{"recipient":"+905321234567","type":"MESAJ","recipientType":"KURUMSAL","status":"RET","source":"HS_MESAJ","consentDate":"` + now + `"}`, 422, "H116", "recipientType"},
		{"trunk zero", addBody("+9005321234567", "MESAJ", "RET", "HS_MESAJ", now), 422, "H121", "recipient"},
		{"e-mail for MESAJ", addBody("a@example.com", "MESAJ", "RET", "HS_MESAJ", now), 422, "H464", "recipient"},
		{"no status", addBody("+905321234567", "MESAJ", "", "HS_MESAJ", now), 422, "H110", "status"},
		{"status RED", addBody("+905321234567", "MESAJ", "RED", "HS_MESAJ", now), 422, "H115", "status"},
		{"no source", addBody("+905321234567", "MESAJ", "RET", "", now), 422, "H119", "source"},
		{"citizen's source", addBody("+905321234567", "MESAJ", "RET", "IYS_KISAMESAJ", now), 422, "H119", "source"},
		{"HS_KARAR approving", addBody("+905321234567", "MESAJ", "ONAY", "HS_KARAR", now), 422, "H408", "status"},
		{"no date", addBody("+905321234567", "MESAJ", "RET", "HS_MESAJ", ""), 422, "H112", "consentDate"},
		{"ISO date", addBody("+905321234567", "MESAJ", "RET", "HS_MESAJ", "2026-03-10T11:59:00Z"), 422, "H113", "consentDate"},
		{"before İYS", addBody("+905321234567", "MESAJ", "ONAY", "HS_WEB", "2015-04-30 23:59:59"), 422, "H156", "consentDate"},
		{"HS_2015 date", addBody("+905321234567", "MESAJ", "ONAY", "HS_2015", "2016-01-01 00:00:00"), 422, "H155", "consentDate"},
	} {
		a := e.do(t, "POST", iysBaseV2, tok, "application/json", tt.body)
		if code := a.code(t, tt.status); code != tt.code {
			t.Errorf("%s: %s, want %s", tt.name, a.body, tt.code)
			continue
		}
		if tt.loc != "" {
			if loc, _ := a.errs(t)[0]["location"].([]any); len(loc) != 1 || loc[0] != tt.loc {
				t.Errorf("%s: location %v, want %s", tt.name, loc, tt.loc)
			}
		}
	}
	// HS_2015 with its date, and a TACIR record without source or date, are first adds İYS accepts.
	e.do(t, "POST", iysBaseV2, tok, "application/json", addBody("+905321234567", "MESAJ", "ONAY", "HS_2015", "2015-05-01 00:00:00")).added(t)
	e.do(t, "POST", iysBaseV2, tok, "application/json", `{"recipient":"+905321234567","type":"MESAJ","recipientType":"TACIR","status":"ONAY"}`).added(t)
	// Updating that TACIR record needs both.
	a := e.do(t, "POST", iysBaseV2, tok, "application/json", `{"recipient":"+905321234567","type":"MESAJ","recipientType":"TACIR","status":"RET","consentDate":"`+now+`"}`)
	if code := a.code(t, 400); code != "H463" {
		t.Errorf("TACIR update without source: %s", a.body)
	}
	if st := e.s.IYSStats(); st.AddsReceived != 19 || st.AddsAccepted != 2 || st.AddsRefused["H119"] != 2 || st.AddsRefused["H014"] != 1 || st.Consents != 2 {
		t.Errorf("stats: received %d, accepted %d, refused %v", st.AddsReceived, st.AddsAccepted, st.AddsRefused)
	}
}

type batchItem struct {
	Index         int    `json:"index"`
	Status        string `json:"status"`
	SubrequestID  string `json:"subrequestId"`
	TransactionID string `json:"transactionId"`
	CreationDate  string `json:"creationDate"`
	Error         *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
	Original *struct {
		RequestID    string `json:"requestId"`
		SubRequestID string `json:"subRequestId"`
	} `json:"originalRequestInformation"`
}

func (e *iysEnv) submit(t *testing.T, tok, path string, items ...string) (string, []map[string]string) {
	t.Helper()
	a := e.do(t, "POST", path+"/request", tok, "application/json", "["+strings.Join(items, ",")+"]")
	var resp struct {
		RequestID   string              `json:"requestId"`
		SubRequests []map[string]string `json:"subRequests"`
	}
	if a.status != 202 || json.Unmarshal([]byte(a.body), &resp) != nil || !uuidRE.MatchString(resp.RequestID) {
		t.Fatalf("batch: %d %s", a.status, a.body)
	}
	return resp.RequestID, resp.SubRequests
}

func (e *iysEnv) results(t *testing.T, tok, path, id string) []batchItem {
	t.Helper()
	a := e.do(t, "GET", path+"/request/"+id, tok, "", "")
	var items []batchItem
	if a.status != 200 || json.Unmarshal([]byte(a.body), &items) != nil {
		t.Fatalf("results: %d %s", a.status, a.body)
	}
	return items
}

// A batch's result is empty until its delay has passed on the fake's clock; then the items are
// processed (the second half after the enqueue delay) with İYS's rules and shown per index.
func TestIYSAddBatch(t *testing.T) {
	e := newIYSSandbox(t, sandbox.Options{})
	tok := e.login(t).Access
	now := e.clock.Now()
	for _, r := range []string{"+905321000001", "+905321000002"} {
		e.add(t, sandbox.IYSConsent{Recipient: r, Type: "MESAJ", Status: "ONAY", Source: "HS_WEB", CreationDate: at(now.Add(-24 * time.Hour))})
	}
	if a := e.settings(t, `{"batch_delay_ms":1000,"batch_enqueue_ms":500}`); a.status != 200 {
		t.Fatalf("settings: %d %s", a.status, a.body)
	}
	date := at(now.Add(-time.Minute))
	items := []string{
		addBody("+905321000001", "MESAJ", "RET", "HS_MESAJ", date), // success
		addBody("+905321000009", "MESAJ", "RET", "HS_MESAJ", date), // no record: H175
		addBody("+905321000002", "MESAJ", "ONAY", "HS_WEB", date),  // already ONAY: H174, in the second half
	}
	id, subs := e.submit(t, tok, iysBaseV2, items...)
	if len(subs) != 3 || subs[1]["recipient"] != "+905321000009" || subs[0]["creationDate"] != at(now) || !uuidRE.MatchString(subs[2]["subrequestId"]) {
		t.Errorf("subRequests %v", subs)
	}
	if got := e.results(t, tok, iysBaseV2, id); len(got) != 0 {
		t.Fatalf("results before the delay: %+v", got)
	}
	if st := e.s.IYSStats(); st.AddsPending != 3 || st.AddBatches != 1 || st.AddsReceived != 3 || st.AddResultsEmpty != 1 {
		t.Errorf("stats before processing %+v", st)
	}
	if c := e.status(t, tok, "+905321000001", "MESAJ"); c.Status != "ONAY" {
		t.Errorf("a pending batch changed a consent: %+v", c)
	}

	e.clock.Advance(999 * time.Millisecond)
	if got := e.results(t, tok, iysBase, id); len(got) != 0 {
		t.Fatalf("results 1 ms before the delay: %+v", got)
	}
	e.clock.Advance(time.Millisecond)
	got := e.results(t, tok, iysBaseV2, id)
	if len(got) != 3 || got[0].Status != "success" || !txRE.MatchString(got[0].TransactionID) || got[0].CreationDate != at(e.clock.Now()) ||
		got[1].Status != "failure" || got[1].Error == nil || got[1].Error.Code != "H175" || got[1].TransactionID != "" ||
		got[2].Status != "enqueue" || got[2].SubrequestID != subs[2]["subrequestId"] {
		t.Fatalf("results after the delay: %+v", got)
	}
	if c := e.status(t, tok, "+905321000001", "MESAJ"); c.Status != "RET" || c.TransactionID != got[0].TransactionID || c.Source != "HS_MESAJ" {
		t.Errorf("status after processing: %+v", c)
	}
	e.clock.Advance(500 * time.Millisecond)
	got = e.results(t, tok, iysBase, id) // the V1 path finds the same batch
	if len(got) != 3 || got[2].Status != "failure" || got[2].Error.Code != "H174" || got[2].Index != 2 {
		t.Fatalf("results after the enqueue delay: %+v", got)
	}

	// V2: the same items again are a new request whose stored item answers the first transactionId.
	e.settings(t, `{"batch_delay_ms":0}`)
	id2, _ := e.submit(t, tok, iysBaseV2, items...)
	if id2 == id {
		t.Fatal("the same requestId twice")
	}
	again := e.results(t, tok, iysBaseV2, id2)
	if len(again) != 3 || again[0].Status != "success" || again[0].TransactionID != got[0].TransactionID || again[0].Original == nil ||
		again[0].Original.RequestID != id || again[0].Original.SubRequestID != subs[0]["subrequestId"] || again[1].Error.Code != "H175" {
		t.Errorf("V2 resend: %+v", again)
	}
	// V1 does not deduplicate: the refusal is judged again, H174.
	id3, _ := e.submit(t, tok, iysBase, items[0])
	if v1 := e.results(t, tok, iysBase, id3); len(v1) != 1 || v1[0].Error == nil || v1[0].Error.Code != "H174" {
		t.Errorf("V1 resend: %+v", v1)
	}

	st := e.s.IYSStats()
	key := sandbox.IYSAddKey("+905321000001", "MESAJ", "BIREYSEL")
	if st.AddsAcceptedByKey[key] != 1 || st.AddsAccepted != 1 || st.AddsReplayed != 1 || st.AddsReceived != 7 || st.AddsPending != 0 || st.AddBatches != 3 {
		t.Errorf("stats %+v", st)
	}
	if diff := cmp.Diff(map[string]int{"H175": 2, "H174": 3}, st.AddsRefused); diff != "" {
		t.Errorf("refused (-want +got):\n%s", diff)
	}

	// Unknown and impossible request IDs.
	if a := e.do(t, "GET", iysBaseV2+"/request/5b0c5f7e-1111-4222-8333-444455556666", tok, "", ""); a.status != 404 {
		t.Errorf("unknown request: %d %s", a.status, a.body)
	}
	if code := e.do(t, "GET", iysBaseV2+"/request/1234567", tok, "", "").code(t, 422); code != "H198" {
		t.Errorf("all digits: %s", code)
	}
	// Another brand does not see the batch.
	if a := e.do(t, "GET", fmt.Sprintf("/v2/sps/%d/brands/%d/consents/request/%s", iysCode, iysBrand+1, id), tok, "", ""); a.status != 403 {
		t.Errorf("other brand: %d", a.status)
	}
}

// The default delay is 200 ms of the fake's clock; the batch is processed even if nobody asks for
// its result, before any request or the stats see the state.
func TestIYSAddBatchDefaultDelay(t *testing.T) {
	e := newIYSSandbox(t, sandbox.Options{})
	tok := e.login(t).Access
	if s := e.s.IYSSettings(); s != (sandbox.IYSSettings{BatchDelayMS: 200}) {
		t.Errorf("default settings %+v", s)
	}
	e.add(t, sandbox.IYSConsent{Recipient: "ali@example.com", Type: "EPOSTA", Status: "ONAY", Source: "HS_WEB", CreationDate: at(e.clock.Now().Add(-time.Hour))})
	id, _ := e.submit(t, tok, iysBaseV2, addBody("ali@example.com", "EPOSTA", "RET", "HS_EPOSTA", at(e.clock.Now())))
	e.clock.Advance(199 * time.Millisecond)
	if st := e.s.IYSStats(); st.AddsPending != 1 || st.AddsAccepted != 0 {
		t.Errorf("processed early: %+v", st)
	}
	e.clock.Advance(time.Millisecond)
	if st := e.s.IYSStats(); st.AddsPending != 0 || st.AddsAccepted != 1 {
		t.Errorf("not processed when due: %+v", st)
	}
	if cs := e.s.IYSConsents(); len(cs) != 1 || cs[0].Status != "RET" || cs[0].Source != "HS_EPOSTA" {
		t.Errorf("consents %+v", cs)
	}
	if got := e.results(t, tok, iysBaseV2, id); len(got) != 1 || got[0].Status != "success" {
		t.Errorf("results %+v", got)
	}
}

// A batch is refused whole, with its index, when it is too long, empty, repeats a key or holds an
// invalid item.
func TestIYSAddBatchRefused(t *testing.T) {
	e := newIYSSandbox(t, sandbox.Options{})
	tok := e.login(t).Access
	date := at(e.clock.Now().Add(-time.Minute))
	long := make([]string, 1001)
	for i := range long {
		long[i] = addBody(fmt.Sprintf("+90532%07d", i), "MESAJ", "ONAY", "HS_WEB", date)
	}
	for _, tt := range []struct {
		name  string
		body  string
		code  string
		index float64
	}{
		{"1001 items", "[" + strings.Join(long, ",") + "]", "H091", -1},
		{"empty", "[]", "H164", -1},
		{"repeated key", "[" + addBody("ali@example.com", "EPOSTA", "ONAY", "HS_WEB", date) + "," + addBody("veli@example.com", "EPOSTA", "ONAY", "HS_WEB", date) + "," +
			addBody("ALI@example.com", "EPOSTA", "RET", "HS_EPOSTA", date) + "]", "H194", 2},
		{"future date", "[" + long[0] + "," + addBody("+905320000001", "MESAJ", "ONAY", "HS_WEB", at(e.clock.Now().Add(time.Hour))) + "]", "H162", 1},
	} {
		a := e.do(t, "POST", iysBaseV2+"/request", tok, "application/json", tt.body)
		if code := a.code(t, 422); code != tt.code {
			t.Errorf("%s: %s", tt.name, a.body)
			continue
		}
		idx, has := a.errs(t)[0]["index"].(float64)
		if tt.index >= 0 && (!has || idx != tt.index) || tt.index < 0 && has {
			t.Errorf("%s: index %v, want %v", tt.name, a.errs(t)[0]["index"], tt.index)
		}
	}
	// The same key for BIREYSEL and TACIR is two keys.
	e.submit(t, tok, iysBaseV2, addBody("ali@example.com", "EPOSTA", "ONAY", "HS_WEB", date),
		`{"recipient":"ali@example.com","type":"EPOSTA","recipientType":"TACIR","status":"ONAY"}`)
	st := e.s.IYSStats()
	if diff := cmp.Diff(map[string]int{"H091": 1001, "H164": 1, "H194": 3, "H162": 2}, st.AddsRefused); diff != "" {
		t.Errorf("refused (-want +got):\n%s", diff)
	}
	if st.AddsReceived != 1001+1+3+2+2 || st.AddBatches != 1 || st.AddsPending != 2 || st.Changes != 0 {
		t.Errorf("stats %+v", st)
	}
}

// Rate, token and injected faults apply to the add endpoints; a refused request is not received. A
// malformed answer hides an add that was made.
func TestIYSAddFaults(t *testing.T) {
	e := newIYSSandbox(t, sandbox.Options{})
	tok := e.login(t).Access
	e.add(t, sandbox.IYSConsent{Recipient: "+905321234567", Type: "MESAJ", Status: "ONAY", Source: "HS_WEB", CreationDate: at(e.clock.Now().Add(-time.Hour))})
	body := addBody("+905321234567", "MESAJ", "RET", "HS_MESAJ", at(e.clock.Now()))
	e.s.SetIYSFaults(sandbox.IYSFaults{RateLimited: 1, ServerError: 1, Unavailable: 1, Malformed: 1})
	for _, w := range []struct {
		status int
		code   string
	}{{429, "H124"}, {500, "H103"}, {503, "H192"}} {
		if code := e.do(t, "POST", iysBaseV2, tok, "application/json", body).code(t, w.status); code != w.code {
			t.Errorf("want %s, got %s", w.code, code)
		}
	}
	if st := e.s.IYSStats(); st.AddsReceived != 0 || st.AddsAccepted != 0 {
		t.Errorf("faulted requests were received: %+v", st)
	}
	a := e.do(t, "POST", iysBaseV2, tok, "application/json", body)
	if a.status != 200 || json.Valid([]byte(a.body)) || !strings.HasPrefix(a.body, `{"creationDate":`) {
		t.Fatalf("malformed: %d %q", a.status, a.body)
	}
	stored := e.status(t, tok, "+905321234567", "MESAJ")
	if stored.Status != "RET" {
		t.Fatalf("the malformed answer's add was not made: %+v", stored)
	}
	// The client resends after the broken answer: V2 gives the stored transactionId.
	if again := e.do(t, "POST", iysBaseV2, tok, "application/json", body).added(t); again.TransactionID != stored.TransactionID {
		t.Errorf("resend %+v, stored %s", again, stored.TransactionID)
	}
	e.s.ExpireIYSTokens()
	for _, p := range []string{iysBaseV2, iysBaseV2 + "/request"} {
		if code := e.do(t, "POST", p, tok, "application/json", "["+body+"]").code(t, 401); code != "H351" {
			t.Errorf("%s with an expired token: %s", p, code)
		}
	}
	if code := e.do(t, "GET", iysBaseV2+"/request/5b0c5f7e-1111-4222-8333-444455556666", tok, "", "").code(t, 401); code != "H351" {
		t.Errorf("results with an expired token: %s", code)
	}
	st := e.s.IYSStats()
	if st.AddsReceived != 2 || st.AddsAccepted != 1 || st.AddsReplayed != 1 || st.AddsAcceptedByKey[sandbox.IYSAddKey("+905321234567", "MESAJ", "BIREYSEL")] != 1 {
		t.Errorf("stats %+v", st)
	}
}

// The settings control endpoint validates, and ResetIYS clears batches but keeps the settings.
func TestIYSSettingsControl(t *testing.T) {
	e := newIYSSandbox(t, sandbox.Options{})
	tok := e.login(t).Access
	a := e.do(t, "GET", "/_sandbox/iys/settings", "", "", "")
	if a.status != 200 || strings.TrimSpace(a.body) != `{"batch_delay_ms":200,"batch_enqueue_ms":0}` {
		t.Errorf("GET settings: %d %s", a.status, a.body)
	}
	for _, bad := range []string{`{"batch_delay_ms":-1}`, `{"batch_enqueue_ms":600001}`, `{"delay":5}`, `[`} {
		if a := e.settings(t, bad); a.status != 400 || !strings.Contains(a.body, "error") {
			t.Errorf("settings %s: %d %s", bad, a.status, a.body)
		}
	}
	if s := e.s.IYSSettings(); s.BatchDelayMS != 200 {
		t.Errorf("a refused change applied: %+v", s)
	}
	if a := e.settings(t, `{"batch_delay_ms":5000,"batch_enqueue_ms":10}`); a.status != 200 {
		t.Fatalf("settings: %d %s", a.status, a.body)
	}
	if err := e.s.SetIYSSettings(sandbox.IYSSettings{BatchDelayMS: -5}); err == nil {
		t.Error("SetIYSSettings took a negative delay")
	}
	id, _ := e.submit(t, tok, iysBaseV2, addBody("+905321234567", "MESAJ", "ONAY", "HS_WEB", at(e.clock.Now())))
	if a := e.do(t, "POST", "/_sandbox/iys/reset", "", "", ""); a.status != 204 {
		t.Fatalf("reset: %d", a.status)
	}
	if s := e.s.IYSSettings(); s != (sandbox.IYSSettings{BatchDelayMS: 5000, BatchEnqueueMS: 10}) {
		t.Errorf("settings after reset %+v", s)
	}
	e.clock.Advance(10 * time.Second)
	if a := e.do(t, "GET", iysBaseV2+"/request/"+id, tok, "", ""); a.status != 404 {
		t.Errorf("batch after reset: %d %s", a.status, a.body)
	}
	if st := e.s.IYSStats(); st.AddsPending != 0 || st.AddsAccepted != 0 || len(e.s.IYSConsents()) != 0 {
		t.Errorf("reset left %+v", st)
	}
}
