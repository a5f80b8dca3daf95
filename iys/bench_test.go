package iys_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/iys"
)

// consentFile generates a consent CSV of n data rows on the fly, so that a benchmark does not hold the file
// in memory either. Rows are MESAJ (60%), EPOSTA (30%) and ARAMA (10%) for distinct recipients, with phones
// in a mix of spellings and about 2% of rows repeating an earlier key with a later date.
type consentFile struct {
	n, i  int
	month int
	buf   bytes.Buffer
}

func newConsentFile(n, month int) *consentFile {
	f := &consentFile{n: n, month: month}
	f.buf.WriteString(iys.Header + "\n")
	return f
}

func (f *consentFile) Read(p []byte) (int, error) {
	for f.buf.Len() < len(p) && f.i < f.n {
		f.row(f.i)
		f.i++
	}
	if f.buf.Len() == 0 {
		return 0, io.EOF
	}
	return f.buf.Read(p)
}

func (f *consentFile) row(i int) {
	k := i
	day := 1 + i%28
	if i%50 == 49 { // a later decision for an earlier key
		k, day = i-7, 28
	}
	status := "ONAY"
	if k%20 == 0 {
		status = "RET"
	}
	nat := fmt.Sprintf("%d%07d", 530+k%30, (k/30)%10_000_000)
	switch m := k % 10; {
	case m < 6:
		rec := "+90" + nat
		if m == 1 {
			rec = "0" + nat[:3] + " " + nat[3:6] + " " + nat[6:8] + " " + nat[8:]
		}
		fmt.Fprintf(&f.buf, "%s,MESAJ,BIREYSEL,%s,HS_WEB,2024-%02d-%02d 10:%02d:00\n", rec, status, f.month, day, k%60)
	case m < 9:
		fmt.Fprintf(&f.buf, "Musteri.%d@Example.com,EPOSTA,BIREYSEL,%s,HS_EPOSTA,2024-%02d-%02d 10:%02d:00\n", k, status, f.month, day, k%60)
	default:
		fmt.Fprintf(&f.buf, "%s,ARAMA,TACIR,%s,,2024-%02d-%02d 10:%02d:00\n", nat, status, f.month, day, k%60)
	}
}

// BenchmarkImport imports a 1.7-million-row consent file from disk into an empty table, then the same file
// again (every key stored, nothing changes), then a file with the same keys and later dates (every stored
// consent replaced). Run it with
//
//	go test ./iys -run '^$' -bench Import -benchtime 1x
func BenchmarkImport(b *testing.B) {
	const rows = 1_700_000
	pool, _ := testdb.New(b)
	ctx := context.Background()
	march := writeConsentFile(b, rows, 3)
	april := writeConsentFile(b, rows, 4)
	for _, pass := range []struct{ name, path string }{
		{"empty table", march},
		{"same file again", march},
		{"all newer", april},
	} {
		b.Run(pass.name, func(b *testing.B) {
			for b.Loop() {
				f, err := os.Open(pass.path)
				if err != nil {
					b.Fatal(err)
				}
				start := time.Now()
				rep, err := iys.Import(ctx, pool, f, iys.ImportOptions{})
				f.Close()
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(time.Since(start).Nanoseconds())/rows, "ns/row")
				b.Logf("%s: %+v in %v", pass.name, rep, time.Since(start).Round(time.Millisecond))
			}
		})
	}
}

func writeConsentFile(b *testing.B, rows, month int) string {
	path := filepath.Join(b.TempDir(), fmt.Sprintf("consents-%02d.csv", month))
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := io.Copy(f, newConsentFile(rows, month)); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	return path
}
