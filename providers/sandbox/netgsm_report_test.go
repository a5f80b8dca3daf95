package sandbox_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/providers/sandbox"
)

// netgsmPost posts body to path with Netgsm's Basic auth and decodes the JSON answer.
func netgsmPost(t *testing.T, srv *httptest.Server, path string, body any) (int, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, srv.URL+path, bytes.NewReader(b))
	req.SetBasicAuth("8503000000", "pass")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	json.NewDecoder(resp.Body).Decode(&out) //nolint:errcheck
	return resp.StatusCode, out
}

// The report endpoint answers what Netgsm's does: the jobs between the dates (all, or those named), a
// page at a time, code 60 past the last, 70 for dates it cannot read, and the accepted messages' log
// notes the final statuses served.
func TestNetgsmReportPagesAndDates(t *testing.T) {
	t.Parallel()
	s := sandbox.New(sandbox.Options{ReceiptDelay: time.Millisecond, NetgsmReportsPerMinute: -1})
	srv := httptest.NewServer(s)
	defer srv.Close()
	for _, no := range []string{"5321000001", "5321000002", "5550116001"} {
		st, a := netgsmPost(t, srv, "/sms/rest/v2/send", map[string]any{"msgheader": "KAMPANYA", "iysfilter": "11",
			"messages": []map[string]string{{"msg": "Merhaba", "no": no}}})
		if st != http.StatusOK || a["code"] != "00" {
			t.Fatalf("send to %s: %d %v", no, st, a)
		}
	}
	time.Sleep(10 * time.Millisecond)
	trt := time.FixedZone("TRT", 3*3600)
	dates := map[string]any{"startdate": time.Now().Add(-time.Hour).In(trt).Format("02.01.2006 15:04:05"),
		"stopdate": time.Now().Add(time.Hour).In(trt).Format("02.01.2006 15:04:05")}
	page := func(n, size int) (int, map[string]any) {
		q := map[string]any{"pagenumber": n, "pagesize": size}
		for k, v := range dates {
			q[k] = v
		}
		return netgsmPost(t, srv, "/sms/rest/v2/report", q)
	}
	st, a := page(0, 2)
	jobs, _ := a["jobs"].([]any)
	if st != http.StatusOK || a["code"] != "00" || len(jobs) != 2 {
		t.Fatalf("first page: %d %v", st, a)
	}
	st, a = page(1, 2)
	jobs, _ = a["jobs"].([]any)
	if st != http.StatusOK || len(jobs) != 1 || jobs[0].(map[string]any)["number"] != "5550116001" || jobs[0].(map[string]any)["status"] != float64(16) {
		t.Fatalf("second page: %d %v; want the İYS-rejected number's job with status 16", st, a)
	}
	if _, a = page(2, 2); a["code"] != "60" {
		t.Fatalf("past the last page: %v, want code 60", a)
	}
	if st, a = netgsmPost(t, srv, "/sms/rest/v2/report", map[string]any{"startdate": "2026-12-04", "stopdate": "x"}); st != http.StatusNotAcceptable || a["code"] != "70" {
		t.Fatalf("unreadable dates: %d %v, want 406 with code 70", st, a)
	}
	receipts := map[string]string{}
	for _, m := range s.Messages() {
		receipts[m.To] = m.Receipt
	}
	if receipts["+905321000001"] != "netgsm:1" || receipts["+905550116001"] != "netgsm:16" {
		t.Fatalf("log's receipts %v", receipts)
	}
}

// An outage of Netgsm's API takes its reports down too: a 503 until it ends.
func TestNetgsmReportsFollowTheAPIsOutage(t *testing.T) {
	t.Parallel()
	s := sandbox.New(sandbox.Options{Outages: []sandbox.OutagePlan{{Only: "netgsm", Duration: time.Hour}}})
	srv := httptest.NewServer(s)
	defer srv.Close()
	trt := time.FixedZone("TRT", 3*3600)
	q := map[string]any{"startdate": time.Now().Add(-time.Hour).In(trt).Format("02.01.2006 15:04:05"),
		"stopdate": time.Now().In(trt).Format("02.01.2006 15:04:05")}
	if st, a := netgsmPost(t, srv, "/sms/rest/v2/report", q); st != http.StatusServiceUnavailable {
		t.Fatalf("report during an outage: %d %v, want 503", st, a)
	}
}
