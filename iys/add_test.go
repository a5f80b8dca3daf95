package iys_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/campaignctl/campaignctl/iys"
	"github.com/campaignctl/campaignctl/providers/sandbox"
)

var txHex = regexp.MustCompile(`^[0-9a-f]{64}$`)

// seedApproved gives each phone an ONAY for MESAJ, two days old.
func (e *env) seedApproved(t *testing.T, phones ...string) {
	t.Helper()
	for _, p := range phones {
		e.seed(t, sandbox.IYSConsent{Recipient: p, Type: "MESAJ", Status: "ONAY", Source: "HS_WEB", CreationDate: ago(e.clock, 48*time.Hour)})
	}
}

func smsRET(recipient string, at time.Time) iys.ConsentChange {
	return iys.ConsentChange{Recipient: recipient, Type: iys.TypeMessage, RecipientType: iys.RecipientIndividual,
		Status: iys.StatusRejected, Source: "HS_MESAJ", ConsentDate: at}
}

// A RET is registered once, in canonical form, and shows in status; resending it changes nothing.
func TestAddConsentRegistersRET(t *testing.T) {
	t.Parallel()
	clk := newClock()
	e := newEnv(t, sandbox.Options{}, clk)
	e.seedApproved(t, "+905321234567")
	c := e.client(t, nil)
	ctx := context.Background()

	ch := smsRET("0532 123 45 67", clk.Now().Add(-5*time.Minute+300*time.Millisecond))
	res, err := c.AddConsent(ctx, ch)
	if err != nil {
		t.Fatal(err)
	}
	if !txHex.MatchString(res.TransactionID) || !res.CreationDate.Equal(clk.Now()) || res.CreationDate.Location() != iys.Istanbul() {
		t.Errorf("result %+v", res)
	}
	rec, err := c.Status(ctx, iys.RecipientIndividual, iys.TypeMessage, "+905321234567")
	if err != nil {
		t.Fatal(err)
	}
	want := iys.Record{Recipient: "+905321234567", Type: "MESAJ", RecipientType: "BIREYSEL", Status: "RET", Source: "HS_MESAJ",
		ConsentDate: clk.Now().Add(-5 * time.Minute).In(iys.Istanbul()), CreationDate: res.CreationDate, TransactionID: res.TransactionID}
	if diff := cmp.Diff(want, rec); diff != "" {
		t.Errorf("status after the add (-want +got):\n%s", diff)
	}

	// The same change again, later: V2 answers the first transactionId and records nothing.
	clk.Advance(time.Minute)
	again, err := c.AddConsent(ctx, ch)
	if err != nil || again != res {
		t.Errorf("resend: %+v, %v; want %+v", again, err, res)
	}
	st := e.s.IYSStats()
	if st.AddsAccepted != 1 || st.AddsReplayed != 1 || st.AddsAcceptedByKey[sandbox.IYSAddKey("+905321234567", "MESAJ", "BIREYSEL")] != 1 {
		t.Errorf("stats %+v", st)
	}

	// An e-mail refusal: the address goes lower case.
	e.seed(t, sandbox.IYSConsent{Recipient: "ali@example.com", Type: "EPOSTA", Status: "ONAY", Source: "HS_WEB", CreationDate: ago(clk, time.Hour)})
	if _, err := c.AddConsent(ctx, iys.ConsentChange{Recipient: " Ali@Example.COM", Type: iys.TypeEmail, RecipientType: iys.RecipientIndividual,
		Status: iys.StatusRejected, Source: "HS_EPOSTA", ConsentDate: clk.Now()}); err != nil {
		t.Fatal(err)
	}
	if n := e.s.IYSStats().AddsAcceptedByKey[sandbox.IYSAddKey("ali@example.com", "EPOSTA", "BIREYSEL")]; n != 1 {
		t.Errorf("e-mail refusal accepted %d times", n)
	}
}

// İYS's refusals come back as *APIError with their codes, permanent, sent once each.
func TestAddConsentRefusals(t *testing.T) {
	t.Parallel()
	clk := newClock()
	e := newEnv(t, sandbox.Options{}, clk)
	e.seedApproved(t, "+905321000001")
	e.seed(t, sandbox.IYSConsent{Recipient: "+905321000002", Type: "MESAJ", Status: "RET", Source: "IYS_KISAMESAJ", CreationDate: ago(clk, time.Hour)})
	c := e.client(t, nil)
	ctx := context.Background()
	for _, tt := range []struct {
		name string
		ch   iys.ConsentChange
		code string
	}{
		{"first add as RET", smsRET("+905321000009", clk.Now()), "H175"},
		{"already RET", smsRET("+905321000002", clk.Now()), "H174"},
		{"older than the stored", smsRET("+905321000001", clk.Now().Add(-72*time.Hour)), "H178"},
	} {
		_, err := c.AddConsent(ctx, tt.ch)
		var ae *iys.APIError
		if !errors.As(err, &ae) || ae.Code != tt.code || ae.Status != 400 || ae.Op != "add" {
			t.Errorf("%s: err = %v, want 400 %s", tt.name, err, tt.code)
			continue
		}
		if !iys.IsValidation(err) || iys.IsRetryable(err) || iys.IsRateLimited(err) || iys.IsAuth(err) {
			t.Errorf("%s: %v classified as retryable or not validation", tt.name, err)
		}
	}
	st := e.s.IYSStats()
	if diff := cmp.Diff(map[string]int{"H174": 1, "H175": 1, "H178": 1}, st.AddsRefused); diff != "" {
		t.Errorf("refused (-want +got):\n%s", diff)
	}
	if st.AddsReceived != 3 || st.AddsAccepted != 0 {
		t.Errorf("received %d (want 3: no retries), accepted %d", st.AddsReceived, st.AddsAccepted)
	}
	if cs := e.s.IYSConsents(); cs[0].Status != "ONAY" || cs[1].Status != "RET" || cs[1].Source != "IYS_KISAMESAJ" {
		t.Errorf("a refused add changed a consent: %+v", cs)
	}
}

// Changes İYS would refuse are refused before anything is sent, token request included.
func TestAddConsentValidatesLocally(t *testing.T) {
	t.Parallel()
	clk := newClock()
	e := newEnv(t, sandbox.Options{}, clk)
	c := e.client(t, nil)
	now := clk.Now()
	ok := smsRET("+905321234567", now)
	for _, tt := range []struct {
		name   string
		edit   func(*iys.ConsentChange)
		is     error
		phrase string
	}{
		{"trunk zero", func(ch *iys.ConsentChange) { ch.Recipient = "+9005321234567" }, iys.ErrInvalidPhone, "İYS"},
		{"e-mail for MESAJ", func(ch *iys.ConsentChange) { ch.Recipient = "ali@example.com" }, iys.ErrInvalidPhone, ""},
		{"phone for EPOSTA", func(ch *iys.ConsentChange) { ch.Type = iys.TypeEmail }, iys.ErrInvalidEmail, ""},
		{"unknown type", func(ch *iys.ConsentChange) { ch.Type = "SMS" }, iys.ErrInvalidType, "MESAJ, EPOSTA or ARAMA"},
		{"no recipient type", func(ch *iys.ConsentChange) { ch.RecipientType = "" }, nil, "BIREYSEL for a consumer"},
		{"unknown recipient type", func(ch *iys.ConsentChange) { ch.RecipientType = "KURUMSAL" }, nil, "BIREYSEL or TACIR"},
		{"status RED", func(ch *iys.ConsentChange) { ch.Status = "RED" }, nil, "ONAY or RET"},
		{"no source", func(ch *iys.ConsentChange) { ch.Source = "" }, nil, "HS_MESAJ"},
		{"citizen's source", func(ch *iys.ConsentChange) { ch.Source = "IYS_KISAMESAJ" }, nil, "set by İYS only"},
		{"unknown source", func(ch *iys.ConsentChange) { ch.Source = "HS_SMS" }, nil, "HS_EPOSTA"},
		{"HS_KARAR approving", func(ch *iys.ConsentChange) { ch.Source, ch.Status = "HS_KARAR", iys.StatusApproved }, nil, "only set RET"},
		{"no date", func(ch *iys.ConsentChange) { ch.ConsentDate = time.Time{} }, nil, "consent date is required"},
		{"future date", func(ch *iys.ConsentChange) { ch.ConsentDate = now.Add(time.Second) }, nil, "in the future"},
		{"before İYS", func(ch *iys.ConsentChange) { ch.ConsentDate = time.Date(2015, 4, 30, 23, 59, 59, 0, iys.Istanbul()) }, nil, "HS_2015"},
		{"HS_2015 date", func(ch *iys.ConsentChange) { ch.Source, ch.Status, ch.ConsentDate = "HS_2015", iys.StatusApproved, now }, nil, "2015-05-01 00:00:00"},
	} {
		ch := ok
		tt.edit(&ch)
		_, err := c.AddConsent(context.Background(), ch)
		if !errors.Is(err, iys.ErrInvalidChange) || (tt.is != nil && !errors.Is(err, tt.is)) || !strings.Contains(err.Error(), tt.phrase) {
			t.Errorf("%s: err = %v", tt.name, err)
		}
	}
	if st := e.s.IYSStats(); st.Requests != 0 || st.TokenRequests != 0 {
		t.Errorf("invalid changes reached İYS: %+v", st)
	}
	// TACIR needs neither source nor date on a first add.
	tacir := iys.ConsentChange{Recipient: "+905321234567", Type: iys.TypeCall, RecipientType: iys.RecipientMerchant, Status: iys.StatusApproved}
	if _, err := c.AddConsent(context.Background(), tacir); err != nil {
		t.Errorf("TACIR without source or date: %v", err)
	}
}

// Retries after 5xx, a new token after a 401, and a resend after a broken answer: the change is made
// exactly once.
func TestAddConsentRetriesOnce(t *testing.T) {
	t.Parallel()
	clk := newClock()
	e := newEnv(t, sandbox.Options{}, clk)
	e.seedApproved(t, "+905321000001", "+905321000002", "+905321000003")
	c := e.client(t, func(cfg *iys.Config) { cfg.MaxRetryWait = 20 * time.Millisecond })
	ctx := context.Background()
	key := func(p string) string { return sandbox.IYSAddKey(p, "MESAJ", "BIREYSEL") }

	e.s.SetIYSFaults(sandbox.IYSFaults{ServerError: 1, Unavailable: 1})
	if _, err := c.AddConsent(ctx, smsRET("+905321000001", clk.Now())); err != nil {
		t.Fatal(err)
	}
	e.s.ExpireIYSTokens()
	if _, err := c.AddConsent(ctx, smsRET("+905321000002", clk.Now())); err != nil {
		t.Fatal(err)
	}
	st := e.s.IYSStats()
	if st.ByCode["H103"] != 1 || st.ByCode["H192"] != 1 || st.Unauthenticated != 1 || st.RefreshGrants != 1 ||
		st.AddsReceived != 2 || st.AddsAccepted != 2 || st.AddsAcceptedByKey[key("+905321000001")] != 1 || st.AddsAcceptedByKey[key("+905321000002")] != 1 {
		t.Errorf("stats %+v", st)
	}

	// The answer is lost after İYS made the change: the caller resends, and İYS does not make it again.
	ch := smsRET("+905321000003", clk.Now())
	e.s.SetIYSFaults(sandbox.IYSFaults{Malformed: 1})
	if _, err := c.AddConsent(ctx, ch); !errors.Is(err, iys.ErrMalformedResponse) {
		t.Fatalf("err = %v, want ErrMalformedResponse", err)
	}
	clk.Advance(2 * time.Second)
	res, err := c.AddConsent(ctx, ch)
	if err != nil {
		t.Fatal(err)
	}
	if rec, err := c.Status(ctx, iys.RecipientIndividual, iys.TypeMessage, "+905321000003"); err != nil || rec.TransactionID != res.TransactionID || rec.Status != "RET" {
		t.Errorf("status %+v %v, resend %+v", rec, err, res)
	}
	if st := e.s.IYSStats(); st.AddsAcceptedByKey[key("+905321000003")] != 1 || st.AddsReplayed != 1 {
		t.Errorf("after the resend: accepted %v, replayed %d", st.AddsAcceptedByKey, st.AddsReplayed)
	}

	// Retries used up: the 5xx comes back retryable, and nothing was received.
	c1 := e.client(t, func(cfg *iys.Config) { cfg.MaxRetries = 1; cfg.MaxRetryWait = 20 * time.Millisecond })
	e.s.SetIYSFaults(sandbox.IYSFaults{ServerError: 5})
	before := e.s.IYSStats().AddsReceived
	_, err = c1.AddConsent(ctx, smsRET("+905321000009", clk.Now()))
	var ae *iys.APIError
	if !errors.As(err, &ae) || ae.Status != 500 || !iys.IsRetryable(err) || iys.IsValidation(err) {
		t.Errorf("err = %v", err)
	}
	if st := e.s.IYSStats(); st.AddsReceived != before || st.ByCode["H103"] != 1+2 {
		t.Errorf("received %d (before %d), H103 %d", st.AddsReceived, before, st.ByCode["H103"])
	}
}

// A batch: empty results until İYS processed it, per-index outcomes, done once nothing is enqueued;
// resubmitting it after a lost answer records nothing twice.
func TestAddConsentsBatch(t *testing.T) {
	t.Parallel()
	clk := newClock()
	e := newEnv(t, sandbox.Options{}, clk)
	e.seedApproved(t, "+905321000001", "+905321000002")
	if err := e.s.SetIYSSettings(sandbox.IYSSettings{BatchDelayMS: 300_000, BatchEnqueueMS: 100}); err != nil {
		t.Fatal(err)
	}
	c := e.client(t, nil)
	ctx := context.Background()
	changes := []iys.ConsentChange{
		smsRET("05321000001", clk.Now()),
		smsRET("+905321000009", clk.Now()), // no record: H175
		{Recipient: "+905321000002", Type: iys.TypeMessage, RecipientType: iys.RecipientIndividual, Status: iys.StatusApproved,
			Source: "HS_WEB", ConsentDate: clk.Now()}, // ONAY already: H174
	}
	id, err := c.AddConsents(ctx, changes)
	if err != nil {
		t.Fatal(err)
	}
	items, done, err := c.AddResults(ctx, id)
	if err != nil || done || items != nil {
		t.Fatalf("before the delay: %+v %v %v", items, done, err)
	}
	clk.Advance(5 * time.Minute)
	items, done, err = c.AddResults(ctx, id)
	if err != nil || done || len(items) != 3 {
		t.Fatalf("after the delay: %+v %v %v", items, done, err)
	}
	if items[0].Status != iys.AddSuccess || !txHex.MatchString(items[0].TransactionID) || items[0].Err != nil ||
		items[1].Status != iys.AddFailure || items[1].Err == nil || items[1].Err.Code != "H175" || items[1].Index != 1 || *items[1].Err.Index != 1 ||
		items[2].Status != iys.AddEnqueue || items[2].Index != 2 {
		t.Fatalf("items %+v", items)
	}
	if msg := items[1].Err.Error(); !strings.Contains(msg, "item 1 H175") || strings.Contains(msg, "HTTP") {
		t.Errorf("item error reads %q", msg)
	}
	clk.Advance(100 * time.Millisecond)
	items, done, err = c.AddResults(ctx, id)
	if err != nil || !done || len(items) != 3 || items[2].Status != iys.AddFailure || items[2].Err.Code != "H174" {
		t.Fatalf("after the enqueue delay: %+v %v %v", items, done, err)
	}
	if rec, err := c.Status(ctx, iys.RecipientIndividual, iys.TypeMessage, "+905321000001"); err != nil || rec.Status != "RET" || rec.TransactionID != items[0].TransactionID {
		t.Errorf("status %+v %v", rec, err)
	}

	// Resubmitted (say the 202 was lost): a new request, the stored item answered with its first ID.
	id2, err := c.AddConsents(ctx, changes)
	if err != nil || id2 == id {
		t.Fatalf("resubmit: %q %v", id2, err)
	}
	clk.Advance(5*time.Minute + 100*time.Millisecond)
	again, done, err := c.AddResults(ctx, id2)
	if err != nil || !done || again[0].TransactionID != items[0].TransactionID || again[1].Err.Code != "H175" {
		t.Errorf("resubmitted: %+v %v %v", again, done, err)
	}
	st := e.s.IYSStats()
	if st.AddsAcceptedByKey[sandbox.IYSAddKey("+905321000001", "MESAJ", "BIREYSEL")] != 1 || st.AddsAccepted != 1 || st.AddsReplayed != 1 || st.AddBatches != 2 {
		t.Errorf("stats %+v", st)
	}
}

// The batch rules are checked before anything is sent.
func TestAddConsentsValidatesLocally(t *testing.T) {
	t.Parallel()
	clk := newClock()
	e := newEnv(t, sandbox.Options{}, clk)
	c := e.client(t, nil)
	ctx := context.Background()
	long := make([]iys.ConsentChange, iys.MaxAddBatch+1)
	for i := range long {
		long[i] = smsRET(fmt.Sprintf("+90532%07d", i), clk.Now())
	}
	bad := []iys.ConsentChange{smsRET("+905321000001", clk.Now()), smsRET("+905321000002", clk.Now()), smsRET("+905321000003", clk.Now().Add(time.Hour))}
	for _, tt := range []struct {
		name    string
		changes []iys.ConsentChange
		phrase  string
	}{
		{"none", nil, "no changes"},
		{"1001", long, "at most 1000"},
		{"repeat in another spelling", []iys.ConsentChange{smsRET("+905321000001", clk.Now()), smsRET("+905321000002", clk.Now()), smsRET("0532 100 00 01", clk.Now())},
			"changes 0 and 2 are for the same recipient"},
		{"invalid item", bad, "change 2: invalid consent change: consent date"},
	} {
		if _, err := c.AddConsents(ctx, tt.changes); !errors.Is(err, iys.ErrInvalidChange) || !strings.Contains(err.Error(), tt.phrase) {
			t.Errorf("%s: err = %v", tt.name, err)
		}
	}
	if _, _, err := c.AddResults(ctx, "12345"); err == nil || !strings.Contains(err.Error(), "request ID") {
		t.Errorf("all-digit request ID: %v", err)
	}
	if st := e.s.IYSStats(); st.Requests != 0 || st.TokenRequests != 0 {
		t.Errorf("invalid batches reached İYS: %+v", st)
	}
	// A full batch of 1000, and the same recipient for MESAJ and ARAMA, are fine.
	e.seedApproved(t, "+905321000001")
	if _, err := c.AddConsents(ctx, long[:iys.MaxAddBatch]); err != nil {
		t.Errorf("1000 changes: %v", err)
	}
	call := smsRET("+905321000001", clk.Now())
	call.Type = iys.TypeCall
	if _, err := c.AddConsents(ctx, []iys.ConsentChange{smsRET("+905321000001", clk.Now()), call}); err != nil {
		t.Errorf("MESAJ and ARAMA: %v", err)
	}
	if st := e.s.IYSStats(); st.AddBatches != 2 || st.AddsReceived != 1002 {
		t.Errorf("stats %+v", st)
	}
}

// An unknown request ID is İYS's 404; a broken result is ErrMalformedResponse, never a partial list.
func TestAddResultsErrors(t *testing.T) {
	t.Parallel()
	clk := newClock()
	e := newEnv(t, sandbox.Options{}, clk)
	c := e.client(t, nil)
	ctx := context.Background()
	_, _, err := c.AddResults(ctx, "5b0c5f7e-1111-4222-8333-444455556666")
	var ae *iys.APIError
	if !errors.As(err, &ae) || ae.Status != 404 || ae.Op != "add_results" || iys.IsRetryable(err) {
		t.Errorf("unknown request: %v", err)
	}
	e.seedApproved(t, "+905321000001")
	id, err := c.AddConsents(ctx, []iys.ConsentChange{smsRET("+905321000001", clk.Now())})
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	e.s.SetIYSFaults(sandbox.IYSFaults{Malformed: 1})
	if items, done, err := c.AddResults(ctx, id); !errors.Is(err, iys.ErrMalformedResponse) || items != nil || done {
		t.Errorf("malformed: %+v %v %v", items, done, err)
	}
	if items, done, err := c.AddResults(ctx, id); err != nil || !done || len(items) != 1 || items[0].Status != iys.AddSuccess {
		t.Errorf("after the fault: %+v %v %v", items, done, err)
	}
}
