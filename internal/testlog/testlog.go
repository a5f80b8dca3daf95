// Package testlog is a log sink for tests: a command, a worker or a child process's copier writes it
// while the test reads it.
package testlog

import (
	"bytes"
	"strings"
	"sync"
)

// Buffer is a bytes.Buffer safe for writes and reads from several goroutines.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Lines returns the lines written so far that contain all of parts.
func (b *Buffer) Lines(parts ...string) []string {
	var out []string
	for _, ln := range strings.Split(b.String(), "\n") {
		all := ln != ""
		for _, p := range parts {
			all = all && strings.Contains(ln, p)
		}
		if all {
			out = append(out, ln)
		}
	}
	return out
}
