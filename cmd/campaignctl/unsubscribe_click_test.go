package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/internal/unsubscribe"
	"github.com/campaignctl/campaignctl/iys"
	"github.com/campaignctl/campaignctl/providers/receipts"
)

// TestAOneClickAfterConsentGivenAgainRefusesAgain: a person unsubscribes with the one-click link, later gives
// their ONAY again (İYS reports the newer ONAY), then presses the same link of the old e-mail again. The
// page answers "You are unsubscribed" (200), so the refusal was acknowledged to its sender: the newer
// ONAY must have become RET. İYS keeps the latest decision; the click is the latest. Before, every click of
// a link was one event, and the second was taken for a repeat of the first: the page said "You are
// unsubscribed" and the consent stayed ONAY.
//
// The second click comes a while later, or within a second of the first: a click within a second of the
// link's last one is that click again (a double click), but not once a consent was given again since it.
func TestAOneClickAfterConsentGivenAgainRefusesAgain(t *testing.T) {
	for _, later := range []time.Duration{1100 * time.Millisecond, 10 * time.Millisecond} {
		t.Run(later.String(), func(t *testing.T) { oneClickAfterConsentGivenAgain(t, later) })
	}
}

func oneClickAfterConsentGivenAgain(t *testing.T, later time.Duration) {
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
	// Later the person gives their consent again (in İYS, at the citizen's side): the sync stores it.
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
	// A while later, they press the unsubscribe link of the old e-mail again.
	time.Sleep(later)
	code, body := click()
	if code != http.StatusOK || !strings.Contains(body, "You are unsubscribed") {
		t.Fatalf("second click: %d", code)
	}
	if s := status(); s != "RET" {
		t.Fatalf("the page told the person %q (200) but their consent is still %s: the refusal was acknowledged and lost; the next campaign e-mails them", "You are unsubscribed", s)
	}
}

// TestAOneClickMultipartPostUnsubscribes: RFC 8058 §3.1 lets the mail receiver POST the one-click body as
// multipart/form-data or application/x-www-form-urlencoded, and its own example (§8.1) is multipart. Such a
// POST must unsubscribe without further interaction. Before, only a URL-encoded body was read, and the
// RFC's own example was answered 400.
func TestAOneClickMultipartPostUnsubscribes(t *testing.T) {
	db, id, signer, h := oneClickSetup(t)
	ctx := context.Background()
	// The request of RFC 8058 §8.1.
	body := "---FormBoundaryjWmhtjORrn\r\nContent-Disposition: form-data; name=\"List-Unsubscribe\"\r\n\r\nOne-Click\r\n---FormBoundaryjWmhtjORrn--\r\n"
	req := httptest.NewRequest(http.MethodPost, unsubscribe.Path+signer.Token(id, "u1"), strings.NewReader(body))
	req.Header.Set("Content-Type", "multipart/form-data; boundary=-FormBoundaryjWmhtjORrn")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	var s string
	if err := db.QueryRow(ctx, `SELECT status FROM iys_consents WHERE recipient = $1 AND type = 'EPOSTA'`, oneClickAddr).Scan(&s); err != nil {
		t.Fatal(err)
	}
	if w.Code != http.StatusOK || s != "RET" {
		t.Fatalf("RFC 8058 one-click POST (multipart/form-data, the RFC's own example): %d %q; consent still %s", w.Code, strings.TrimSpace(w.Body.String()), s)
	}
}

// A commercial e-mail's one-click link carries the recipient's user_id; a user_id longer than a link can
// carry (unsubscribe.MaxUserID) is bad input for such a launch, named with the fix, and nothing is
// written. A transactional e-mail carries no link and takes it.
func TestALaunchWithLinksRefusesAUserIDTooLongForThem(t *testing.T) {
	t.Parallel()
	env, count := badInputDB(t)
	env["WEBHOOKS_PUBLIC_URL"], env["UNSUBSCRIBE_SECRET"] = "https://hooks.example.com", "a-secret-of-enough-length-0123"
	audience := mailAudience(t, env, "('a', 'a@example.com'), (repeat('x', 600), 'b@example.com')")
	args := []string{"launch", "--name", "m", "--channel", "email", "--audience", audience, "--subject", "Merhaba", "--message", "Size özel"}
	if _, stderr, code := cli(t, env, append(args, "--yes")...); code != 2 || !strings.Contains(stderr, "600 bytes") || !strings.Contains(stderr, "shorter key") {
		t.Fatalf("launch with a 600-byte user_id: exit %d, %s; want 2 naming its length and the fix", code, stderr)
	}
	if n := count(`SELECT count(*) FROM campaigns`); n != 0 {
		t.Fatalf("the refused launch left %d campaigns", n)
	}
	if _, stderr, code := cli(t, env, append(args, "--transactional", "--dry-run")...); code != 0 {
		t.Fatalf("a transactional e-mail carries no link: exit %d, %s", code, stderr)
	}
}

// oneClickAddr is the address oneClickSetup's recipient was sent to.
const oneClickAddr = "kisi@example.com"

// oneClickSetup makes a completed e-mail campaign whose recipient u1 (oneClickAddr, ONAY ten days ago) was sent,
// and the handler of its one-click links.
func oneClickSetup(t *testing.T) (*pgxpool.Pool, int64, linkSigner, http.Handler) {
	t.Helper()
	db, _ := testdb.New(t)
	ctx := context.Background()
	var id int64
	if err := db.QueryRow(ctx, `INSERT INTO campaigns (name, channel, state, message, audience_sql, batch_size, brand_code)
		VALUES ('m', 'email', 'completed', 'x', 'SELECT 1', 100, '654321') RETURNING id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO campaign_recipients (campaign_id, user_id, address, batch, status) VALUES ($1, 'u1', $2, 0, 'sent')`, id, oneClickAddr); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO iys_consents (recipient, type, recipient_type, brand_code, status, source, consent_date)
		VALUES ($1, 'EPOSTA', 'BIREYSEL', '654321', 'ONAY', 'HS_WEB', now() - interval '10 days')`, oneClickAddr); err != nil {
		t.Fatal(err)
	}
	signer, err := unsubscribe.New("hunt-unsubscribe-secret-0123456789", "https://hooks.example.com")
	if err != nil {
		t.Fatal(err)
	}
	c, err := campaign.NewStore(db).Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	h := unsubscribeHandler(signer, campaign.NewStore(db), &refusalSink{pool: db, brand: "654321", log: log}, 0, log)
	return db, id, linkSigner{signer, c.Nonce()}, h
}

// linkSigner signs the links of one campaign as a worker does: with the campaign's nonce.
type linkSigner struct {
	*unsubscribe.Signer
	nonce string
}

// Token is the token of the link of user of campaign id.
func (s linkSigner) Token(id int64, user string) string {
	return s.Signer.Token(unsubscribe.Link{CampaignID: id, Nonce: s.nonce, UserID: user})
}

// The audit of a one-click refusal names the campaign and the user without the user's ID in clear when that
// ID is an e-mail address: the evidence is masked where it is written, not only where iys outbox shows it.
func TestAOneClickRefusalsEvidenceMasksTheUserID(t *testing.T) {
	db, id, signer, h := oneClickSetup(t)
	ctx := context.Background()
	const user, addr = "zeynep.kaya@example.com", "zeynep.kaya@example.com"
	if _, err := db.Exec(ctx, `INSERT INTO campaign_recipients (campaign_id, user_id, address, batch, status) VALUES ($1, $2, $3, 0, 'sent')`, id, user, addr); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO iys_consents (recipient, type, recipient_type, brand_code, status, source, consent_date)
		VALUES ($1, 'EPOSTA', 'BIREYSEL', '654321', 'ONAY', 'HS_WEB', now() - interval '10 days')`, addr); err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, unsubscribe.Path+signer.Token(id, user), strings.NewReader("List-Unsubscribe=One-Click"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	var evidence string
	if err := db.QueryRow(ctx, `SELECT evidence FROM refusals WHERE via = 'one_click'`).Scan(&evidence); err != nil {
		t.Fatalf("one-click POST answered %d; its refusal: %v", w.Code, err)
	}
	if !strings.Contains(evidence, fmt.Sprintf("unsubscribe link of campaign %d, user ", id)) || strings.Contains(evidence, "zeynep") || strings.Contains(evidence, "kaya") {
		t.Fatalf("the refusal's evidence %q; want the campaign and the user named, the user ID masked", evidence)
	}
}

// TestADoubleClickAcrossASecondsTurnIsOneRefusal: a double click (or a mail client's retry) whose two
// POSTs fall on either side of a second's turn is one refusal, not two: the second click finds the first
// recorded within the second before it. Before, a click's event was its second, and such a pair made two
// refusals in the audit (TestRefusalsThroughTheMessagesCloseTheLoop failed now and then).
func TestADoubleClickAcrossASecondsTurnIsOneRefusal(t *testing.T) {
	db, id, signer, h := oneClickSetup(t)
	ctx := context.Background()
	click := func() int {
		req := httptest.NewRequest(http.MethodPost, unsubscribe.Path+signer.Token(id, "u1"), strings.NewReader("List-Unsubscribe=One-Click"))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code
	}
	// The first click lands in the last tenth of a second, the second just after the turn.
	now := time.Now()
	at := now.Truncate(time.Second).Add(920 * time.Millisecond)
	if at.Before(now) {
		at = at.Add(time.Second)
	}
	time.Sleep(time.Until(at))
	first := time.Now()
	if code := click(); code != http.StatusOK {
		t.Fatalf("first click: %d", code)
	}
	time.Sleep(first.Truncate(time.Second).Add(time.Second + 30*time.Millisecond).Sub(time.Now()))
	if code := click(); code != http.StatusOK {
		t.Fatalf("second click: %d", code)
	}
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM refusals WHERE via = 'one_click'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("a double click across a second's turn made %d refusals, want 1", n)
	}
}

// A one-click link refuses the brand whose campaign sent it: another brand's consent of the same address
// stays ONAY and nothing is queued for İYS under it. So does a SendGrid group_unsubscribe that names its
// campaign; a global unsubscribe refuses every brand.
func TestARefusalThroughACampaignRefusesItsBrandOnly(t *testing.T) {
	t.Parallel()
	db, id, signer, h := oneClickSetup(t)
	ctx := context.Background()
	if _, err := db.Exec(ctx, `INSERT INTO iys_consents (recipient, type, recipient_type, brand_code, status, source, consent_date)
		VALUES ($1, 'EPOSTA', 'BIREYSEL', '777777', 'ONAY', 'HS_WEB', now() - interval '10 days'),
		       ('grup@example.com', 'EPOSTA', 'BIREYSEL', '654321', 'ONAY', 'HS_WEB', now() - interval '10 days'),
		       ('grup@example.com', 'EPOSTA', 'BIREYSEL', '777777', 'ONAY', 'HS_WEB', now() - interval '10 days'),
		       ('hepsi@example.com', 'EPOSTA', 'BIREYSEL', '654321', 'ONAY', 'HS_WEB', now() - interval '10 days'),
		       ('hepsi@example.com', 'EPOSTA', 'BIREYSEL', '777777', 'ONAY', 'HS_WEB', now() - interval '10 days')`, oneClickAddr); err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, unsubscribe.Path+signer.Token(id, "u1"), strings.NewReader("List-Unsubscribe=One-Click"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != http.StatusOK {
		t.Fatalf("one-click POST: %d %s", w.Code, w.Body.String())
	}
	sink := &refusalSink{pool: db, brand: "654321", log: slog.New(slog.DiscardHandler)}
	if err := sink.Refuse(ctx, []receipts.Refusal{
		{Provider: "sendgrid", Channel: receipts.ChannelEmail, Address: "grup@example.com", CampaignID: id, UserID: "u2",
			Kind: receipts.RefusalGroupUnsubscribe, EventID: "sg-group-1", At: time.Now()},
		{Provider: "sendgrid", Channel: receipts.ChannelEmail, Address: "hepsi@example.com", CampaignID: id, UserID: "u3",
			Kind: receipts.RefusalUnsubscribe, EventID: "sg-all-1", At: time.Now()},
	}); err != nil {
		t.Fatal(err)
	}
	want := map[[2]string]string{
		{oneClickAddr, "654321"}: "RET", {oneClickAddr, "777777"}: "ONAY",
		{"grup@example.com", "654321"}: "RET", {"grup@example.com", "777777"}: "ONAY",
		{"hepsi@example.com", "654321"}: "RET", {"hepsi@example.com", "777777"}: "RET",
	}
	for k, st := range want {
		var got string
		db.QueryRow(ctx, `SELECT status FROM iys_consents WHERE recipient = $1 AND brand_code = $2`, k[0], k[1]).Scan(&got) //nolint:errcheck
		if got != st {
			t.Errorf("%s under brand %s: %s, want %s", k[0], k[1], got, st)
		}
	}
	var queued int
	db.QueryRow(ctx, `SELECT count(*) FROM iys_outbox WHERE brand_code = '777777'`).Scan(&queued) //nolint:errcheck
	if queued != 1 {
		t.Errorf("%d RETs queued under the other brand, want 1 (the global unsubscribe's)", queued)
	}
}

// The one-click link came in the message: used, it proves the message reached the person. A recipient
// recorded unknown (its answer lost) whose link is used is sent, delivered, and `resume --resend-unknown`
// leaves it alone (it stayed unknown, and a resend then found the refusal and recorded it skipped: never
// sent); one pending again for a resend keeps the receipt, and is recorded sent without a second message. A recipient pending and never sent (which has
// no link to use in the world; a test can sign one) is only refused: nothing says its message went out.
func TestAOneClickOfAnUnknownRecipientProvesItsMessageWasDelivered(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, set, want string
		delivered       bool
	}{
		{"unknown", `status = 'unknown'`, "sent", true},
		// Its receipt is kept on the row; the batch's next run records it sent without sending (LeaseChunk's
		// Accepted), as for any receipt that comes first.
		{"pending again for a resend", `status = 'unknown'; UPDATE campaign_recipients SET status = 'pending'`, "pending", true},
		{"pending, never sent", `status = 'pending'`, "pending", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db, id, signer, h := oneClickSetup(t)
			ctx := context.Background()
			if _, err := db.Exec(ctx, `UPDATE campaign_recipients SET `+tc.set+` WHERE user_id = 'u1'`); err != nil {
				t.Fatal(err)
			}
			req := httptest.NewRequest(http.MethodPost, unsubscribe.Path+signer.Token(id, "u1"), strings.NewReader("List-Unsubscribe=One-Click"))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			var status string
			var delivery *string
			if err := db.QueryRow(ctx, `SELECT status, delivery FROM campaign_recipients WHERE campaign_id = $1 AND user_id = 'u1'`, id).Scan(&status, &delivery); err != nil {
				t.Fatal(err)
			}
			if w.Code != http.StatusOK || status != tc.want || (delivery != nil && *delivery == receipts.StatusDelivered) != tc.delivered {
				t.Fatalf("one-click of a recipient %s: %d, recipient %s (delivery %v); want 200, %s, delivered %v", tc.name, w.Code, status, delivery, tc.want, tc.delivered)
			}
			// The evidence is named as what it was, on the row and in the audit: the link used, not a
			// receipt the provider never sent.
			var reason, via, audited *string
			if err := db.QueryRow(ctx, `SELECT reason, delivery_via, (SELECT reason FROM send_log l WHERE l.campaign_id = r.campaign_id AND l.user_id = r.user_id AND l.status = 'sent' ORDER BY id DESC LIMIT 1)
				FROM campaign_recipients r WHERE campaign_id = $1 AND user_id = 'u1'`, id).Scan(&reason, &via, &audited); err != nil {
				t.Fatal(err)
			}
			if tc.delivered && (via == nil || *via != "one_click") {
				t.Errorf("one-click of a recipient %s: delivery_via %v, want one_click", tc.name, via)
			}
			if tc.want == "sent" {
				const want = "accepted by the provider (the recipient used its unsubscribe link)"
				if reason == nil || *reason != want || audited == nil || *audited != want {
					t.Errorf("one-click of a recipient %s: reason %v, audited %v; want %q for both", tc.name, reason, audited, want)
				}
			}
		})
	}
}

// UNSUBSCRIBE_MAILTO goes into every commercial e-mail's List-Unsubscribe header: only one plain address
// is taken. A line break in it would have started headers of its own (a Bcc), a name or brackets would
// have broken the header's <mailto:…>; each is refused as a usage error naming the variable.
func TestUnsubscribeMailtoIsOnePlainAddress(t *testing.T) {
	for value, ok := range map[string]bool{
		"":                                   true,
		"cikis@example.com":                  true,
		"unsubscribe+tr@mail.example.com.tr": true,
		"cikis@example.com>\r\nBcc: evil@x.com\r\nX-A: <b": false,
		"not an address":               false,
		"Çıkış <cikis@example.com>":    false,
		"<cikis@example.com>":          false,
		"cikis@example.com?subject=x":  false,
		"a@example.com, b@example.com": false,
	} {
		a := &app{stdout: io.Discard, stderr: io.Discard, getenv: func(k string) string {
			if k == unsubMailtoEnv {
				return value
			}
			return ""
		}}
		got, err := a.unsubscribeMailto()
		var ue usageError
		switch {
		case ok && (err != nil || got != value):
			t.Errorf("%q: %q, %v; want it taken as it is", value, got, err)
		case !ok && !errors.As(err, &ue):
			t.Errorf("%q: %q, %v; want a usage error", value, got, err)
		case !ok && (!strings.Contains(err.Error(), unsubMailtoEnv) || strings.ContainsAny(err.Error(), "\r\n")):
			t.Errorf("%q: %v; want the variable named, and no line break quoted raw", value, err)
		}
	}
}

// TestALinkOfAnotherCampaignWithTheSameIDRefusesNobody: the engine database was re-created (or another
// engine signs with the same UNSUBSCRIBE_SECRET), so an old e-mail's link names campaign 1 and user u1,
// and this database's campaign 1 has a user u1 too, at another address. The old link must refuse nobody
// here: the person who clicks it is not this u1, and a RET in this u1's name would be reported to İYS.
// The link carries its campaign's nonce; one that names another campaign's is a link of no recipient
// (404), for GET and POST alike. A link of an earlier version, without a nonce, is still taken. Before,
// a link named its campaign by ID alone, and the old link turned this u1's consent RET.
func TestALinkOfAnotherCampaignWithTheSameIDRefusesNobody(t *testing.T) {
	t.Parallel()
	db, id, signer, h := oneClickSetup(t)
	ctx := context.Background()
	serve := func(method string, l unsubscribe.Link) int {
		var body io.Reader
		if method == http.MethodPost {
			body = strings.NewReader("List-Unsubscribe=One-Click")
		}
		req := httptest.NewRequest(method, unsubscribe.Path+signer.Signer.Token(l), body)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code
	}
	consent := func() (status string, refusals int) {
		t.Helper()
		if err := db.QueryRow(ctx, `SELECT status, (SELECT count(*) FROM refusals) FROM iys_consents
			WHERE recipient = $1 AND type = 'EPOSTA'`, oneClickAddr).Scan(&status, &refusals); err != nil {
			t.Fatal(err)
		}
		return status, refusals
	}
	// The old campaign 1 was made a day before this one.
	var created time.Time
	if err := db.QueryRow(ctx, `SELECT created_at FROM campaigns WHERE id = $1`, id).Scan(&created); err != nil {
		t.Fatal(err)
	}
	old := (&campaign.Campaign{ID: id, CreatedAt: created.Add(-24 * time.Hour)}).Nonce()
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		if code := serve(method, unsubscribe.Link{CampaignID: id, Nonce: old, UserID: "u1"}); code != http.StatusNotFound {
			t.Errorf("%s of another campaign's link with the same ID: %d, want 404", method, code)
		}
	}
	if s, n := consent(); s != "ONAY" || n != 0 {
		t.Fatalf("after another campaign's link: consent %s, %d refusals; want ONAY and none", s, n)
	}
	// This campaign's link refuses; so does a link without a nonce (an earlier version's).
	if code := serve(http.MethodPost, unsubscribe.Link{CampaignID: id, UserID: "u1"}); code != http.StatusOK {
		t.Fatalf("a link without a nonce: %d, want 200", code)
	}
	if s, n := consent(); s != "RET" || n != 1 {
		t.Fatalf("after a link without a nonce: consent %s, %d refusals; want RET and one", s, n)
	}
	if code := serve(http.MethodPost, unsubscribe.Link{CampaignID: id, Nonce: signer.nonce, UserID: "u1"}); code != http.StatusOK {
		t.Fatalf("this campaign's link: %d, want 200", code)
	}
}
