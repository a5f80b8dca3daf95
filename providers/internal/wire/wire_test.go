package wire_test

import (
	"context"
	"io"
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

// watchedBody is a request body that counts the reads made while its tracker already said net/http was
// done with it.
type watchedBody struct {
	left int
	tr   *wire.Tracker
	late int
}

func (b *watchedBody) Read(p []byte) (int, error) {
	if b.tr.Settled() {
		b.late++
	}
	if b.left == 0 {
		return 0, io.EOF
	}
	n := min(len(p), b.left)
	b.left -= n
	return n, nil
}

// Settled says net/http reads a request's body no more only when it does not, including when the round
// trip ended before the body was written (a server that answers without reading it), and says so once
// the write is over.
func TestSettledOnlyOnceTheBodyIsRead(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/early" {
			w.WriteHeader(http.StatusRequestEntityTooLarge) // answers before reading 16 MiB
			return
		}
		io.Copy(io.Discard, r.Body) //nolint:errcheck // only read
	}))
	defer srv.Close()
	for _, path := range []string{"/early", "/read"} {
		for range 5 {
			var tr wire.Tracker
			body := &watchedBody{left: 16 << 20, tr: &tr}
			req, err := http.NewRequestWithContext(tr.WithTrace(context.Background()), http.MethodPost, srv.URL+path, body)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := srv.Client().Do(req)
			if err == nil {
				resp.Body.Close()
			}
			tr.Written() // waits for the write's report
			if !tr.Settled() {
				t.Fatalf("%s: not settled once the write was reported", path)
			}
			if body.late > 0 {
				t.Fatalf("%s: the body was read %d times after Settled", path, body.late)
			}
		}
	}
}
