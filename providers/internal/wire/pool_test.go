package wire_test

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/providertest"
	"github.com/campaignctl/campaignctl/providers/internal/wire"
)

// TestTransportKeepsAConnectionPerRequestInFlight sends waves of requests at once, more of them than
// MaxIdleConns: a pool sized for them dials each connection once, the default one dials again every wave.
func TestTransportKeepsAConnectionPerRequestInFlight(t *testing.T) {
	const inFlight, waves = wire.MaxIdleConns + 72, 3
	var dialled atomic.Int64
	var gate atomic.Pointer[chan struct{}] // closed when a wave may be answered
	var arrived sync.WaitGroup
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived.Done()
		<-*gate.Load() // every request of the wave is in flight at once
		io.WriteString(w, "ok")
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			dialled.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)

	run := func(conns int) int64 {
		dialled.Store(0)
		client := &http.Client{Transport: wire.NewTransport(conns)}
		defer client.CloseIdleConnections()
		for range waves {
			arrived.Add(inFlight)
			release := make(chan struct{})
			gate.Store(&release)
			var done sync.WaitGroup
			for range inFlight {
				done.Go(func() { get(t, client, srv.URL) })
			}
			arrived.Wait()
			close(release)
			done.Wait()
		}
		return dialled.Load()
	}
	if n := run(inFlight); n != inFlight {
		t.Errorf("a pool for %d requests in flight dialled %d connections over %d waves, want %d", inFlight, n, waves, inFlight)
	}
	if n := run(0); n <= inFlight {
		t.Errorf("the default pool (%d idle) dialled %d connections for %d waves of %d: the test does not tell the two apart", wire.MaxIdleConns, n, waves, inFlight)
	}
}

// get sends a GET to url and reads its answer.
func get(t *testing.T, client *http.Client, url string) {
	resp, err := client.Get(url)
	if err != nil {
		t.Error(err)
		return
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// TestWarmOpensTheConnectionsOfTheNextRequests: Warm returns once the connections it opened have shaken
// hands (a server slow to answer a handshake, as a distant provider is); two calls at once open a set each,
// which the next requests take without opening any of their own; a call finds connections idle once those
// requests are done; and what a call made ready for requests that never came lapses.
func TestWarmOpensTheConnectionsOfTheNextRequests(t *testing.T) {
	const n, handshake = 4, 150 * time.Millisecond
	srv := providertest.NewCountingServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }),
		&tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			time.Sleep(handshake)
			return nil, nil
		}})
	tr := &wire.Transport{TLSClientConfig: srv.Client().Transport.(*http.Transport).TLSClientConfig}
	var offset atomic.Int64 // how far the test moved the transport's clock
	wire.SetClock(tr, func() time.Time { return time.Now().Add(time.Duration(offset.Load())) })
	t.Cleanup(tr.CloseIdleConnections)
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	var warming sync.WaitGroup
	for range 2 {
		warming.Go(func() {
			if err := tr.Warm(context.Background(), u, n); err != nil {
				t.Error(err)
			}
		})
	}
	warming.Wait()
	if took := time.Since(start); took < handshake {
		t.Errorf("Warm returned after %v, before a handshake of %v could end", took, handshake)
	}
	if got := srv.Opened(2 * n); got != 2*n {
		t.Fatalf("two calls of Warm(%d) at once opened %d connections, want %d", n, got, 2*n)
	}

	client := &http.Client{Transport: tr}
	start = time.Now()
	var sends sync.WaitGroup
	for range 2 * n {
		sends.Go(func() { get(t, client, srv.URL) })
	}
	sends.Wait()
	if got := srv.Opened(2 * n); got != 2*n {
		t.Errorf("%d requests after two Warm(%d) opened %d connections of their own", 2*n, n, got-2*n)
	}
	if took := time.Since(start); took >= handshake {
		t.Errorf("%d requests after two Warm(%d) took %v: they waited for a handshake", 2*n, n, took)
	}
	// Those requests used up what was made ready: the connections are idle again, and a call finds them.
	if err := tr.Warm(context.Background(), u, n); err != nil || srv.Opened(2*n) != 2*n {
		t.Fatalf("Warm(%d) with %d idle opened %d more (%v)", n, 2*n, srv.Opened(2*n)-2*n, err)
	}
	// That call's requests never came: once its hold is over, its connections count as free again.
	offset.Store(int64(11 * time.Second))
	if err := tr.Warm(context.Background(), u, 2*n); err != nil || srv.Opened(2*n) != 2*n {
		t.Fatalf("Warm(%d) with %d idle and the last call's lapsed opened %d more (%v)", 2*n, 2*n, srv.Opened(2*n)-2*n, err)
	}
	// Still kept for its requests, a call's connections are not another's: this one opens its own.
	if err := tr.Warm(context.Background(), u, n); err != nil || srv.Opened(3*n) != 3*n {
		t.Fatalf("Warm(%d) with %d idle, all kept for the call before, opened %d, want %d (%v)", n, 2*n, srv.Opened(3*n)-2*n, n, err)
	}
}
