package sandbox

import (
	"io"
	"net/http"
	"sync"
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
