package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/campaignctl/campaignctl/campaign"
)

// openPTY opens a pseudo-terminal: the terminal side a program reads and writes as its own, and the
// other side a test types into and reads from.
func openPTY(t *testing.T) (terminal, other *os.File) {
	t.Helper()
	other, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal here: %v", err)
	}
	t.Cleanup(func() { other.Close() })
	if err := unix.IoctlSetPointerInt(int(other.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(other.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	terminal, err = os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { terminal.Close() })
	return terminal, other
}

// An operator launches on a terminal, answers the question, and keeps the result: `launch --json >
// launch.json`. The report the question shows goes to the terminal (stderr), so stdout holds the
// launch's JSON alone; before, the preview table came first on stdout, headed "Dry run (nothing written,
// nothing sent)" over a launch that was then written and queued, and the file was not JSON.
func TestALaunchConfirmedOnATerminalKeepsStdoutForItsResult(t *testing.T) {
	t.Parallel()
	env, count := badInputDB(t)
	audience := writeFile(t, "a.sql", `SELECT user_id, phone, first_name FROM customers`)
	terminal, other := openPTY(t)
	var seen bytes.Buffer
	read := make(chan struct{})
	go func() {
		defer close(read)
		buf := make([]byte, 4096)
		for {
			n, err := other.Read(buf)
			seen.Write(buf[:n])
			if strings.Contains(seen.String(), "[y/N]") {
				other.Write([]byte("y\n")) //nolint:errcheck
				io.Copy(io.Discard, other) //nolint:errcheck // until the terminal side closes
				return
			}
			if err != nil {
				return
			}
		}
	}()
	var out bytes.Buffer
	code := run([]string{"launch", "--name", "asked", "--channel", "sms", "--audience", audience, "--json",
		"--message", testPrefix + "Merhaba {{.first_name}}"}, func(k string) string { return env[k] }, terminal, &out, terminal)
	terminal.Close()
	select {
	case <-read:
	case <-time.After(10 * time.Second):
		t.Fatal("the terminal's reader did not end")
	}
	if code != 0 {
		t.Fatalf("launch confirmed with y: exit %d\nterminal:\n%s\nstdout:\n%s", code, seen.String(), out.String())
	}
	var rep struct {
		ID       int64 `json:"id"`
		Eligible int   `json:"eligible"`
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil || rep.ID == 0 {
		t.Fatalf("stdout is not the launch's JSON (%v):\n%s", err, out.String())
	}
	if !strings.Contains(seen.String(), "About to launch") || strings.Contains(seen.String(), "Dry run") {
		t.Errorf("the question's report on the terminal:\n%s\nwant it headed \"About to launch\", not \"Dry run\"", seen.String())
	}
	if n := count(`SELECT count(*) FROM campaigns`); n != 1 {
		t.Fatalf("%d campaigns after the confirmed launch, want 1", n)
	}
}

// The sender's identity is found in any case, Turkish's too (İ and i, I and ı), and SENDER_IDENTITY's
// surrounding spaces are not part of it: "KAMPANYA İLETİŞİM A.Ş." was refused for "Kampanya İletişim A.Ş.".
func TestTheSendersIdentityIsFoundInTurkishCase(t *testing.T) {
	t.Parallel()
	re := regexp.MustCompile(identityPattern("Kampanya İletişim A.Ş."))
	for _, text := range []string{"KAMPANYA İLETİŞİM A.Ş.", "kampanya iletişim a.ş.", "Kampanya İletişim A.Ş.", "KAMPANYA ILETIŞIM A.Ş."} {
		if !re.MatchString(text) {
			t.Errorf("%q is not taken for the identity", text)
		}
	}
	if re.MatchString("Kampanya Iletisim AS") {
		t.Error("an identity without its dots was taken")
	}
	a := &app{getenv: func(k string) string { return map[string]string{"SENDER_IDENTITY": "  Kampanya A.Ş. "}[k] }}
	rules, err := a.contentRules(campaign.ChannelSMS, false)
	if err != nil || !rules.Sender.MatchString("Merhaba, Kampanya A.Ş. RET") {
		t.Fatalf("SENDER_IDENTITY with spaces around it: %v; want the identity found without them", err)
	}
}
