package twilio

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"sync"

	"github.com/campaignctl/campaignctl/providers/internal/wire"
)

// maxAnswer bounds the answer body read into memory. A Message resource or an error is about 1 KiB.
const maxAnswer = 1 << 20

var errAnswerTooLarge = errors.New("answer larger than 1 MiB")

// recorder is what a single Send sends through: twilio-go's client for the call (client.go) and the
// record of what happened to its request: whether a connection was obtained and whether the request was
// written (its embedded wire.Tracker), and the status and Retry-After of the answer. twilio-go keeps none
// of this, and a client per call is the only place where it cannot be mixed up with another goroutine's
// request.
//
// It reads the whole answer before handing it to the SDK (of a 2xx, only the members Send reads:
// trimAnswer). twilio-go v1.31.0 stops reading a success body at the end of the JSON value; unless the
// last read happens to report the end of the body, the connection would stay stuck until the timeout
// instead of going back to the pool.
type recorder struct {
	wire.Tracker
	p *Provider // its transport, target host and timeout

	mu         sync.Mutex
	status     int
	retryAfter string
}

// do sends req (whose context carries the recorder's trace and the request's deadline: SendRequest) and
// reads the answer in full before the deadline.
func (r *recorder) do(req *http.Request) (*http.Response, error) {
	resp, err := r.p.transport.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.status = resp.StatusCode
	r.retryAfter = resp.Header.Get("Retry-After")
	r.mu.Unlock()

	buf := answers.Get().(*bytes.Buffer)
	buf.Reset()
	_, err = buf.ReadFrom(io.LimitReader(resp.Body, maxAnswer+1))
	resp.Body.Close()
	if err == nil && buf.Len() > maxAnswer {
		buf.Truncate(maxAnswer)
		err = errAnswerTooLarge
	}
	if err == nil && resp.StatusCode >= 200 && resp.StatusCode <= 299 {
		// A message created: the SDK is handed the members Send reads (see readFields), not all thirty.
		var small [256]byte
		if t, ok := trimAnswer(small[:0], buf.Bytes()); ok {
			buf.Reset()
			buf.Write(t)
			resp.ContentLength = int64(buf.Len())
		}
	}
	resp.Body = &readBody{buf: buf, err: err}
	return resp, nil
}

// answers holds the buffers answers are read into. A buffer goes back when the body is closed: by the SDK
// after decoding a message, by SendRequest after decoding an error.
var answers = sync.Pool{New: func() any { return bytes.NewBuffer(make([]byte, 0, 2048)) }}

// readBody replays an answer read in full, then the error that cut it short, if any.
type readBody struct {
	mu  sync.Mutex
	buf *bytes.Buffer // nil once closed
	err error
}

func (b *readBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf == nil {
		return 0, errors.New("read on a closed answer")
	}
	n, err := b.buf.Read(p)
	if err == io.EOF && b.err != nil {
		err = b.err
	}
	return n, err
}

func (b *readBody) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf != nil && b.buf.Cap() <= 64<<10 {
		answers.Put(b.buf)
	}
	b.buf = nil
	return nil
}

// answer returns the HTTP status of the answer (0 when none arrived) and its Retry-After header.
func (r *recorder) answer() (status int, retryAfter string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status, r.retryAfter
}
