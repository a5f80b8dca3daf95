package iys_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/iys"
)

// hookTransport runs before once, just before the first request whose method and path (and query, when
// set: a part of it) match reaches İYS.
type hookTransport struct {
	method, pathSuffix, query string
	once                      sync.Once
	before                    func()
}

func (h *hookTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == h.method && strings.HasSuffix(r.URL.Path, h.pathSuffix) && strings.Contains(r.URL.RawQuery, h.query) {
		h.once.Do(h.before)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// A push sends a waiting RET (refusal at t1); İYS registers it; the push is killed before it marks the
// row. The next push reads the row (still waiting, t1) and sends it again. While that request is on the
// way, the person gives consent again in İYS (ONAY t2, accepted: İYS holds RET t1; pulled here) and
// refuses again (t3): the second refusal moves the same waiting row to t3 (outboxOneWaitingSQL). The
// push's request still carries t1; İYS answers it as the identical V2 add it stored already (same
// transactionId) — or H178 — and the push records that answer on the row, which now stands for the t3
// refusal: reported registered (or refused), never sent. İYS keeps ONAY t2; the t3 refusal is lost.
func TestARefusalMovingAWaitingRETWhileItIsSentIsNotLost(t *testing.T) {
	const addr = "+905324444443"
	e, pool, brand, base, plain := onayOnBothSides(t, addr)
	ctx := context.Background()
	t1, t2, t3 := base, base.Add(time.Hour), base.Add(2*time.Hour)

	if rep, err := iys.RecordRefusals(ctx, pool, brand, []iys.Refusal{{Via: iys.ViaTwilioInbound, EventID: "SM1", Kind: "inbound",
		Recipient: addr, Type: "MESAJ", Evidence: "RET", At: t1}}); err != nil || rep.Outboxed != 1 {
		t.Fatalf("first refusal: %+v %v", rep, err)
	}

	// The first push: İYS registers RET t1, then the pusher is killed before finish() marks the row.
	if _, err := plain.AddConsent(ctx, iys.ConsentChange{Recipient: addr, Type: "MESAJ", RecipientType: "BIREYSEL", Status: "RET",
		Source: iys.SourceSMS, ConsentDate: t1}); err != nil {
		t.Fatal(err)
	}

	hook := &hookTransport{method: http.MethodPost, pathSuffix: "/consents", before: func() {
		// The person gives consent again on the brand's site: registered in İYS, and pulled here.
		if _, err := plain.AddConsent(ctx, iys.ConsentChange{Recipient: addr, Type: "MESAJ", RecipientType: "BIREYSEL", Status: "ONAY",
			Source: "HS_WEB", ConsentDate: t2}); err != nil {
			t.Error(err)
			return
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		if _, err := iys.ApplyChanges(ctx, tx, brand, []iys.Record{{Recipient: addr, Type: "MESAJ", RecipientType: "BIREYSEL",
			Status: "ONAY", Source: "HS_WEB", ConsentDate: t2, CreationDate: t2}}, iys.OriginPull); err != nil {
			t.Error(err)
			return
		}
		if err := tx.Commit(ctx); err != nil {
			t.Error(err)
			return
		}
		// And refuses again at t3: the consent turns RET here, the waiting RET takes t3.
		rep, err := iys.RecordRefusals(ctx, pool, brand, []iys.Refusal{{Via: iys.ViaTwilioInbound, EventID: "SM2", Kind: "inbound",
			Recipient: addr, Type: "MESAJ", Evidence: "RET", At: t3}})
		if err != nil || rep.Revoked != 1 {
			t.Errorf("second refusal: %+v %v", rep, err)
		}
	}}
	c := e.client(t, func(cfg *iys.Config) { cfg.HTTPClient = &http.Client{Transport: hook} })

	for i := 0; i < 2; i++ {
		rep, err := iys.Push(ctx, pool, c, iys.PushOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("push %d: %+v", i+1, rep)
	}
	items, _ := iys.OutboxItems(ctx, pool, time.Now(), 0)
	for _, it := range items {
		t.Logf("outbox row %d: state %s code %s consent_date %s", it.ID, it.State, it.ErrorCode, it.RefusedAt.In(iys.Istanbul()).Format(iys.DateLayout))
	}
	if st := consentStatus(t, pool, addr, "MESAJ", "BIREYSEL", brand); st != "RET" {
		t.Fatalf("here: %s, want RET", st)
	}
	want := "RET " + t3.In(iys.Istanbul()).Format(iys.DateLayout)
	if got := iysStatus(e, addr); got != want {
		t.Fatalf("İYS holds %q, want %q: the second refusal, recorded while the first one's RET was being sent, never reached İYS", got, want)
	}
}
