package main

import (
	"io"

	"github.com/schollz/progressbar/v3"
)

// taskBar is a progress bar for one long task (imports, code generation, seeding), drawn on stderr only
// when stderr is a terminal.
func (a *app) taskBar(total int64, what string) *progressbar.ProgressBar {
	if !drawsBars(a.stderr, false) {
		// Invisible: no output and no background goroutine.
		return progressbar.NewOptions64(total, progressbar.OptionSetVisibility(false))
	}
	// No spinner ticker: its goroutine reads the bar's state without the bar's lock (a data race in the
	// library); the bar is redrawn on every update instead.
	return progressbar.NewOptions64(total,
		progressbar.OptionSetSpinnerChangeInterval(0),
		progressbar.OptionSetWriter(a.stderr),
		progressbar.OptionSetDescription(what),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString("rows"),
		progressbar.OptionThrottle(100_000_000),
		progressbar.OptionOnCompletion(func() { io.WriteString(a.stderr, "\n") }), //nolint:errcheck
	)
}
