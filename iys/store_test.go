package iys_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/iys"
)

// stored is a consent row as the tests compare it.
type stored struct {
	Recipient, Type, RecipientType, Status, Source string
	ConsentDate                                    string // in Istanbul, iys.DateLayout
}

func dump(t *testing.T, pool *pgxpool.Pool) []stored {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT recipient, type, recipient_type, status, source, consent_date FROM iys_consents
		ORDER BY recipient, type, recipient_type`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []stored
	for rows.Next() {
		var s stored
		var d time.Time
		if err := rows.Scan(&s.Recipient, &s.Type, &s.RecipientType, &s.Status, &s.Source, &d); err != nil {
			t.Fatal(err)
		}
		s.ConsentDate = d.In(iys.Istanbul()).Format(iys.DateLayout)
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func importString(t *testing.T, pool *pgxpool.Pool, csv string) (iys.ImportReport, error) {
	t.Helper()
	return iys.Import(context.Background(), pool, strings.NewReader(csv), iys.ImportOptions{})
}

func mustImport(t *testing.T, pool *pgxpool.Pool, csv string) iys.ImportReport {
	t.Helper()
	rep, err := importString(t, pool, csv)
	if err != nil {
		t.Fatalf("Import: %v", err)
	}
	return rep
}

func TestImportHappyPath(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.New(t)
	csv := "\uFEFF" + iys.Header + "\r\n" +
		"0532 123 45 67,MESAJ,BIREYSEL,ONAY,HS_WEB,2024-05-17 14:30:00\r\n" +
		"+905321234567,ARAMA,BIREYSEL,RET,,2024-05-17 14:30:00\r\n" +
		"5331234567,MESAJ,TACIR,ONAY,HS_FIZIKSEL_ORTAM,2023-12-31 23:59:59\r\n" +
		" Ayse.Yilmaz@Example.COM ,EPOSTA,BIREYSEL,ONAY,HS_EPOSTA,2024-01-01 00:00:00\r\n" +
		"\r\n" +
		"\"+1 415 555 2671\",MESAJ,BIREYSEL,ONAY,\"HS_WEB, kampanya\",2024-02-29 09:00:00\r\n"
	var calls atomic.Int64
	var last atomic.Int64
	rep, err := iys.Import(context.Background(), pool, strings.NewReader(csv), iys.ImportOptions{Progress: func(n int64) {
		calls.Add(1)
		last.Store(n)
	}})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(iys.ImportReport{Rows: 5, Inserted: 5}, rep); diff != "" {
		t.Errorf("report (-want +got):\n%s", diff)
	}
	if calls.Load() == 0 || last.Load() != 5 {
		t.Errorf("progress: %d calls, last %d; want the final call to say 5", calls.Load(), last.Load())
	}
	want := []stored{
		{"+14155552671", "MESAJ", "BIREYSEL", "ONAY", "HS_WEB, kampanya", "2024-02-29 09:00:00"},
		{"+905321234567", "ARAMA", "BIREYSEL", "RET", "", "2024-05-17 14:30:00"},
		{"+905321234567", "MESAJ", "BIREYSEL", "ONAY", "HS_WEB", "2024-05-17 14:30:00"},
		{"+905331234567", "MESAJ", "TACIR", "ONAY", "HS_FIZIKSEL_ORTAM", "2023-12-31 23:59:59"},
		{"ayse.yilmaz@example.com", "EPOSTA", "BIREYSEL", "ONAY", "HS_EPOSTA", "2024-01-01 00:00:00"},
	}
	if diff := cmp.Diff(want, dump(t, pool)); diff != "" {
		t.Errorf("iys_consents (-want +got):\n%s", diff)
	}

	// Dates are Turkey time: 14:30 in Istanbul is 11:30 UTC.
	c, err := iys.Lookup(context.Background(), pool, "0532 123 45 67", iys.TypeMessage, iys.RecipientIndividual)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.ConsentDate.UTC(), time.Date(2024, 5, 17, 11, 30, 0, 0, time.UTC); !got.Equal(want) {
		t.Errorf("consent_date = %v, want %v", got, want)
	}
	if c.Status != iys.StatusApproved || c.Recipient != "+905321234567" || c.Source != "HS_WEB" {
		t.Errorf("Lookup = %+v", c)
	}
	if _, err := iys.Lookup(context.Background(), pool, "+905321234567", iys.TypeMessage, iys.RecipientMerchant); !errors.Is(err, iys.ErrNoConsent) {
		t.Errorf("Lookup of a missing key: %v, want ErrNoConsent", err)
	}

	// The same file again changes nothing.
	if diff := cmp.Diff(iys.ImportReport{Rows: 5, Unchanged: 5}, mustImport(t, pool, csv)); diff != "" {
		t.Errorf("second import (-want +got):\n%s", diff)
	}
}

// A file of the header alone is refused as a line error (exit 2), and records no sync: an empty export (a
// failed download, the wrong file) made the consents look fresh to launch --max-consent-age.
func TestImportHeaderOnly(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.New(t)
	_, err := iys.Import(t.Context(), pool, strings.NewReader("  "+iys.Header+"  \n"), iys.ImportOptions{})
	var le *iys.LineError
	if !errors.As(err, &le) || !strings.Contains(err.Error(), "no consent rows") {
		t.Fatalf("import of the header alone: %v, want a line error saying it has no consent rows", err)
	}
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM iys_sync_state`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("sync states after the refused import: %d (%v), want none", n, err)
	}
}

func TestImportNewerDateWins(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.New(t)
	mustImport(t, pool, iys.Header+"\n"+
		"+905321234567,MESAJ,BIREYSEL,ONAY,HS_WEB,2024-03-01 12:00:00\n"+
		"+905331234567,MESAJ,BIREYSEL,ONAY,HS_WEB,2024-03-01 12:00:00\n")

	// An older decision does not replace a newer one; a later one does; a same-date one does too.
	rep := mustImport(t, pool, iys.Header+"\n"+
		"+905321234567,MESAJ,BIREYSEL,RET,IYS_MOBIL,2024-02-29 23:59:59\n"+
		"+905331234567,MESAJ,BIREYSEL,RET,IYS_MOBIL,2024-03-01 12:00:00\n"+
		"+905341234567,MESAJ,BIREYSEL,ONAY,HS_WEB,2024-01-01 00:00:00\n")
	if diff := cmp.Diff(iys.ImportReport{Rows: 3, Inserted: 1, Updated: 1, Unchanged: 1}, rep); diff != "" {
		t.Errorf("report (-want +got):\n%s", diff)
	}

	// Within one file, the latest date wins wherever it is; on a tie, a RET wins (the order of two
	// decisions of one second is not known), and then the later line.
	rep = mustImport(t, pool, iys.Header+"\n"+
		"+905351234567,MESAJ,BIREYSEL,ONAY,A,2024-06-02 00:00:00\n"+
		"+905351234567,MESAJ,BIREYSEL,RET,B,2024-06-01 00:00:00\n"+
		"+905361234567,MESAJ,BIREYSEL,ONAY,C,2024-06-01 00:00:00\n"+
		"05361234567,MESAJ,BIREYSEL,RET,D,2024-06-01 00:00:00\n"+
		"+905361234567,MESAJ,BIREYSEL,ONAY,E,2024-05-01 00:00:00\n")
	// A file that leaves out consents stored from earlier files is a partial one (Missing).
	if diff := cmp.Diff(iys.ImportReport{Rows: 5, Superseded: 3, Inserted: 2, Missing: 3}, rep); diff != "" {
		t.Errorf("report (-want +got):\n%s", diff)
	}

	// A same-date ONAY does not replace a stored RET: the order of two decisions of one second is not
	// known, and the import sides with the refusal, as a sync does.
	rep = mustImport(t, pool, iys.Header+"\n+905331234567,MESAJ,BIREYSEL,ONAY,HS_WEB,2024-03-01 12:00:00\n")
	if diff := cmp.Diff(iys.ImportReport{Rows: 1, Unchanged: 1, Missing: 4}, rep); diff != "" {
		t.Errorf("a same-date ONAY over a RET: report (-want +got):\n%s", diff)
	}

	// A RET and then an ONAY of the same second in one file: the RET is stored, wherever its line is.
	rep = mustImport(t, pool, iys.Header+"\n"+
		"+905371234567,MESAJ,BIREYSEL,RET,IYS_MESAJ,2024-07-01 12:00:00\n"+
		"+905371234567,MESAJ,BIREYSEL,ONAY,HS_WEB,2024-07-01 12:00:00\n"+
		"+905381234567,MESAJ,BIREYSEL,ONAY,HS_WEB,2024-07-01 12:00:00\n"+
		"+905381234567,MESAJ,BIREYSEL,RET,IYS_MESAJ,2024-07-01 12:00:00\n"+
		"+905381234567,MESAJ,BIREYSEL,ONAY,HS_WEB,2024-07-01 11:59:59\n")
	if diff := cmp.Diff(iys.ImportReport{Rows: 5, Superseded: 3, Inserted: 2, Missing: 5}, rep); diff != "" {
		t.Errorf("a same-second RET and ONAY in one file: report (-want +got):\n%s", diff)
	}

	want := []stored{
		{"+905321234567", "MESAJ", "BIREYSEL", "ONAY", "HS_WEB", "2024-03-01 12:00:00"},
		{"+905331234567", "MESAJ", "BIREYSEL", "RET", "IYS_MOBIL", "2024-03-01 12:00:00"},
		{"+905341234567", "MESAJ", "BIREYSEL", "ONAY", "HS_WEB", "2024-01-01 00:00:00"},
		{"+905351234567", "MESAJ", "BIREYSEL", "ONAY", "A", "2024-06-02 00:00:00"},
		{"+905361234567", "MESAJ", "BIREYSEL", "RET", "D", "2024-06-01 00:00:00"},
		{"+905371234567", "MESAJ", "BIREYSEL", "RET", "IYS_MESAJ", "2024-07-01 12:00:00"},
		{"+905381234567", "MESAJ", "BIREYSEL", "RET", "IYS_MESAJ", "2024-07-01 12:00:00"},
	}
	if diff := cmp.Diff(want, dump(t, pool)); diff != "" {
		t.Errorf("iys_consents (-want +got):\n%s", diff)
	}
}

func TestImportRetOverridesOnay(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.New(t)
	mustImport(t, pool, iys.Header+"\nayse@example.com,EPOSTA,BIREYSEL,ONAY,HS_WEB,2024-03-01 12:00:00\n")
	rep := mustImport(t, pool, iys.Header+"\nAYSE@example.com,EPOSTA,BIREYSEL,RET,IYS_WEB,2024-03-02 08:00:00\n")
	if diff := cmp.Diff(iys.ImportReport{Rows: 1, Updated: 1}, rep); diff != "" {
		t.Errorf("report (-want +got):\n%s", diff)
	}
	c, err := iys.Lookup(context.Background(), pool, "ayse@example.com", iys.TypeEmail, iys.RecipientIndividual)
	if err != nil {
		t.Fatal(err)
	}
	if c.Status != iys.StatusRejected || c.Source != "IYS_WEB" || c.ConsentDate.Format(iys.DateLayout) != "2024-03-02 08:00:00" {
		t.Errorf("after RET: %+v", c)
	}
}

// TestImportRejectsBadLines checks that a bad line anywhere fails the import with a *iys.LineError naming the
// line and column, and that nothing of the file is written.
func TestImportRejectsBadLines(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.New(t)
	before := "+905301234567,MESAJ,BIREYSEL,ONAY,HS_WEB,2024-03-01 12:00:00\n"
	mustImport(t, pool, iys.Header+"\n"+before)
	good := "+905321234567,MESAJ,BIREYSEL,ONAY,HS_WEB,2024-05-17 14:30:00\n" +
		"+905301234567,MESAJ,BIREYSEL,RET,HS_WEB,2024-05-17 14:30:00\n" +
		"ali@example.com,EPOSTA,TACIR,ONAY,,2024-05-17 14:30:00\n"

	tests := []struct {
		name string
		csv  string
		want iys.LineError
	}{
		{"empty file", "", iys.LineError{1, "header", "header missing: the file is empty; the first line must be " + iys.Header}},
		{"wrong header", "recipient,type,recipientType,status,source,consent_date\n" + good,
			iys.LineError{1, "header", `header "recipient,type,recipientType,status,source,consent_date" must be exactly ` + iys.Header}},
		{"header missing a column", "recipient,type,recipient_type,status,consent_date\n" + good,
			iys.LineError{1, "header", `header "recipient,type,recipient_type,status,consent_date" must be exactly ` + iys.Header}},
		{"no header", good, iys.LineError{1, "header", `header "+905321234567,MESAJ,BIREYSEL,ONAY,HS_WEB,2024-05-17 14:30:00" must be exactly ` + iys.Header}},
		{"bad status", iys.Header + "\n" + good + "+905331234567,MESAJ,BIREYSEL,OK,HS_WEB,2024-05-17 14:30:00\n",
			iys.LineError{5, "status", `status "OK" must be ONAY or RET`}},
		{"lower-case status", iys.Header + "\n" + good + "+905331234567,MESAJ,BIREYSEL,onay,HS_WEB,2024-05-17 14:30:00\n",
			iys.LineError{5, "status", `status "onay" must be ONAY or RET`}},
		{"bad type", iys.Header + "\n" + "+905331234567,SMS,BIREYSEL,ONAY,HS_WEB,2024-05-17 14:30:00\n" + good,
			iys.LineError{2, "type", `type "SMS" must be MESAJ, EPOSTA or ARAMA`}},
		{"bad recipient type", iys.Header + "\n" + good + "+905331234567,MESAJ,KURUMSAL,ONAY,HS_WEB,2024-05-17 14:30:00\n",
			iys.LineError{5, "recipient_type", `recipient_type "KURUMSAL" must be BIREYSEL or TACIR`}},
		{"bad date", iys.Header + "\n" + good + "+905331234567,MESAJ,BIREYSEL,ONAY,HS_WEB,17.05.2024 14:30\n",
			iys.LineError{5, "consent_date", `consent_date "17.05.2024 14:30" must be YYYY-MM-DD HH:MM:SS in Turkey time, e.g. 2024-05-17 14:30:00`}},
		{"impossible date", iys.Header + "\n" + good + "+905331234567,MESAJ,BIREYSEL,ONAY,HS_WEB,2024-02-30 14:30:00\n",
			iys.LineError{5, "consent_date", `consent_date "2024-02-30 14:30:00" must be a real date and time as YYYY-MM-DD HH:MM:SS in Turkey time, e.g. 2024-05-17 14:30:00`}},
		{"future date", iys.Header + "\n" + good + "+905331234567,MESAJ,BIREYSEL,ONAY,HS_WEB,2099-05-17 14:30:00\n",
			iys.LineError{5, "consent_date", `consent_date "2099-05-17 14:30:00" is in the future (Turkey time); give the date İYS recorded the consent on, as YYYY-MM-DD HH:MM:SS`}},
		{"date before İYS", iys.Header + "\n" + good + "+905331234567,MESAJ,BIREYSEL,ONAY,HS_WEB,1900-01-01 00:00:00\n",
			iys.LineError{5, "consent_date", `consent_date "1900-01-01 00:00:00" is before 2015-05-01 00:00:00, the earliest date İYS takes (consents given before it are recorded with that date, source HS_2015); give the date İYS recorded the consent on`}},
		{"ISO date", iys.Header + "\n" + good + "+905331234567,MESAJ,BIREYSEL,ONAY,HS_WEB,2024-05-17T14:30:00Z\n",
			iys.LineError{5, "consent_date", `consent_date "2024-05-17T14:30:00Z" must be YYYY-MM-DD HH:MM:SS in Turkey time, e.g. 2024-05-17 14:30:00`}},
		{"bad phone", iys.Header + "\n" + good + "12345,MESAJ,BIREYSEL,ONAY,HS_WEB,2024-05-17 14:30:00\n",
			iys.LineError{5, "recipient", `recipient "*****" is not a valid phone number for MESAJ (not a valid number); write it as +905XXXXXXXXX`}},
		{"+9005 phone", iys.Header + "\n" + good + "+9005321234567,ARAMA,BIREYSEL,ONAY,HS_WEB,2024-05-17 14:30:00\n",
			iys.LineError{5, "recipient", `recipient "+900******4567" is not a valid phone number for ARAMA (not a form İYS accepts; did you mean +905*****4567?); write it as +905XXXXXXXXX`}},
		{"e-mail for MESAJ", iys.Header + "\n" + good + "ali@example.com,MESAJ,BIREYSEL,ONAY,HS_WEB,2024-05-17 14:30:00\n",
			iys.LineError{5, "recipient", `recipient "a***@example.com" is not a valid phone number for MESAJ (unexpected character 'a'); write it as +905XXXXXXXXX`}},
		{"phone for EPOSTA", iys.Header + "\n" + good + "05321234567,EPOSTA,BIREYSEL,ONAY,HS_WEB,2024-05-17 14:30:00\n",
			iys.LineError{5, "recipient", `recipient "0532***4567" is not a valid e-mail address for EPOSTA (must be name@domain); write it as name@example.com`}},
		{"too few columns", iys.Header + "\n" + good + "+905331234567,MESAJ,BIREYSEL,ONAY,2024-05-17 14:30:00\n",
			iys.LineError{5, "", "has 5 columns, must have 6: " + iys.Header}},
		{"blank lines still count", iys.Header + "\n\n" + good + "\n+905331234567,MESAJ,BIREYSEL,NO,HS_WEB,2024-05-17 14:30:00\n",
			iys.LineError{7, "status", `status "NO" must be ONAY or RET`}},
		{"stray quote", iys.Header + "\n" + good + "+905331234567,MESAJ,BIREYSEL,ONAY,HS \"WEB\",2024-05-17 14:30:00\n",
			iys.LineError{5, "", `malformed CSV (bare " in non-quoted-field): quote fields that contain commas or quotes, and double any quote inside them`}},
		{"invalid UTF-8 source", iys.Header + "\n" + good + "+905331234567,MESAJ,BIREYSEL,ONAY,HS\xff,2024-05-17 14:30:00\n",
			iys.LineError{5, "source", "source \"HS\\xff\" must be UTF-8 text of at most 256 bytes, e.g. HS_WEB"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := importString(t, pool, tc.csv)
			var le *iys.LineError
			if !errors.As(err, &le) {
				t.Fatalf("Import = %+v, %v; want a *iys.LineError", rep, err)
			}
			if diff := cmp.Diff(tc.want, *le); diff != "" {
				t.Errorf("LineError (-want +got):\n%s", diff)
			}
			if !strings.HasPrefix(err.Error(), "line ") {
				t.Errorf("message %q does not start with the line", err)
			}
		})
	}
	// Nothing of any bad file was written: the one row from before is still all there is, unchanged.
	want := []stored{{"+905301234567", "MESAJ", "BIREYSEL", "ONAY", "HS_WEB", "2024-03-01 12:00:00"}}
	if diff := cmp.Diff(want, dump(t, pool)); diff != "" {
		t.Errorf("iys_consents after failed imports (-want +got):\n%s", diff)
	}
}

func TestImportCancelled(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := iys.Import(ctx, pool, strings.NewReader(iys.Header+"\n+905321234567,MESAJ,BIREYSEL,ONAY,,2024-05-17 14:30:00\n"), iys.ImportOptions{})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Import with a cancelled context: %v", err)
	}
	if got := dump(t, pool); len(got) != 0 {
		t.Errorf("rows written: %v", got)
	}
}

// TestImportConcurrent runs two imports of overlapping keys at once: both must succeed, and each key must end
// with the latest decision whichever import committed last.
func TestImportConcurrent(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.New(t)
	mustImport(t, pool, iys.Header+"\n+905301234567,MESAJ,BIREYSEL,ONAY,seed,2024-01-01 00:00:00\n")
	older := iys.Header + "\n+905321234567,MESAJ,BIREYSEL,ONAY,older,2024-05-01 00:00:00\n+905331234567,MESAJ,BIREYSEL,RET,older,2024-07-01 00:00:00\n"
	newer := iys.Header + "\n+905321234567,MESAJ,BIREYSEL,RET,newer,2024-06-01 00:00:00\n+905331234567,MESAJ,BIREYSEL,ONAY,newer,2024-06-01 00:00:00\n"
	errs := make(chan error, 2)
	for _, csv := range []string{older, newer} {
		go func() {
			_, err := iys.Import(context.Background(), pool, strings.NewReader(csv), iys.ImportOptions{})
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	want := []stored{
		{"+905301234567", "MESAJ", "BIREYSEL", "ONAY", "seed", "2024-01-01 00:00:00"},
		{"+905321234567", "MESAJ", "BIREYSEL", "RET", "newer", "2024-06-01 00:00:00"},
		{"+905331234567", "MESAJ", "BIREYSEL", "RET", "older", "2024-07-01 00:00:00"},
	}
	if diff := cmp.Diff(want, dump(t, pool)); diff != "" {
		t.Errorf("iys_consents (-want +got):\n%s", diff)
	}
}

// A partial file (new sign-ups, a CRM's extract) says nothing of the consents it leaves out: it does not
// make the brand's consents count as up to date for launches' --max-consent-age; a complete export does.
// Consents known here only (a refusal of an address İYS holds nothing for) are not looked for in a file.
// Before, any import, one row of an unrelated number included, reset the clock while no sync ran.
func TestOnlyACompleteImportBringsTheConsentsUpToDate(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.New(t)
	ctx := t.Context()
	synced := func() time.Time {
		t.Helper()
		var at time.Time
		if err := pool.QueryRow(ctx, `SELECT last_success_at FROM iys_sync_state WHERE brand_code = '444' AND source = $1`, iys.SourceImport).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
	full := iys.Header + "\n+905321234501,MESAJ,BIREYSEL,ONAY,HS_WEB,2024-03-01 12:00:00\n+905321234502,MESAJ,BIREYSEL,RET,HS_WEB,2024-03-01 12:00:00\n"
	if _, err := iys.Import(ctx, pool, strings.NewReader(full), iys.ImportOptions{BrandCode: "444"}); err != nil {
		t.Fatal(err)
	}
	first := synced()
	// A refusal of an address with nothing stored: a RET known here only.
	if _, err := iys.RecordRefusals(ctx, pool, "444", []iys.Refusal{{Via: iys.ViaTwilioInbound, EventID: "SM1", Kind: "inbound",
		Recipient: "+905321234599", Type: "MESAJ", Evidence: "RET", At: time.Now()}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	rep, err := iys.Import(ctx, pool, strings.NewReader(iys.Header+"\n+905329999999,MESAJ,BIREYSEL,ONAY,HS_WEB,2024-03-02 12:00:00\n"), iys.ImportOptions{BrandCode: "444"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Missing != 2 || !synced().Equal(first) {
		t.Fatalf("a partial file: %d missing, import recorded at %v (before: %v); want 2 missing and the time kept", rep.Missing, synced(), first)
	}
	time.Sleep(20 * time.Millisecond)
	rep, err = iys.Import(ctx, pool, strings.NewReader(full+"+905329999999,MESAJ,BIREYSEL,ONAY,HS_WEB,2024-03-02 12:00:00\n"), iys.ImportOptions{BrandCode: "444"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Missing != 0 || !synced().After(first) {
		t.Fatalf("a complete file (without the RET known here only): %d missing, import recorded at %v (before: %v); want none missing and a later time", rep.Missing, synced(), first)
	}
}
