package wire_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/campaignctl/campaignctl/providers/internal/wire"
)

// The trace WithTrace attaches is the one net/http reports to: a request answered was written, a
// request to a closed port was not, and never connected.
func TestTrackerFollowsRealRequests(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()

	for _, tt := range []struct {
		url                string
		connected, written bool
	}{{srv.URL, true, true}, {closed, false, false}} {
		var tr wire.Tracker
		req, err := http.NewRequestWithContext(tr.WithTrace(context.Background()), http.MethodPost, tt.url, http.NoBody)
		if err != nil {
			t.Fatal(err)
		}
		if resp, err := srv.Client().Do(req); err == nil {
			resp.Body.Close()
		}
		if got := tr.Connected(); got != tt.connected {
			t.Errorf("%s: Connected() = %v, want %v", tt.url, got, tt.connected)
		}
		if got := tr.Written(); got != tt.written {
			t.Errorf("%s: Written() = %v, want %v", tt.url, got, tt.written)
		}
	}
}
