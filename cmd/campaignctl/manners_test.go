package main

import (
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// Every command explains itself with a short line and at least one example.
func TestEveryCommandHasHelpWithExamples(t *testing.T) {
	t.Parallel()
	a := &app{stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			if sub.Hidden || sub.Name() == "help" || sub.Name() == "completion" {
				continue
			}
			if strings.TrimSpace(sub.Short) == "" || strings.TrimSpace(sub.Example) == "" {
				t.Errorf("%q has no short help or no example", sub.CommandPath())
			}
			walk(sub)
		}
	}
	walk(a.newRootCmd())
}

func TestVersionAndCompletion(t *testing.T) {
	t.Parallel()
	out, stderr, code := cli(t, nil, "version", "--json")
	var v versionInfo
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil || v.Version == "" || v.Go == "" {
		t.Fatalf("version --json: exit %d, %q %s", code, out, stderr)
	}
	if out, _, code := cli(t, nil, "version"); code != 0 || !strings.HasPrefix(out, "campaignctl "+v.Version) {
		t.Fatalf("version: exit %d, %q", code, out)
	}
	for _, sh := range []string{"bash", "zsh", "fish"} {
		if out, stderr, code := cli(t, nil, "completion", sh); code != 0 || !strings.Contains(out, "campaignctl") {
			t.Errorf("completion %s: exit %d, %d bytes, %s", sh, code, len(out), stderr)
		}
	}
}
