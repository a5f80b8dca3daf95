package sandbox

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// Every field of a Message survives the log: a field added to Message and not to logEntry fails here.
func TestLogEntryKeepsEveryField(t *testing.T) {
	var m Message
	v := reflect.ValueOf(&m).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		switch f.Kind() {
		case reflect.String:
			f.SetString(v.Type().Field(i).Name)
		case reflect.Int:
			f.SetInt(int64(i + 1))
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Map:
			f.Set(reflect.ValueOf(map[string]string{"List-Unsubscribe": "<https://example.com/u>"}))
		case reflect.Struct:
			f.Set(reflect.ValueOf(time.Date(2026, 3, 2, 10, 0, i, 0, time.UTC)))
		default:
			t.Fatalf("Message.%s: a %s, which this test does not fill", v.Type().Field(i).Name, f.Kind())
		}
	}
	e := newLogEntry(m)
	if diff := cmp.Diff(m, e.message()); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	sms := Message{Provider: "twilio", SID: "SM1", To: "+905321234567", Body: "b", Status: "queued", At: time.Now()}
	if e := newLogEntry(sms); e.extra != nil {
		t.Errorf("an SMS keeps extra fields: %+v", e.extra)
	}
}

// The log keeps the order and the counts across its blocks, and a receipt finds its message in any block.
func TestMessageLogAcrossBlocks(t *testing.T) {
	l := newMessageLog()
	n := 2*logBlock + 3
	at := time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)
	places := make([]int, n)
	for i := range n {
		to := fmt.Sprintf("+90532%07d", i%(n-1)) // the last recipient is the first one again
		places[i] = l.accept(Message{Provider: "twilio", SID: fmt.Sprintf("SM%d", i), AccountSID: "AC1", To: to,
			From: "+905550000000", Body: "b", Status: "queued", At: at.Add(time.Duration(i))})
	}
	for i, p := range places {
		if p != i {
			t.Fatalf("message %d logged at %d", i, p)
		}
	}
	last := logBlock + 7
	l.receipted(last, fmt.Sprintf("SM%d", last), "delivered", at)
	l.receipted(last, "SMother", "failed", at) // another message's receipt: nothing to note

	all := l.list("")
	if len(all) != n {
		t.Fatalf("list: %d messages, want %d", len(all), n)
	}
	for i, m := range all {
		if m.SID != fmt.Sprintf("SM%d", i) {
			t.Fatalf("list[%d] = %s", i, m.SID)
		}
	}
	if m := all[last]; m.Receipt != "delivered" || !m.ReceiptAt.Equal(at) {
		t.Errorf("receipt of message %d: %q at %v", last, m.Receipt, m.ReceiptAt)
	}
	first := l.list("+905320000000")
	if len(first) != 2 || first[0].SID != "SM0" || first[1].SID != fmt.Sprintf("SM%d", n-1) {
		t.Errorf("list of the first recipient: %+v", first)
	}
	st := l.snapshot()
	want := Stats{Accepted: n, Recipients: n - 1, Duplicates: 1, FirstAcceptedAt: at, LastAcceptedAt: at.Add(time.Duration(n - 1)),
		ByStatus: map[int]int{}, ByCode: map[int]int{}}
	if diff := cmp.Diff(want, st); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
	l.reset()
	if got := l.list(""); len(got) != 0 {
		t.Errorf("after reset: %d messages", len(got))
	}
}
