package main

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/campaignctl/campaignctl/providers/sandbox"
)

// A re-verification under a brand asks İYS about that brand's consents only. When the consents stored
// here were all imported without a brand, it asks about none: it says so, and how to fix it, instead of
// reporting them up to date silently.
func TestAReverificationOfNoConsentSaysTheyHaveNoBrand(t *testing.T) {
	t.Parallel()
	env, _ := badInputDB(t) // three consents imported without a brand
	srv := httptest.NewServer(sandbox.New(sandbox.Options{}))
	defer srv.Close()
	for k, v := range map[string]string{"IYS_BASE_URL": srv.URL, "IYS_USERNAME": "u", "IYS_PASSWORD": "p", "IYS_CODE": "123456", "IYS_BRAND_CODE": "654321"} {
		env[k] = v
	}
	out, stderr, code := cli(t, env, "iys", "sync", "--reverify")
	if code != 0 || !strings.Contains(out, "re-verified 0") {
		t.Fatalf("iys sync --reverify: exit %d\nstdout: %s\nstderr: %s", code, out, stderr)
	}
	if !strings.Contains(stderr, "no consent of brand 654321 is stored to re-verify; 3 consents were imported without a brand") ||
		!strings.Contains(stderr, "IYS_BRAND_CODE") {
		t.Fatalf("a re-verification of no consent does not say why: %s", stderr)
	}
}
