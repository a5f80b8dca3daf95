package twilio_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/sandbox"
)

// The two benchmarks send the same message to the same sandbox over loopback, 8 goroutines a core: what
// differs between them is the client's work, so BenchmarkSend less BenchmarkSendBareRequest is what the
// SDK and the adapter add to a message.

var benchMsg = providers.Message{To: testTo, Body: "Kampanya A.Ş.: Merhaba Müşteri 42, kodunuz K7Q2M9XW - RET yazıp 3338e gönderin", CampaignID: 7, UserID: "c00000042"}

// BenchmarkSend is one Provider.Send: twilio-go builds the request and decodes the answer (trimmed to
// what Send reads), through the adapter's recorder and connection pool.
func BenchmarkSend(b *testing.B) {
	_, srv := newSandbox(b, sandbox.Options{})
	p := newProvider(b, srv.URL)
	b.SetParallelism(8)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := p.Send(context.Background(), benchMsg); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkSendBareRequest is the same exchange without the SDK: a form POST with net/http and the two
// fields the engine keeps decoded from the answer.
func BenchmarkSendBareRequest(b *testing.B) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	_, srv := newSandbox(b, sandbox.Options{})
	endpoint := srv.URL + "/2010-04-01/Accounts/" + testSID + "/Messages.json"
	b.SetParallelism(8)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			form := url.Values{"To": {benchMsg.To}, "From": {testFrom}, "Body": {benchMsg.Body}}
			req, _ := http.NewRequest(http.MethodPost, endpoint, strings.NewReader(form.Encode()))
			req.SetBasicAuth(testSID, testToken)
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			resp, err := client.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var m struct {
				SID         string `json:"sid"`
				NumSegments string `json:"num_segments"`
			}
			if err := json.Unmarshal(data, &m); err != nil || m.SID == "" || resp.StatusCode != http.StatusCreated {
				b.Errorf("answer %d %q: %v", resp.StatusCode, data, err)
				return
			}
		}
	})
}
