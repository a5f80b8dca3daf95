// Package providertest holds the checks that the provider adapters' tests (providers/...) share.
package providertest

import (
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/providers"
)

// Error asserts that err is a *providers.Error from the named provider whose texts (Error, Reason and
// Message) contain none of secrets, and returns it. Empty secrets are ignored. A nil err or one that is
// not a *providers.Error ends the test.
func Error(t *testing.T, err error, provider string, secrets ...string) *providers.Error {
	t.Helper()
	if err == nil {
		t.Fatal("Send succeeded, want an error")
	}
	var pe *providers.Error
	if !errors.As(err, &pe) {
		t.Fatalf("error %T %v is not a *providers.Error", err, err)
	}
	for _, text := range []string{err.Error(), pe.Reason(), pe.Message} {
		for _, secret := range secrets {
			if secret != "" && strings.Contains(text, secret) {
				t.Errorf("error text %q contains %q", text, secret)
			}
		}
	}
	if pe.Provider != provider {
		t.Errorf("Provider %q, want %s", pe.Provider, provider)
	}
	return pe
}

// ClosedAddr returns a loopback "host:port" on which nothing listens, so that a connection to it is
// refused.
func ClosedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// CountingServer is an httptest server that counts the connections it accepts: the warm-up tests
// (providers.Warmer) tell with it which connections a Warm opened and whether the requests after it
// opened any of their own.
type CountingServer struct {
	*httptest.Server
	opened atomic.Int64
}

// NewCountingServer starts a CountingServer for handler, over TLS with tlsConfig when it is not nil (its
// certificate is the httptest one: trust it with srv.Client()'s TLS configuration). It is closed when the
// test ends.
func NewCountingServer(t testing.TB, handler http.Handler, tlsConfig *tls.Config) *CountingServer {
	t.Helper()
	s := &CountingServer{Server: httptest.NewUnstartedServer(handler)}
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.opened.Add(1)
		}
	}
	if tlsConfig != nil {
		s.TLS = tlsConfig
		s.StartTLS()
	} else {
		s.Start()
	}
	t.Cleanup(s.Close)
	return s
}

// Opened returns how many connections the server has accepted, once it has accepted at least want or
// after two seconds: the server sees a connection when it accepts it, a moment after the client's dial
// returned.
func (s *CountingServer) Opened(want int64) int64 {
	for end := time.Now().Add(2 * time.Second); s.opened.Load() < want && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
	}
	return s.opened.Load()
}
