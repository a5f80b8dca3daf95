package main

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
)

// The HTTP servers' shared access rules: `campaignctl ui` and the /stats of `campaignctl webhooks` take
// the same credentials (--basic-auth-file, else CAMPAIGNCTL_UI_AUTH), checked the same way, and agree on
// what loopback is.

// uiAuthEnv holds the credentials (user:password) when no --basic-auth-file is given.
const uiAuthEnv = "CAMPAIGNCTL_UI_AUTH"

// basicAuth is a user name and password for HTTP Basic auth. Only the user name is ever shown; the
// password is kept as a hash for the comparison.
type basicAuth struct {
	user           string
	userSum, pwSum [sha256.Size]byte
	source         string // where they came from, for messages
}

// basicAuthFrom reads --basic-auth-file, else CAMPAIGNCTL_UI_AUTH; nil when neither is set. Errors never
// quote the content.
func (a *app) basicAuthFrom(file string) (*basicAuth, error) {
	if file != "" {
		fi, err := os.Stat(file)
		if err != nil {
			return nil, usagef("--basic-auth-file: %v; write one line user:password to it (chmod 600)", err)
		}
		if !fi.Mode().IsRegular() {
			return nil, usagef("--basic-auth-file %s is not a regular file; write one line user:password to a file (chmod 600)", file)
		}
		if perm := fi.Mode().Perm(); perm&0o007 != 0 {
			return nil, usagef("--basic-auth-file %s can be read or written by other users (mode %04o): chmod 600 %s", file, perm, file)
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, usagef("--basic-auth-file: %v", err)
		}
		c, why := parseBasicAuth(string(b))
		if why != "" {
			return nil, usagef("--basic-auth-file %s: %s; it must hold one line user:password", file, why)
		}
		c.source = file
		return c, nil
	}
	if v := a.getenv(uiAuthEnv); v != "" {
		c, why := parseBasicAuth(v)
		if why != "" {
			return nil, usagef("%s: %s; set it to user:password", uiAuthEnv, why)
		}
		c.source = uiAuthEnv
		return c, nil
	}
	return nil, nil
}

// parseBasicAuth parses "user:password" (one line; a final line break is allowed). The reason it returns
// on failure never contains the secret.
func parseBasicAuth(s string) (*basicAuth, string) {
	s = strings.TrimRight(s, "\r\n")
	switch {
	case strings.TrimSpace(s) == "":
		return nil, "empty"
	case strings.ContainsAny(s, "\r\n"):
		return nil, "more than one line"
	}
	user, pw, ok := strings.Cut(s, ":")
	switch {
	case !ok:
		return nil, "no ':' between user and password"
	case user == "":
		return nil, "the user is empty"
	case pw == "":
		return nil, "the password is empty"
	case strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return nil, "control characters"
	}
	return &basicAuth{user: user, userSum: sha256.Sum256([]byte(user)), pwSum: sha256.Sum256([]byte(pw))}, ""
}

// allows tells whether r carries these credentials. User and password are compared in constant time (as
// hashes, so that their lengths do not leak either). wrong is true when r carries other credentials.
func (c *basicAuth) allows(r *http.Request) (ok, wrong bool) {
	user, pw, given := r.BasicAuth()
	if !given {
		return false, false
	}
	us, ps := sha256.Sum256([]byte(user)), sha256.Sum256([]byte(pw))
	ok = subtle.ConstantTimeCompare(us[:], c.userSum[:])&subtle.ConstantTimeCompare(ps[:], c.pwSum[:]) == 1
	return ok, !ok
}

// challenge answers 401 with a Basic challenge for realm.
func challenge(w http.ResponseWriter, realm, text string) {
	w.Header().Set("WWW-Authenticate", `Basic realm="`+realm+`", charset="UTF-8"`)
	http.Error(w, "401 Unauthorized: "+text, http.StatusUnauthorized)
}

// require answers 401 with a Basic challenge to any request without the right credentials; text says
// what needs them.
func (c *basicAuth) require(realm, text string, next http.Handler, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ok, wrong := c.allows(r)
		if ok {
			next.ServeHTTP(w, r)
			return
		}
		if wrong {
			log.Warn("wrong credentials", "realm", realm, "remote", r.RemoteAddr, "path", r.URL.Path)
		}
		challenge(w, realm, text)
	})
}

// isLoopbackHost tells whether a host reaches this machine only: localhost or a loopback IP. An empty
// host (":8080") means every interface.
func isLoopbackHost(host string) bool {
	h := strings.TrimSuffix(strings.ToLower(host), ".")
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(h, "[]"))
	return ip != nil && ip.IsLoopback()
}

// forwardedHeaders are set by proxies; a request that carries one came from elsewhere through a proxy,
// whatever address it arrived from.
var forwardedHeaders = []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Real-Ip"}

// fromLoopback tells whether r was sent from this machine, to a loopback name: its connection comes
// from a loopback address (RemoteAddr, which the server takes from the connection, not from anything
// the client says), it did not pass a proxy that says so, and its Host is localhost or a loopback IP (a
// web page under a name that resolves to 127.0.0.1, DNS rebinding, does not count).
func fromLoopback(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return false
	}
	for _, h := range forwardedHeaders {
		if r.Header.Get(h) != "" {
			return false
		}
	}
	name := r.Host
	if h, _, err := net.SplitHostPort(name); err == nil {
		name = h
	}
	return isLoopbackHost(name)
}

// checkListenAddr validates a --addr and returns its host. example shows a good value. A URL given by
// mistake is refused without being quoted, since it may carry a password.
func checkListenAddr(addr, example string) (string, error) {
	if strings.ContainsAny(addr, "/@") {
		return "", usagef("--addr takes host:port, not a URL or user:password@host (it holds a '/' or an '@'): give, e.g., %s", example)
	}
	host, port, err := net.SplitHostPort(addr)
	if err == nil {
		if n, perr := strconv.Atoi(port); perr != nil || n < 0 || n > 65535 {
			err = errors.New("bad port")
		}
	}
	if err != nil {
		return "", usagef("--addr %q: give host:port, e.g. %s", addr, example)
	}
	return host, nil
}
