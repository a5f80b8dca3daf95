package main

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// widePTY opens a pseudo-terminal cols columns wide (openPTY) and returns its terminal side.
func widePTY(t *testing.T, cols uint16) *os.File {
	t.Helper()
	terminal, other := openPTY(t)
	if err := unix.IoctlSetWinsize(int(other.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 40, Col: cols}); err != nil {
		t.Fatal(err)
	}
	return terminal
}

// Bars are drawn only on a terminal that says how wide it is: on a pseudo-terminal of no width (some CI
// runners, `ssh -t` from a script) `status --watch` showed nothing for a whole campaign; it writes the
// lines it writes to a pipe there.
func TestBarsOnlyOnATerminalOfSomeWidth(t *testing.T) {
	if !drawsBars(widePTY(t, 120)) {
		t.Fatal("a terminal 120 columns wide: no bars")
	}
	if zero := widePTY(t, 0); !isTerminal(zero) || drawsBars(zero) {
		t.Fatalf("a terminal of no width (terminal: %v): bars drawn; want the lines", isTerminal(zero))
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if drawsBars(w) {
		t.Fatal("a pipe: bars drawn")
	}
}
