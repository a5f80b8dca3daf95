package iys_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/iys"
	"github.com/campaignctl/campaignctl/providers/sandbox"
)

// İYS leaves the changes of its last hour out of the pull, so a sync brings the consents up to date with
// İYS as it was an hour before the sync began: a RET given in İYS ten minutes ago is not here yet, and the
// sync must not say, nor record for the launches' --max-consent-age, that the consents are up to date as
// of now. A re-verification asks İYS itself: it counts from when it began.
func TestASyncIsUpToDateWithIYSAsItWasAnHourBefore(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	fake := sandbox.New(sandbox.Options{}) // İYS's own lag of one hour
	srv := httptest.NewServer(fake)
	defer srv.Close()
	client, err := iys.NewClient(iys.Config{BaseURL: srv.URL, Username: "u", Password: "p", IYSCode: "1", BrandCode: "2",
		RatePerSecond: 1000, MaxRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	const addr = "+905322000071"
	now := time.Now()
	if _, err := fake.AddIYSConsents(
		sandbox.IYSConsent{Recipient: addr, Type: "MESAJ", RecipientType: "BIREYSEL", Status: "ONAY", Source: "HS_WEB",
			ConsentDate: now.Add(-3 * time.Hour).In(iys.Istanbul()).Format(iys.DateLayout), CreationDate: now.Add(-3 * time.Hour).In(iys.Istanbul()).Format(iys.DateLayout)},
		sandbox.IYSConsent{Recipient: addr, Type: "MESAJ", RecipientType: "BIREYSEL", Status: "RET", Source: "IYS_MESAJ",
			ConsentDate: now.Add(-10 * time.Minute).In(iys.Istanbul()).Format(iys.DateLayout)},
	); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	rep, err := iys.Sync(ctx, db, client)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Changes[iys.PullHS] != 1 || rep.Changes[iys.PullIYS] != 0 {
		t.Fatalf("sync pulled %v; want the ONAY of 3 h ago and not the RET of 10 min ago (İYS's last hour is left out)", rep.Changes)
	}
	if d := rep.UpToDateAt.Sub(began.Add(-iys.PullLag)); d < 0 || d > time.Second {
		t.Fatalf("the sync says the consents are up to date as of %s; want an hour before it began (%s): the RET of 10 min ago is not here",
			rep.UpToDateAt.Format(time.RFC3339Nano), began.Add(-iys.PullLag).Format(time.RFC3339Nano))
	}
	age := func(source string) time.Duration {
		var secs float64
		if err := db.QueryRow(ctx, `SELECT extract(epoch FROM now() - last_success_at) FROM iys_sync_state
			WHERE brand_code = '2' AND source = $1`, source).Scan(&secs); err != nil {
			t.Fatalf("%s: %v", source, err)
		}
		return time.Duration(secs * float64(time.Second))
	}
	for _, src := range []string{iys.SourcePullHS, iys.SourcePullIYS} {
		if a := age(src); a < iys.PullLag || a > iys.PullLag+time.Minute {
			t.Fatalf("source %s recorded as brought up to date %v ago; want just over %v (what launches and batches judge)", src, a, iys.PullLag)
		}
	}
	rv, err := iys.Reverify(ctx, db, client, "MESAJ", "BIREYSEL")
	if err != nil || rv.Reverified != 1 || rv.Corrected != 1 {
		t.Fatalf("reverify: %+v %v; want the one consent asked about and corrected to RET", rv, err)
	}
	if a := age(iys.SourceReverify); a < 0 || a > time.Minute {
		t.Fatalf("a re-verification recorded as %v old; want it to count from when it began, seconds ago", a)
	}
	if rv.UpToDateAt.Before(began) || time.Since(rv.UpToDateAt) > time.Minute {
		t.Fatalf("a re-verification says up to date as of %s; want when it began", rv.UpToDateAt.Format(time.RFC3339Nano))
	}
}
