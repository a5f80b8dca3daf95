package sandbox

import (
	"bytes"
	"encoding/json"
	"strconv"
	"testing"
	"time"
)

// jsonStrings are strings that exercise every escape of encoding/json (internal/jsonstr writes them).
var jsonStrings = []string{
	"", "plain", "Merhaba Ali, kodunuz K7Q2M9XW - RET yazıp 3338e gönderin", `quote " backslash \ slash /`,
	"<b>&amp;</b>", "\x00\x01\x08\x09\x0a\x0b\x0c\x0d\x1f\x7f", "line\u2028para\u2029end", "emoji 😀 ş ğ ı İ",
	"bad \xff utf8 \xc3", "\xe2\x80", "\xed\xa0\x80 surrogate", "trailing \\",
}

// twilioMessage is Twilio's Message resource as the sandbox encoded it with encoding/json before it
// wrote the answer itself: appendTwilioMessage must write the same bytes.
type twilioMessage struct {
	AccountSID          string            `json:"account_sid"`
	APIVersion          string            `json:"api_version"`
	Body                string            `json:"body"`
	DateCreated         string            `json:"date_created"`
	DateSent            *string           `json:"date_sent"`
	DateUpdated         string            `json:"date_updated"`
	Direction           string            `json:"direction"`
	ErrorCode           *int              `json:"error_code"`
	ErrorMessage        *string           `json:"error_message"`
	From                *string           `json:"from"`
	MessagingServiceSID *string           `json:"messaging_service_sid"`
	NumMedia            string            `json:"num_media"`
	NumSegments         string            `json:"num_segments"`
	Price               *string           `json:"price"`
	PriceUnit           string            `json:"price_unit"`
	SID                 string            `json:"sid"`
	Status              string            `json:"status"`
	SubresourceURIs     map[string]string `json:"subresource_uris"`
	To                  string            `json:"to"`
	URI                 string            `json:"uri"`
}

func twilioMessageResource(m Message, from, msid string) twilioMessage {
	date := m.At.Format(time.RFC1123Z)
	uri := "/2010-04-01/Accounts/" + m.AccountSID + "/Messages/" + m.SID
	out := twilioMessage{
		AccountSID: m.AccountSID, APIVersion: "2010-04-01", Body: m.Body, DateCreated: date, DateUpdated: date,
		Direction: "outbound-api", NumMedia: "0", NumSegments: strconv.Itoa(m.NumSegments), PriceUnit: "USD",
		SID: m.SID, Status: m.Status, SubresourceURIs: map[string]string{"media": uri + "/Media.json"}, To: m.To,
		URI: uri + ".json",
	}
	if from != "" {
		out.From = &from
	}
	if msid != "" {
		out.MessagingServiceSID = &msid
	}
	return out
}

func TestTwilioAnswerMatchesEncodingJSON(t *testing.T) {
	at := time.Date(2026, 3, 2, 9, 4, 5, 123456789, time.UTC)
	ist := time.FixedZone("TRT", 3*3600)
	for i, body := range jsonStrings {
		for _, c := range []struct {
			from, msid string
			at         time.Time
		}{
			{"+905550000000", "", at},
			{"", "MG0123456789abcdef0123456789abcdef", at.In(ist)},
			{"+905550000000", "MG1", at.Add(time.Duration(i) * time.Hour)},
			{`Kampanya<&>"\`, "", at},
		} {
			m := Message{Provider: "twilio", SID: newSID("SM"), AccountSID: "ACbench0000000000000000000000000", To: "+905321234567",
				From: c.from, Body: body, NumSegments: i * 7, Status: "queued", At: c.at}
			var want bytes.Buffer
			if err := json.NewEncoder(&want).Encode(twilioMessageResource(m, c.from, c.msid)); err != nil {
				t.Fatal(err)
			}
			if got := appendTwilioMessage(nil, &m, c.from, c.msid); !bytes.Equal(got, want.Bytes()) {
				t.Errorf("body %q, from %q, msid %q:\n got %s\nwant %s", body, c.from, c.msid, got, want.Bytes())
			}
		}
	}
}
