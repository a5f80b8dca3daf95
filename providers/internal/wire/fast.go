package wire

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// A provider's request and answer are the same few lines each time: a form or JSON POST with a known
// length, and an answer with a Content-Length. net/http's Request.Write and ReadResponse handle every
// shape HTTP/1.1 allows, at a cost a message feels (a transfer writer, the header's sorting and
// rewriting, the header parsed line by line through textproto with its allocations). writeRequest and
// readResponse write and read the common shape directly and hand every other one to net/http, whose
// bytes and results they reproduce exactly (FuzzReadResponse and FuzzWriteRequest hold them to it).

// writeRequest writes req to bw as req.Write would and reports true, or writes nothing and reports false
// when req is not of the shape it knows (the caller then calls req.Write): no proxy form, a body of a
// known length (or none), no trailer, no Connection: close asked for, a Host that needs no rewriting.
// Like req.Write, it closes the body.
func writeRequest(bw *bufio.Writer, req *http.Request) (bool, error) {
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	switch {
	case req.URL.Opaque != "" || req.Close || req.Trailer != nil || len(req.TransferEncoding) > 0:
		return false, nil
	case !plainHost(host):
		return false, nil
	case req.ContentLength < 0 || (req.ContentLength > 0 && (req.Body == nil || req.Body == http.NoBody)):
		return false, nil
	case req.ContentLength == 0 && req.Body != nil && req.Body != http.NoBody:
		// An unknown length: net/http sends it chunked.
		return false, nil
	}
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	ruri := req.URL.RequestURI()
	for i := 0; i < len(ruri); i++ {
		if c := ruri[i]; c < ' ' || c == 0x7f {
			return false, nil
		}
	}
	ua := defaultUserAgent
	if vv, ok := req.Header["User-Agent"]; ok {
		ua = ""
		if len(vv) > 0 {
			ua = vv[0]
		}
	}

	keys := keysPool.Get().(*[]string)
	defer func() {
		clear(*keys)
		*keys = (*keys)[:0]
		keysPool.Put(keys)
	}()
	for k := range req.Header {
		if !excludedFromHeader[k] {
			*keys = append(*keys, k)
		}
	}
	slices.Sort(*keys)

	bw.WriteString(method)
	bw.WriteByte(' ')
	bw.WriteString(ruri)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(host)
	bw.WriteString("\r\n")
	if ua != "" {
		// As net/http: trimmed after the test, so a value of spaces writes an empty field.
		bw.WriteString("User-Agent: ")
		bw.WriteString(textproto.TrimString(ua))
		bw.WriteString("\r\n")
	}
	// As net/http: a length for a body, and a zero one for the methods servers expect it of.
	if req.ContentLength > 0 || method == http.MethodPost || method == http.MethodPut || method == http.MethodPatch {
		var n [20]byte
		bw.WriteString("Content-Length: ")
		bw.Write(strconv.AppendInt(n[:0], req.ContentLength, 10))
		bw.WriteString("\r\n")
	}
	for _, k := range *keys {
		for _, v := range req.Header[k] {
			bw.WriteString(k)
			bw.WriteString(": ")
			bw.WriteString(textproto.TrimString(v))
			bw.WriteString("\r\n")
		}
	}
	bw.WriteString("\r\n")
	var err error
	if req.ContentLength > 0 {
		// As net/http: exactly ContentLength bytes, and a body that has more or fewer is an error.
		var n, extra int64
		n, err = io.Copy(bw, io.LimitReader(req.Body, req.ContentLength))
		if err == nil {
			extra, err = io.Copy(io.Discard, req.Body)
			n += extra
		}
		if err == nil && n != req.ContentLength {
			err = fmt.Errorf("http: ContentLength=%d with Body length %d", req.ContentLength, n)
		}
	}
	closeBody(req)
	if err == nil {
		// bufio keeps the first write error.
		_, err = bw.Write(nil)
	}
	return true, err
}

// defaultUserAgent is what net/http sends when a request has no User-Agent header.
const defaultUserAgent = "Go-http-client/1.1"

// excludedFromHeader are the header fields Request.Write writes itself or leaves out.
var excludedFromHeader = map[string]bool{"Host": true, "User-Agent": true, "Content-Length": true,
	"Transfer-Encoding": true, "Trailer": true}

var keysPool = sync.Pool{New: func() any { s := make([]string, 0, 8); return &s }}

// plainHost reports whether host is written as it is by net/http: ASCII letters, digits and the
// punctuation of a name, an address or a port, with no zone.
func plainHost(host string) bool {
	if host == "" {
		return false
	}
	for i := 0; i < len(host); i++ {
		c := host[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '.' || c == '-' || c == ':' || c == '[' || c == ']' || c == '_':
		default:
			return false
		}
	}
	return true
}

// readResponse reads the status line and headers of an answer to req from br as http.ReadResponse would
// and reports true, or reads nothing and reports false when the answer is not of the shape it knows (the
// caller then calls http.ReadResponse): HTTP/1.1, a final status with a body, exactly one Content-Length,
// no Transfer-Encoding, Connection, Pragma or Trailer field, each line ending in CRLF, no folded line.
// The headers must fit br's buffer. An error reading is returned as http.ReadResponse returns it.
func readResponse(br *bufio.Reader, req *http.Request) (*http.Response, bool, error) {
	if req.Method == http.MethodHead {
		return nil, false, nil
	}
	if _, err := br.Peek(1); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, true, err
	}
	var head []byte
	for {
		buf, _ := br.Peek(br.Buffered())
		if end := bytes.Index(buf, crlf2); end >= 0 {
			head = buf[:end+2]
			break
		}
		// A line ending in LF alone is for net/http; so is a head larger than the buffer.
		if bareLF(buf) || br.Buffered() == br.Size() {
			return nil, false, nil
		}
		if _, err := br.Peek(br.Buffered() + 1); err != nil {
			return nil, false, nil // net/http reads on and reports it as it would
		}
	}
	if bareLF(head) {
		return nil, false, nil
	}
	resp, ok := parseHead(head, req)
	if !ok {
		return nil, false, nil
	}
	br.Discard(len(head) + 2)
	if resp.ContentLength == 0 {
		resp.Body = http.NoBody
	} else {
		resp.Body = &fixedBody{br: br, left: resp.ContentLength}
	}
	return resp, true, nil
}

var crlf2 = []byte("\r\n\r\n")

// bareLF reports whether a line of b ends in LF without CR.
func bareLF(b []byte) bool {
	for i := bytes.IndexByte(b, '\n'); i >= 0; {
		if i == 0 || b[i-1] != '\r' {
			return true
		}
		j := bytes.IndexByte(b[i+1:], '\n')
		if j < 0 {
			return false
		}
		i += 1 + j
	}
	return false
}

// parseHead parses head, the status line and header lines each ending in CRLF (the blank line left
// out), into a response, or reports false for a shape readResponse leaves to net/http.
func parseHead(raw []byte, req *http.Request) (*http.Response, bool) {
	// The status and the values are cut from one string of the whole head: one allocation, not one a
	// field.
	text := string(raw)
	eol := strings.Index(text, "\r\n")
	line := text[:eol]
	head := text[eol+2:]
	// "HTTP/1.1 201 Created": three digits, then the end or a space and the reason.
	if len(line) < 12 || line[:9] != "HTTP/1.1 " || (len(line) > 12 && line[12] != ' ') {
		return nil, false
	}
	code := 0
	for _, c := range []byte(line[9:12]) {
		if c < '0' || c > '9' {
			return nil, false
		}
		code = code*10 + int(c-'0')
	}
	if code < 200 || code == http.StatusNoContent || code == http.StatusNotModified {
		return nil, false
	}
	status := line[9:]
	lines := strings.Count(head, "\r\n")
	h := make(http.Header, lines)
	values := make([]string, lines) // one allocation for the fields' slices, as textproto does
	var length int64 = -1
	for i := 0; len(head) > 0; i++ {
		eol := strings.Index(head, "\r\n")
		field := head[:eol]
		head = head[eol+2:]
		colon := strings.IndexByte(field, ':')
		if colon <= 0 {
			return nil, false
		}
		name, value := field[:colon], trimOWS(field[colon+1:])
		key, ok := commonHeader[name]
		if !ok {
			for _, c := range []byte(name) {
				if !tokenByte(c) {
					return nil, false
				}
			}
			key = textproto.CanonicalMIMEHeaderKey(name)
		}
		for _, c := range []byte(value) {
			if (c < ' ' && c != '\t') || c == 0x7f {
				return nil, false
			}
		}
		switch key {
		case "Transfer-Encoding", "Connection", "Pragma", "Trailer":
			return nil, false
		case "Content-Length":
			if length >= 0 || len(value) == 0 || len(value) > 18 {
				return nil, false
			}
			length = 0
			for _, c := range []byte(value) {
				if c < '0' || c > '9' {
					return nil, false
				}
				length = length*10 + int64(c-'0')
			}
		}
		values[i] = value
		vv := h[key]
		if vv == nil {
			h[key] = values[i : i+1 : i+1]
		} else {
			h[key] = append(vv, values[i])
		}
	}
	if length < 0 {
		return nil, false
	}
	return &http.Response{
		Status:        status,
		StatusCode:    code,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		ContentLength: length,
		Request:       req,
	}, true
}

// commonHeader holds the canonical names of the fields providers answer with, found without an
// allocation.
var commonHeader = func() map[string]string {
	m := map[string]string{}
	for _, k := range []string{"Content-Type", "Content-Length", "Date", "Server", "Retry-After",
		"Cache-Control", "Vary", "Etag", "Expires", "Last-Modified", "Location", "Set-Cookie",
		"Strict-Transport-Security", "Access-Control-Allow-Origin", "Access-Control-Allow-Headers",
		"Access-Control-Allow-Methods", "Access-Control-Expose-Headers", "X-Content-Type-Options",
		"X-Frame-Options", "X-Request-Id", "X-Message-Id", "Twilio-Request-Id", "Twilio-Request-Duration",
		"X-Powered-By", "X-Shenanigans", "Twilio-Concurrent-Requests", "X-Ratelimit-Limit",
		"X-Ratelimit-Remaining", "X-Ratelimit-Reset", "Content-Encoding", "Keep-Alive"} {
		m[k] = k
		m[strings.ToLower(k)] = k
	}
	return m
}()

// tokenByte reports whether c may be in an RFC 9110 token.
func tokenByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// trimOWS trims the spaces and tabs around a field's value, as textproto does.
func trimOWS(b string) string {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// fixedBody is a body of a known length read from the connection's reader: io.EOF with its last
// bytes, io.ErrUnexpectedEOF when the connection ends before them, as net/http's.
type fixedBody struct {
	br   *bufio.Reader
	left int64
}

func (b *fixedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.br.Read(p)
	b.left -= int64(n)
	switch {
	case b.left == 0:
		err = io.EOF
	case err == io.EOF:
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

func (b *fixedBody) Close() error { return nil }

// AppendForm appends v encoded as url.Values.Encode encodes it (keys in order, each key and value
// escaped as a query component) to dst, without the intermediate strings.
func AppendForm(dst []byte, v url.Values) []byte {
	var small [16]string
	keys := small[:0]
	for k := range v {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	start := len(dst)
	for _, k := range keys {
		for _, val := range v[k] {
			if len(dst) > start {
				dst = append(dst, '&')
			}
			dst = appendQueryEscape(dst, k)
			dst = append(dst, '=')
			dst = appendQueryEscape(dst, val)
		}
	}
	return dst
}

// appendQueryEscape appends s escaped as url.QueryEscape escapes it.
func appendQueryEscape(dst []byte, s string) []byte {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_', c == '.', c == '~':
			dst = append(dst, c)
		case c == ' ':
			dst = append(dst, '+')
		default:
			dst = append(dst, '%', hex[c>>4], hex[c&15])
		}
	}
	return dst
}
