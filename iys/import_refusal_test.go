package iys_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/iys"
)

// A stored RET (an older İYS decision), then a local refusal (STOP), then an İYS export whose ONAY for
// the same key is dated between the two: the ONAY was given before the person refused locally, so the
// key must stay RET (a consent older than a local refusal never stands).
func TestAnImportedONAYOlderThanARefusalDoesNotReplaceItsRET(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.New(t)
	ctx := context.Background()
	const addr = "+905321111111"
	refusedAt := time.Now().Add(-time.Hour).Truncate(time.Second)
	retAt := refusedAt.Add(-48 * time.Hour)
	onayAt := refusedAt.Add(-24 * time.Hour) // after the stored RET, before the local refusal
	day := func(t time.Time) string { return t.In(iys.Istanbul()).Format(iys.DateLayout) }

	mustImport(t, pool, iys.Header+"\n"+addr+",MESAJ,BIREYSEL,RET,HS_WEB,"+day(retAt)+"\n")
	rep, err := iys.RecordRefusals(ctx, pool, "", []iys.Refusal{{Via: iys.ViaTwilioInbound, EventID: "SM1",
		Kind: "inbound", Recipient: addr, Type: "MESAJ", Evidence: "STOP", At: refusedAt}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("refusal: %+v; status after it: %s", rep, consentStatus(t, pool, addr, "MESAJ", "BIREYSEL", ""))

	irep := mustImport(t, pool, iys.Header+"\n"+addr+",MESAJ,BIREYSEL,ONAY,HS_WEB,"+day(onayAt)+"\n")
	t.Logf("import: %+v", irep)
	if st := consentStatus(t, pool, addr, "MESAJ", "BIREYSEL", ""); st != "RET" {
		t.Errorf("an ONAY dated %s, before the local refusal of %s, replaced the stored RET: status %s, want RET",
			day(onayAt), day(refusedAt), st)
	}
	// The file shows İYS holds the ONAY: the refusal found RET here and queued nothing, so its RET is
	// queued now, dated as the refusal; the same file again queues nothing more.
	var queued int
	var at time.Time
	if err := pool.QueryRow(ctx, `SELECT count(*), max(consent_date) FROM iys_outbox WHERE recipient = $1 AND state = 'waiting'`, addr).Scan(&queued, &at); err != nil && queued != 0 {
		t.Fatal(err)
	}
	if irep.Requeued != 1 || queued != 1 || !at.Equal(refusedAt) {
		t.Errorf("after the import: %d requeued, %d waiting for İYS dated %v; want the refusal's RET queued once, dated %v", irep.Requeued, queued, at, refusedAt)
	}
	if irep = mustImport(t, pool, iys.Header+"\n"+addr+",MESAJ,BIREYSEL,ONAY,HS_WEB,"+day(onayAt)+"\n"); irep.Requeued != 0 {
		t.Errorf("the same file again requeued %d; want none (one is on its way)", irep.Requeued)
	}
}

// A refusal of an address with nothing stored queues nothing for İYS (İYS refuses a first add as RET).
// A brand's file that then shows İYS holding an older ONAY of it under that brand stores the RET and queues
// it under the brand, as a sync of the same ONAY does; before, the import queued nothing and İYS kept
// the ONAY of a person who had refused through the brand's own channel.
func TestAnImportThatShowsIYSHoldsAnOlderONAYQueuesTheRefusal(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.New(t)
	ctx := context.Background()
	const addr = "+905322070001"
	refusedAt := time.Now().Add(-time.Hour).Truncate(time.Second)
	rep, err := iys.RecordRefusals(ctx, pool, "", []iys.Refusal{{Via: iys.ViaTwilioInbound, EventID: "SM9",
		Kind: "inbound", Recipient: addr, Type: "MESAJ", Evidence: "RET", At: refusedAt}})
	if err != nil || rep.Outboxed != 0 {
		t.Fatalf("refusal of an address with nothing stored: %+v, %v; want nothing queued", rep, err)
	}
	yesterday := refusedAt.Add(-24 * time.Hour).In(iys.Istanbul()).Format(iys.DateLayout)
	irep, err := iys.Import(ctx, pool, strings.NewReader(iys.Header+"\n"+addr+",MESAJ,BIREYSEL,ONAY,HS_WEB,"+yesterday+"\n+905322070002,MESAJ,BIREYSEL,ONAY,HS_WEB,"+yesterday+"\n"),
		iys.ImportOptions{BrandCode: "111"})
	if err != nil {
		t.Fatal(err)
	}
	var brand, source string
	if err := pool.QueryRow(ctx, `SELECT brand_code, source FROM iys_outbox WHERE recipient = $1 AND state = 'waiting'`, addr).Scan(&brand, &source); err != nil {
		t.Fatalf("import %+v: no RET waiting for İYS: %v", irep, err)
	}
	if st := consentStatus(t, pool, addr, "MESAJ", "BIREYSEL", "111"); st != "RET" || brand != "111" || irep.Requeued != 1 {
		t.Fatalf("import %+v: consent %s, RET queued under brand %q (%s); want RET, queued under 111", irep, st, brand, source)
	}
}

// endlessLine is a consent file whose second line never ends: the header, then limit bytes of one field
// without a newline, then errTooFar.
type endlessLine struct {
	head  string
	read  int64
	limit int64
}

var errTooFar = errors.New("the importer read the whole endless line")

func (e *endlessLine) Read(p []byte) (int, error) {
	if e.head != "" {
		n := copy(p, e.head)
		e.head = e.head[n:]
		return n, nil
	}
	if e.read >= e.limit {
		return 0, errTooFar
	}
	n := int64(len(p))
	if n > e.limit-e.read {
		n = e.limit - e.read
	}
	for i := range p[:n] {
		p[i] = 'a'
	}
	e.read += n
	return int(n), nil
}

// A consent file is streamed "so memory stays flat whatever the file's size": one endless line (a
// truncated or binary file) must be refused once it is far longer than any consent row can be, not held
// in memory whole.
func TestAnImportLineThatRunsOnIsRefused(t *testing.T) {
	pool, _ := testdb.New(t)
	const limit = 256 << 20
	r := &endlessLine{head: iys.Header + "\n+905321111111,MESAJ,BIREYSEL,ONAY,HS_WEB,", limit: limit}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := iys.Import(context.Background(), pool, r, iys.ImportOptions{})
	runtime.ReadMemStats(&after)
	t.Logf("Import: %v; read %d MB of one line; allocated %d MB", err, r.read>>20, (after.TotalAlloc-before.TotalAlloc)>>20)
	if r.read >= limit || errors.Is(err, errTooFar) {
		t.Errorf("Import read a single %d MB row whole (allocating %d MB) instead of refusing an over-long line",
			r.read>>20, (after.TotalAlloc-before.TotalAlloc)>>20)
	}
}
