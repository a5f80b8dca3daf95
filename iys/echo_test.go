package iys_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/campaignctl/campaignctl/iys"
)

// An İYS answer that quotes the request shows neither the password (as sent, or as a form or a URL
// encodes it) nor the recipients the request named. Before, a password with a space or a '/' was masked
// only as typed, and its form encoding reached `iys sync`'s error; a multi-status request echoed back
// printed every recipient of it (up to 1,000) to stderr, and `iys outbox` kept them in its errors.
func TestAnAnswerThatEchoesTheRequestShowsNoPasswordNorRecipient(t *testing.T) {
	const password = `pw SECRET/marker+&=ü"x`
	recipients := []string{"+905329876541", "+905329876542"}
	var tokenOK atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		if strings.HasSuffix(r.URL.Path, "/oauth2/token") && tokenOK.Load() {
			_ = json.NewEncoder(w).Encode(map[string]any{"access_token": "acc-0123456789abcdef0123", "token_type": "bearer", "expires_in": 7200})
			return
		}
		w.WriteHeader(http.StatusBadRequest)
		_ = json.NewEncoder(w).Encode(map[string]any{"errors": []map[string]any{{"code": "H999",
			"message": "bad request " + r.URL.RawQuery + " " + string(body) + " " + r.Header.Get("Authorization")}}})
	}))
	defer srv.Close()
	c, err := iys.NewClient(iys.Config{BaseURL: srv.URL, Username: "api@brand.example", Password: password, IYSCode: "700001", BrandCode: "700002", MaxRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	leaks := func(what string, err error, secrets ...string) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s: no error", what)
		}
		for _, s := range secrets {
			if strings.Contains(err.Error(), s) {
				t.Errorf("%s: %q shows %q", what, err, s)
			}
		}
	}
	_, err = c.MultiStatus(context.Background(), iys.RecipientIndividual, iys.TypeMessage, recipients)
	leaks("a refused token request", err, password, url.QueryEscape(password), url.PathEscape(password), "SECRET")
	tokenOK.Store(true)
	_, err = c.MultiStatus(context.Background(), iys.RecipientIndividual, iys.TypeMessage, recipients)
	leaks("a refused multi-status request", err, append(recipients, "5329876541", "acc-0123456789abcdef0123")...)
}
