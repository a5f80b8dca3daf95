//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package wire

import "syscall"

// alive reports whether the idle connection pc can carry a request: the server has not closed it, and
// has sent nothing unasked (an idle HTTP/1.1 connection has nothing to read; on a TLS one, bytes are
// most likely a close_notify alert). It peeks at the socket without blocking and without consuming
// anything, below TLS.
func (pc *conn) alive() bool {
	sc, ok := pc.raw.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	alive := false
	// Control rather than Read: Read would first fail on the deadline of the last request, which may
	// have passed, and would wait for the socket to become readable.
	err = rc.Control(func(fd uintptr) {
		var b [1]byte
		for {
			_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			if err == syscall.EINTR {
				continue
			}
			// Nothing to read yet: open and quiet. A byte, the end of the stream (no error) or an error
			// (a reset): not usable.
			alive = err == syscall.EAGAIN || err == syscall.EWOULDBLOCK
			return
		}
	})
	return err == nil && alive
}
