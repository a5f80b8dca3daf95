package sandbox

import (
	"io"
	"net/http"
	"sync"
	"unicode/utf8"
)

// The answers sent for every accepted message (Twilio's 201) have a fixed shape, so they are written
// straight into a buffer instead of through encoding/json's reflection, which with the map and the
// strings its input needed was a sizeable part of the sandbox's CPU a message. They must stay byte for
// byte what encoding/json wrote; the tests compare the two.

// bufs recycles the buffers that request bodies are read into and answers written into: what is kept of
// them is copied out (a string conversion, ResponseWriter.Write) before they go back.
var bufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// readAll reads r to its end into b, as io.ReadAll does into a buffer of its own.
func readAll(b []byte, r io.Reader) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

// writeJSONBytes answers status with the JSON body b, as writeJSON does: one Write, so that net/http
// sets Content-Length the same way (or chunks the same way, for a body over its buffer).
func writeJSONBytes(w http.ResponseWriter, status int, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// appendJSONString appends s as a quoted JSON string, escaped as encoding/json escapes it by default.
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	dst = appendJSONChars(dst, s)
	return append(dst, '"')
}

// appendJSONChars appends s escaped for a JSON string, without the quotes, as encoding/json escapes it by
// default: ", \ and the control characters, <, > and & (HTML-safe), U+2028 and U+2029, and each byte of
// invalid UTF-8 as \ufffd. Pieces escaped one after the other come out as their concatenation would
// unless a piece starts with UTF-8 continuation bytes.
func appendJSONChars(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	start := 0 // s[start:i] is yet to be copied as it is
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	return append(dst, s[start:]...)
}
