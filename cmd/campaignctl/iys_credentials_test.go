package main

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/campaignctl/campaignctl/providers/sandbox"
)

// İYS refusing the credentials is the user's settings to fix (exit 2) for every İYS command: sync and
// push said so; check printed the refusal inline and exited 0. It still shows what this engine holds.
func TestIYSCommandsWithRefusedCredentialsExit2(t *testing.T) {
	t.Parallel()
	env, _ := badInputDB(t) // three consents, one of them +905321000001's
	srv := httptest.NewServer(sandbox.New(sandbox.Options{IYSUsername: "api-user", IYSPassword: "right-pass", IYSCode: 123456, IYSBrandCode: 654321}))
	defer srv.Close()
	for k, v := range map[string]string{"IYS_BASE_URL": srv.URL, "IYS_USERNAME": "api-user", "IYS_PASSWORD": "wrong-pass", "IYS_CODE": "123456", "IYS_BRAND_CODE": "654321"} {
		env[k] = v
	}
	for _, args := range [][]string{{"iys", "sync"}, {"iys", "check", "+905321000001"}, {"iys", "check", "+905321000001", "--json"}} {
		out, stderr, code := cli(t, env, args...)
		if code != 2 || !strings.Contains(stderr, "İYS refuses the credentials") || !strings.Contains(stderr, "IYS_PASSWORD") || strings.Contains(out+stderr, "wrong-pass") {
			t.Errorf("%v with a wrong password: exit %d, want 2 naming the settings (and not the password)\nstdout: %s\nstderr: %s", args, code, out, stderr)
		}
		if args[1] == "check" && !strings.Contains(out, "ONAY") {
			t.Errorf("%v: what this engine holds is not shown: %s", args, out)
		}
	}
}
