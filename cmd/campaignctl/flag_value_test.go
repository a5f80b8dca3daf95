package main

import (
	"strings"
	"testing"
)

// A flag value of the wrong kind is a usage error (exit 2) that says what kind the flag takes, not the
// parser's words.
func TestAFlagValueOfTheWrongKindSaysWhatToGive(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"launch", "--rate", "abc"}, `--rate "abc" is not a number, e.g. 50 or 0.5; see ` + "`campaignctl launch --help`"},
		{[]string{"worker", "--concurrency", "x"}, `--concurrency "x" is not a whole number, e.g. 16 (the default)`},
		{[]string{"sandbox", "--netgsm-per-number", "abc"}, `--netgsm-per-number "abc" is not a whole number, e.g. 20 (the default)`},
		{[]string{"worker", "--provider-timeout", "5"}, `--provider-timeout "5" is not a duration, e.g. 30s`},
	} {
		_, stderr, code := cli(t, nil, tc.args...)
		if code != 2 || !strings.Contains(stderr, tc.want) || strings.Contains(stderr, "strconv") {
			t.Errorf("%s: exit %d, %q; want exit 2 and %q", strings.Join(tc.args, " "), code, stderr, tc.want)
		}
	}
}

// --record-wait takes 1 s to 1 h, like --shutdown-timeout: a run must hold its outcomes a while, and must
// not hold a batch for ever.
func TestWorkerRecordWaitIsBounded(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"0s", "500ms", "2h", "-1m"} {
		_, stderr, code := cli(t, nil, "worker", "--record-wait", v)
		if code != 2 || !strings.Contains(stderr, "--record-wait ") || !strings.Contains(stderr, "give 1s to 1h") {
			t.Errorf("worker --record-wait %s: exit %d, %q; want exit 2 naming the flag and its range", v, code, stderr)
		}
	}
}
