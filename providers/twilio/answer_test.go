package twilio

import (
	"bytes"
	"encoding/json"
	"testing"

	openapi "github.com/twilio/twilio-go/rest/api/v2010"
)

// messageAnswer is a 201 of the Messages API as Twilio writes it.
const messageAnswer = `{"account_sid": "AC00000000000000000000000000000000", "api_version": "2010-04-01", "body": "Merhaba Ay\u015fe, kodunuz KMP-7H3K9QZ2 - Kampanya A.\u015e. RET yaz\u0131p 3338e g\u00f6nderin", "date_created": "Tue, 01 Dec 2026 21:02:14 +0000", "date_sent": null, "date_updated": "Tue, 01 Dec 2026 21:02:14 +0000", "direction": "outbound-api", "error_code": null, "error_message": null, "from": "+905550000000", "messaging_service_sid": null, "num_media": "0", "num_segments": "2", "price": null, "price_unit": "USD", "sid": "SM0123456789abcdef0123456789abcdef", "status": "queued", "subresource_uris": {"media": "/2010-04-01/Accounts/AC00000000000000000000000000000000/Messages/SM0123456789abcdef0123456789abcdef/Media.json"}, "tags": [1, 2.5e3, -0.1, true, false, null, {"a": []}], "to": "+905321234567", "uri": "/2010-04-01/Accounts/AC00000000000000000000000000000000/Messages/SM0123456789abcdef0123456789abcdef.json"}`

// decoded is what twilio-go would make of body: the fields Send reads, and whether decoding failed.
func decoded(body []byte) (sid, segments *string, failed bool) {
	var m openapi.ApiV2010Message
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&m); err != nil {
		return nil, nil, true
	}
	return m.Sid, m.NumSegments, false
}

func same(a, b *string) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

// readOnly is what encoding/json makes of body when it decodes only the fields Send reads.
func readOnly(body []byte) (sid, segments *string, failed bool) {
	var m struct {
		Sid         *string `json:"sid"`
		NumSegments *string `json:"num_segments"`
	}
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&m); err != nil {
		return nil, nil, true
	}
	return m.Sid, m.NumSegments, false
}

// checkTrim fails when twilio-go would decode the trimmed answer into other values of the fields Send reads
// than encoding/json finds for those fields in the whole answer, when an answer the SDK decodes whole is
// not trimmed, or when the trim accepts what is not one JSON object. (A 201 whose other members the SDK
// cannot decode, a date as an array say, gives Send its message SID all the same.)
func checkTrim(t *testing.T, body []byte) (trimmed []byte, ok bool) {
	t.Helper()
	trimmed, ok = trimAnswer(nil, body)
	if !ok {
		return nil, false
	}
	if !json.Valid(body) || bytes.TrimSpace(body)[0] != '{' {
		t.Fatalf("trimmed %q, which is not one JSON object", body)
	}
	sid, seg, failed := readOnly(body)
	tsid, tseg, tfailed := decoded(trimmed)
	if failed != tfailed || !same(sid, tsid) || !same(seg, tseg) {
		t.Fatalf("answer %q: its sid %v, num_segments %v (failed %v); the SDK reads from the trimmed %q: %v, %v (failed %v)",
			body, deref(sid), deref(seg), failed, trimmed, deref(tsid), deref(tseg), tfailed)
	}
	return trimmed, true
}

// checkWhole fails when an answer the SDK decodes whole is not trimmed, or is trimmed to other values.
func checkWhole(t *testing.T, body []byte) {
	t.Helper()
	sid, seg, failed := decoded(body)
	if failed || bytes.IndexByte(body, '\\') >= 0 {
		return
	}
	for _, c := range body {
		if c >= 0x80 {
			return
		}
	}
	trimmed, ok := checkTrim(t, body)
	if !ok {
		// Only trailing data after the object (which the SDK's decoder ignores) is refused.
		if json.Valid(body) {
			t.Fatalf("answer %q, which the SDK decodes, was not trimmed", body)
		}
		return
	}
	tsid, tseg, _ := decoded(trimmed)
	if !same(sid, tsid) || !same(seg, tseg) {
		t.Fatalf("answer %q: the SDK reads %v, %v whole and %v, %v trimmed", body, deref(sid), deref(seg), deref(tsid), deref(tseg))
	}
}

func deref(p *string) any {
	if p == nil {
		return nil
	}
	return *p
}

func TestTrimAnswerKeepsWhatSendReads(t *testing.T) {
	trimmed, ok := checkTrim(t, []byte(messageAnswer))
	if !ok {
		t.Fatal("a Message resource was not trimmed")
	}
	if want := `{"sid":"SM0123456789abcdef0123456789abcdef","num_segments":"2"}`; string(trimmed) != want {
		t.Fatalf("trimmed to %s, want %s", trimmed, want)
	}
	for _, body := range []string{
		`{}`, ` {"sid": null} `, `{"SID": "a", "sid": "b"}`, `{"sid": "a", "Sid": "b"}`, `{"num_segments": 2}`,
		`{"sid": "a\"b\\c\u00e7"}`, `{"sid": "a"} x`, `{"sid": "a",}`, `{"sid": 01}`, `{"s\u0069d": "x"}`,
		`{"sid": "x", "n": [1, {"b": [[]]}]}`, `{"sid": "x", "n": 1.}`, `{"sid": "x", "n": -}`, `{"sid": "x", "n": tru}`,
		`[{"sid": "x"}]`, `{"sid": "x"`, "{\"sid\": \"a\x01\"}", `{"ſid": "x"}`, `{"sid": "x", "n": 1e+}`, `{"n": 1E5, "sid": "y"}`,
	} {
		checkTrim(t, []byte(body))
		checkWhole(t, []byte(body))
	}
	if _, ok := trimAnswer(nil, []byte(`{"s\u0069d": "x"}`)); ok {
		t.Error("a name with an escape was compared as written")
	}
}

func FuzzTrimAnswer(f *testing.F) {
	for _, s := range []string{messageAnswer, `{}`, `{"sid": "a", "SID": null}`, `{"num_segments": "1", "x": [1, {"y": "z"}]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		checkTrim(t, body)
		checkWhole(t, body)
	})
}

// The SDK's decoding of an answer, whole and trimmed (with the trim's own cost).
func BenchmarkDecodeAnswer(b *testing.B) {
	body := []byte(messageAnswer)
	b.Run("whole", func(b *testing.B) {
		for b.Loop() {
			var m openapi.ApiV2010Message
			if err := json.NewDecoder(bytes.NewReader(body)).Decode(&m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("trimmed", func(b *testing.B) {
		var small [256]byte
		for b.Loop() {
			t, ok := trimAnswer(small[:0], body)
			if !ok {
				b.Fatal("not trimmed")
			}
			var m openapi.ApiV2010Message
			if err := json.NewDecoder(bytes.NewReader(t)).Decode(&m); err != nil {
				b.Fatal(err)
			}
		}
	})
}
