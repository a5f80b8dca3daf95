//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package wire

// alive reports true: this system has no non-blocking peek here, so an idle connection is reused
// unchecked, and a request written on one the server has closed fails as ambiguous.
func (pc *conn) alive() bool { return true }
