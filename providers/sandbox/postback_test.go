package sandbox_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/campaignctl/campaignctl/providers/sandbox"
)

func TestPostbackReceiverRecordsEachRecipient(t *testing.T) {
	s := sandbox.New(sandbox.Options{})
	srv := httptest.NewServer(s)
	defer srv.Close()
	post := func(body string) int {
		t.Helper()
		resp, err := http.Post(srv.URL+"/postback", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := post(`{"subject":"S","body":"B","recipients":[{"email":"a@example.com"},{"to":"+905551234567","email":"b@example.com"}]}`); got != 200 {
		t.Fatalf("two recipients: status %d, want 200", got)
	}
	if got := post(`{"body":"B","recipients":[{"email":"a@example.com"}]}`); got != 200 {
		t.Fatalf("a repeat: status %d, want 200", got)
	}
	for _, bad := range []string{`not json`, `{"body":"B","recipients":[]}`, `{"recipients":[{"name":"x"}]}`} {
		if got := post(bad); got != 400 {
			t.Errorf("%s: status %d, want 400", bad, got)
		}
	}
	st := s.Stats()
	if st.Accepted != 3 || st.Recipients != 2 || st.Duplicates != 1 {
		t.Errorf("accepted %d, recipients %d, duplicates %d; want 3, 2, 1", st.Accepted, st.Recipients, st.Duplicates)
	}
	var tos []string
	for _, m := range s.Messages() {
		if m.Provider != "postback" {
			t.Errorf("recorded under provider %q, want postback", m.Provider)
		}
		tos = append(tos, m.To)
	}
	if strings.Join(tos, ",") != "a@example.com,+905551234567,a@example.com" {
		t.Errorf("recorded to %v", tos)
	}
}

// The postback receiver answers the webhook's injected faults as the webhook does, and records nothing.
func TestPostbackReceiverFaults(t *testing.T) {
	for _, tt := range []struct {
		faults sandbox.Faults
		status int
	}{
		{sandbox.Faults{Rate429: 1}, 429},
		{sandbox.Faults{Rate500: 1}, 500},
		{sandbox.Faults{Rate503: 1}, 503},
	} {
		s := sandbox.New(sandbox.Options{Faults: tt.faults})
		srv := httptest.NewServer(s)
		resp, err := http.Post(srv.URL+"/postback", "application/json", strings.NewReader(`{"body":"B","recipients":[{"email":"a@example.com"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		srv.Close()
		if resp.StatusCode != tt.status || s.Stats().Accepted != 0 {
			t.Errorf("faults %+v: status %d, %d accepted; want %d and none", tt.faults, resp.StatusCode, s.Stats().Accepted, tt.status)
		}
	}
}
