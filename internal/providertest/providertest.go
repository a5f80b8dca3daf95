// Package providertest holds the checks that the provider adapters' tests (providers/...) share.
package providertest

import (
	"errors"
	"net"
	"strings"
	"testing"

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
