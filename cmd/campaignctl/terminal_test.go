package main

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// sizedPTY opens a pseudo-terminal of rows × cols (openPTY) and returns its terminal side.
func sizedPTY(t *testing.T, rows, cols uint16) *os.File {
	t.Helper()
	terminal, other := openPTY(t)
	if err := unix.IoctlSetWinsize(int(other.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols}); err != nil {
		t.Fatal(err)
	}
	return terminal
}

// Bars are drawn only on a terminal that says how wide and how tall it is: on a pseudo-terminal of no width
// or no rows (some CI runners, `ssh -t` or script(1) from a script) `status --watch` showed nothing for a
// whole campaign; it writes the lines it writes to a pipe there.
func TestBarsOnlyOnATerminalOfSomeWidth(t *testing.T) {
	if !drawsBars(sizedPTY(t, 40, 120), true) {
		t.Fatal("a terminal of 40 × 120: no bars")
	}
	if zero := sizedPTY(t, 40, 0); !isTerminal(zero) || drawsBars(zero, true) || drawsBars(zero, false) {
		t.Fatalf("a terminal of no width (terminal: %v): bars drawn; want the lines", isTerminal(zero))
	}
	// `stty cols 120` alone, as under script(1): 120 wide, no rows. The live bars (mpb) draw nothing
	// there; a one-line bar (an import's) does.
	if flat := sizedPTY(t, 0, 120); drawsBars(flat, true) || !drawsBars(flat, false) {
		t.Fatal("a terminal 120 wide of no rows: live bars drawn, or no one-line bar")
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if drawsBars(w, false) {
		t.Fatal("a pipe: bars drawn")
	}
}
