package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/unsubscribe"
	"github.com/campaignctl/campaignctl/iys"
)

// Order: click (RET), the person gives ONAY again (stored by the sync), clicks the link again — all within
// one second. The second click is dated after the new ONAY, the page says "You are unsubscribed", so the
// ONAY must become RET. lastOneClick hands it the first click's event ID, RecordRefusals takes it for a
// repeat, and the ONAY stands.
func TestAOneClickAfterAReconsentWithinASecondRefusesAgain(t *testing.T) {
	db, id, signer, h := oneClickSetup(t)
	ctx := context.Background()
	click := func() (int, string) {
		req := httptest.NewRequest(http.MethodPost, unsubscribe.Path+signer.Token(id, "u1"), strings.NewReader("List-Unsubscribe=One-Click"))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code, w.Body.String()
	}
	status := func() string {
		var s string
		if err := db.QueryRow(ctx, `SELECT status FROM iys_consents WHERE recipient = $1 AND type = 'EPOSTA'`, oneClickAddr).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if code, _ := click(); code != http.StatusOK || status() != "RET" {
		t.Fatalf("first click: %d, consent %s", code, status())
	}
	time.Sleep(10 * time.Millisecond)
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := iys.ApplyChanges(ctx, tx, "654321", []iys.Record{{Recipient: oneClickAddr, Type: "EPOSTA", RecipientType: "BIREYSEL",
		Status: "ONAY", Source: "IYS_WEB", ConsentDate: time.Now()}}, "pull"); err != nil {
		tx.Rollback(ctx) //nolint:errcheck
		t.Fatalf("apply: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if s := status(); s != "ONAY" {
		t.Fatalf("re-consent not stored: %s", s)
	}
	time.Sleep(10 * time.Millisecond)
	code, body := click()
	if code != http.StatusOK || !strings.Contains(body, "You are unsubscribed") {
		t.Fatalf("second click: %d", code)
	}
	if s := status(); s != "RET" {
		t.Fatalf("a click after the new ONAY (within a second of the first click) was answered %q but the consent is still %s: taken for the first click again", "You are unsubscribed", s)
	}
}
