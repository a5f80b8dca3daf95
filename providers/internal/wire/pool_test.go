package wire_test

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

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
				done.Go(func() {
					resp, err := client.Get(srv.URL)
					if err != nil {
						t.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				})
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
