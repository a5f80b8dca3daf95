package twilio_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/campaignctl/campaignctl/providers"
)

// messageResource is a Messages API answer of the shape Twilio sends (the sandbox's, 20 fields).
const messageResource = `{"account_sid":"ACtest00000000000000000000000001","api_version":"2010-04-01",` +
	`"body":"Kampanya A.Ş.: Merhaba Müşteri 42, kodunuz K7Q2M9XW - RET yazıp 3338e gönderin",` +
	`"date_created":"Tue, 01 Dec 2026 19:40:00 +0000","date_sent":null,"date_updated":"Tue, 01 Dec 2026 19:40:00 +0000",` +
	`"direction":"outbound-api","error_code":null,"error_message":null,"from":"+14155550100","messaging_service_sid":null,` +
	`"num_media":"0","num_segments":"2","price":null,"price_unit":"USD","sid":"SM0123456789abcdef0123456789abcdef",` +
	`"status":"queued","subresource_uris":{"media":"/2010-04-01/Accounts/ACtest00000000000000000000000001/Messages/SM0123456789abcdef0123456789abcdef/Media.json"},` +
	`"to":"+905551234567","uri":"/2010-04-01/Accounts/ACtest00000000000000000000000001/Messages/SM0123456789abcdef0123456789abcdef.json"}`

// answering is a server that reads each request and answers the same message resource: the same work on
// the server's side for both benchmarks below, so that what differs between them is the client's.
func answering(b *testing.B) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) //nolint:errcheck
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(messageResource)))
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, messageResource) //nolint:errcheck
	}))
	b.Cleanup(srv.Close)
	return srv
}

var benchMsg = providers.Message{To: testTo, Body: "Kampanya A.Ş.: Merhaba Müşteri 42, kodunuz K7Q2M9XW - RET yazıp 3338e gönderin", CampaignID: 7, UserID: "c00000042"}

// BenchmarkSendThroughSDK is one Provider.Send: twilio-go builds the request and decodes the answer,
// through the adapter's recorder and connection pool.
func BenchmarkSendThroughSDK(b *testing.B) {
	srv := answering(b)
	p := newProvider(b, srv.URL)
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
// fields the engine keeps decoded from the answer. The difference to BenchmarkSendThroughSDK is what the
// SDK and the adapter add to a message.
func BenchmarkSendBareRequest(b *testing.B) {
	srv := answering(b)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	endpoint := srv.URL + "/2010-04-01/Accounts/" + testSID + "/Messages.json"
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
			if err := json.Unmarshal(data, &m); err != nil || m.SID == "" {
				b.Errorf("answer %q: %v", data, err)
				return
			}
		}
	})
}
