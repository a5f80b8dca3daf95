package sendgrid

import (
	"errors"
	"io"
	"net/http"
)

// maxAnswer bounds the answer body read into memory. SendGrid answers a send with an empty body or an
// error list of a few hundred bytes.
const maxAnswer = 1 << 20

var errAnswerTooLarge = errors.New("answer larger than 1 MiB")

// boundingTransport is the RoundTripper of the shared http.Client. It hands on each answer with a body
// that cannot be read past maxAnswer. (Whether a request was written is told by the wire.Tracker that
// SendBatch puts in the request's context.)
type boundingTransport struct {
	next http.RoundTripper
}

// RoundTrip sends req and bounds the answer's body.
func (t *boundingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	resp.Body = &boundedBody{r: io.LimitReader(resp.Body, maxAnswer+1), c: resp.Body}
	return resp, nil
}

// boundedBody fails a read past maxAnswer, so that a runaway answer cannot fill the memory.
type boundedBody struct {
	r io.Reader
	c io.Closer
	n int
}

func (b *boundedBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.n += n
	if b.n > maxAnswer {
		return n, errAnswerTooLarge
	}
	return n, err
}

func (b *boundedBody) Close() error { return b.c.Close() }
