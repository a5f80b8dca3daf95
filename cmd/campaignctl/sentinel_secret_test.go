package main

import (
	"strings"
	"testing"
)

// A REDIS_URL for Sentinel carries the sentinels' password as a query parameter (sentinel_password, see
// sentinelScheme). A URL that is wrong somewhere else (a DB number that is not one, an empty sentinel
// address) is bad input: exit 2, and the error names the URL with its secrets masked, the sentinels'
// password as much as the master's.
func TestABadSentinelURLDoesNotPrintTheSentinelPassword(t *testing.T) {
	t.Parallel()
	env, _ := badInputDB(t)
	const secret = "S3ntinelPassw0rd"
	for _, raw := range []string{
		"redis+sentinel://127.0.0.1:26379/mymaster/x?sentinel_password=" + secret,
		"redis+sentinel://:masterpw@127.0.0.1:26379,127.0.0.2:26379/mymaster/x?sentinel_username=ops&sentinel_password=" + secret,
		"redis+sentinel://,127.0.0.1:26379/mymaster?sentinel_password=" + secret,
	} {
		env["REDIS_URL"] = raw
		for _, args := range [][]string{{"status", "--json"}, {"dlq", "list", "--json"}, {"resume", "1"}} {
			stdout, stderr, code := cli(t, env, args...)
			if code != 2 {
				t.Errorf("%v with REDIS_URL %s: exit %d, want 2 (bad input)\n%s", args, raw, code, stderr)
			}
			if strings.Contains(stdout+stderr, secret) || strings.Contains(stdout+stderr, "masterpw") {
				t.Errorf("%v with a bad Sentinel REDIS_URL prints its password:\n%s", args, stderr)
			}
		}
	}
}
