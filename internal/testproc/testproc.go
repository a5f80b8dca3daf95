// Package testproc has what the tests' private servers (internal/testpg, internal/testredis) share: a free
// loopback port to start one on, and the end of its log for a failure message.
package testproc

import (
	"net"
	"os"
)

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Tail returns the last n bytes of the file at path (all of it when shorter), or why it could not be read.
func Tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
