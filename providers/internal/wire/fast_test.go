package wire

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// An answer as Twilio's API gives it: read without net/http.
const twilioAnswer = "HTTP/1.1 201 Created\r\nDate: Wed, 02 Dec 2026 10:00:00 GMT\r\nContent-Type: application/json; charset=utf-8\r\n" +
	"Content-Length: 51\r\nTwilio-Request-Id: RQ0123456789abcdef0123456789abcdef\r\nTwilio-Request-Duration: 0.041\r\n" +
	"Access-Control-Allow-Origin: *\r\nX-Powered-By: AT-5000\r\nX-Shenanigans: none\r\nStrict-Transport-Security: max-age=31536000\r\n\r\n" +
	`{"sid": "SM0123456789abcdef0123456789abcd", "x": 1}`

var answerSeeds = []string{
	twilioAnswer,
	twilioAnswer + "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}",
	"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Length: 17\r\n\r\n{\"code\": 20429}\r\n",
	"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\nX-Message-Id: abc\r\n\r\n",
	"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-type: text/plain\r\nx-custom-thing: a\r\nX-Custom-Thing: b\r\n\r\nhello",
	"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
	"HTTP/1.1 200 OK\r\nContent-Length:  007 \r\n\r\n1234567tail",
	"HTTP/1.1 200\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nPragma: no-cache\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 200 OK\nContent-Length: 2\n\nok",
	"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\nok\r\n\r\n",
	"HTTP/1.1 200 OK\r\nX-Folded: a\r\n b\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nBad Name: x\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nX-Ctl: a\x01b\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nX-Obs: caf\xc3\xa9\t \r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n",
	"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
	"HTTP/1.1 +01 OK\r\nContent-Length: 0\r\n\r\n",
	"",
}

// readResponse reads exactly what http.ReadResponse reads, or leaves the stream untouched for it.
func FuzzReadResponse(f *testing.F) {
	for _, s := range answerSeeds {
		f.Add([]byte(s), false)
	}
	f.Add([]byte(twilioAnswer), true)
	f.Fuzz(func(t *testing.T, data []byte, head bool) {
		req, _ := http.NewRequest(http.MethodPost, "http://provider.test/x", nil)
		if head {
			req.Method = http.MethodHead
		}
		br := bufio.NewReaderSize(bytes.NewReader(data), 4096)
		got, done, gotErr := readResponse(br, req)
		if !done {
			rest, _ := io.ReadAll(br)
			if !bytes.Equal(rest, data) {
				t.Fatalf("left to net/http after reading %d bytes", len(data)-len(rest))
			}
			return
		}
		wantBR := bufio.NewReaderSize(bytes.NewReader(data), 4096)
		want, wantErr := http.ReadResponse(wantBR, req)
		if gotErr != nil || wantErr != nil {
			if gotErr == nil || wantErr == nil || gotErr.Error() != wantErr.Error() {
				t.Fatalf("error %v, net/http's %v", gotErr, wantErr)
			}
			return
		}
		type view struct {
			Status                string
			StatusCode            int
			Proto                 string
			ProtoMajor, ProtoMin  int
			Header, Trailer       http.Header
			ContentLength         int64
			Close, Uncompressed   bool
			TransferEncoding      []string
			SameRequest, HasBody  bool
			Body, Rest, BodyError string
		}
		see := func(r *http.Response, br *bufio.Reader) view {
			body, err := io.ReadAll(r.Body)
			rest, _ := io.ReadAll(br)
			v := view{r.Status, r.StatusCode, r.Proto, r.ProtoMajor, r.ProtoMinor, r.Header, r.Trailer, r.ContentLength,
				r.Close, r.Uncompressed, r.TransferEncoding, r.Request == req, r.Body != http.NoBody, string(body), string(rest), ""}
			if err != nil {
				v.BodyError = err.Error()
			}
			return v
		}
		if diff := cmp.Diff(see(want, wantBR), see(got, br)); diff != "" {
			t.Fatalf("answer (-net/http +readResponse):\n%s", diff)
		}
	})
}

// writeRequest writes exactly the bytes of Request.Write, or nothing.
func FuzzWriteRequest(f *testing.F) {
	f.Add("POST", "/2010-04-01/Accounts/AC1/Messages.json", "", "Body=Merhaba+M%C3%BC%C5%9Fteri&To=%2B905321234567", "Authorization", "Basic QUMxOnRva2Vu", "User-Agent", "campaignctl", int8(0))
	f.Add("POST", "/v3/mail/send", "a=1&b=2", `{"personalizations":[]}`, "Content-Type", "application/json", "X-Extra", "  padded\t", int8(0))
	f.Add("GET", "/x", "", "", "Accept", "*/*", "User-Agent", "", int8(0))
	f.Add("DELETE", "/x", "", "", "user-agent", "lower", "Host", "other.test", int8(0))
	f.Add("POST", "/x", "", "abc", "X-A", "1", "X-A", "2", int8(1))
	f.Add("POST", "/x", "", "abc", "X-A", "1", "X-B", "2", int8(-1))
	f.Add("PUT", "/x", "", "", "X-A", "1", "X-B", "2", int8(2))
	f.Add("", "/%zz\x01", "q", "", "Content-Length", "9", "Transfer-Encoding", "chunked", int8(0))
	f.Fuzz(func(t *testing.T, method, path, query, body, k1, v1, k2, v2 string, lengthMode int8) {
		build := func() *http.Request {
			req := &http.Request{Method: method, URL: &url.URL{Scheme: "http", Host: "provider.test:8080", Path: path, RawQuery: query},
				Header: http.Header{}, ProtoMajor: 1, ProtoMinor: 1}
			req.Header[k1] = append(req.Header[k1], v1)
			req.Header[k2] = append(req.Header[k2], v2)
			if body != "" || lengthMode == 2 {
				req.Body = io.NopCloser(strings.NewReader(body))
			}
			switch lengthMode {
			case 0:
				if body != "" {
					req.ContentLength = int64(len(body))
				}
			case 1:
				req.ContentLength = int64(len(body)) + 1
			case -1:
				req.ContentLength = int64(len(body)) - 1
			default:
				req.ContentLength = int64(lengthMode)
			}
			return req
		}
		var tr Transport
		if !tr.handles(build()) {
			return // net/http's, whole
		}
		var got bytes.Buffer
		gw := bufio.NewWriter(&got)
		done, gotErr := writeRequest(gw, build())
		gw.Flush()
		if !done {
			if got.Len() > 0 {
				t.Fatalf("left to net/http after writing %q", got.String())
			}
			return
		}
		var want bytes.Buffer
		ww := bufio.NewWriter(&want)
		wantErr := build().Write(ww)
		ww.Flush()
		if (gotErr == nil) != (wantErr == nil) || (gotErr != nil && gotErr.Error() != wantErr.Error()) {
			t.Fatalf("error %v, net/http's %v", gotErr, wantErr)
		}
		if diff := cmp.Diff(want.String(), got.String()); diff != "" {
			t.Fatalf("request (-net/http +writeRequest):\n%s", diff)
		}
	})
}

// The requests and answers of the providers take the direct paths: a fallback for them would cost each
// message what the direct paths exist to save.
func TestProvidersRequestsAndAnswersAreWrittenAndReadDirectly(t *testing.T) {
	req, _ := http.NewRequest(http.MethodPost, "https://api.twilio.com/2010-04-01/Accounts/AC1/Messages.json",
		strings.NewReader("Body=hi&From=%2B1&To=%2B90"))
	req.Header.Set("Authorization", "Basic QUMxOnRva2Vu")
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("User-Agent", "campaignctl")
	var out bytes.Buffer
	bw := bufio.NewWriter(&out)
	if done, err := writeRequest(bw, req); !done || err != nil {
		t.Fatalf("request written directly: %v, %v", done, err)
	}
	bw.Flush()
	if !strings.HasPrefix(out.String(), "POST /2010-04-01/Accounts/AC1/Messages.json HTTP/1.1\r\nHost: api.twilio.com\r\n") {
		t.Errorf("request %q", out.String())
	}
	for _, a := range []string{twilioAnswer, answerSeeds[2], answerSeeds[3]} {
		resp, done, err := readResponse(bufio.NewReaderSize(strings.NewReader(a), 4096), req)
		if !done || err != nil {
			t.Fatalf("answer %.40q read directly: %v, %v", a, done, err)
		}
		if resp.StatusCode < 200 || resp.Header.Get("Content-Length") == "" {
			t.Errorf("answer %.40q: %d %v", a, resp.StatusCode, resp.Header)
		}
	}
}

// A connection that ends within the head or the body fails as net/http fails.
func TestReadResponseCutShort(t *testing.T) {
	req, _ := http.NewRequest(http.MethodPost, "http://provider.test/x", nil)
	read := func(cut string, direct bool) error {
		br := bufio.NewReaderSize(strings.NewReader(cut), 4096)
		var resp *http.Response
		var err error
		done := false
		if direct {
			resp, done, err = readResponse(br, req)
		}
		if !done {
			resp, err = http.ReadResponse(br, req)
		}
		if err == nil {
			_, err = io.ReadAll(resp.Body)
		}
		return err
	}
	for n := 0; n < len(twilioAnswer); n++ {
		cut := twilioAnswer[:n]
		got, want := read(cut, true), read(cut, false)
		if got == nil || want == nil || got.Error() != want.Error() {
			t.Fatalf("answer cut after %d bytes: %v, net/http: %v", n, got, want)
		}
	}
	if err := read(twilioAnswer, true); err != nil {
		t.Fatalf("whole answer: %v", err)
	}
}

func BenchmarkReadResponse(b *testing.B) {
	req, _ := http.NewRequest(http.MethodPost, "http://provider.test/x", nil)
	sr := strings.NewReader("")
	br := bufio.NewReaderSize(sr, 4096)
	for _, direct := range []bool{true, false} {
		b.Run(pathName(direct), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				sr.Reset(twilioAnswer)
				br.Reset(sr)
				var resp *http.Response
				var err error
				if direct {
					resp, _, err = readResponse(br, req)
				} else {
					resp, err = http.ReadResponse(br, req)
				}
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
			}
		})
	}
}

func BenchmarkWriteRequest(b *testing.B) {
	const form = "Body=Kampanya+A.%C5%9E.%3A+Merhaba+M%C3%BC%C5%9Fteri+42&From=%2B15005550006&StatusCallback=http%3A%2F%2Fx&To=%2B905321234567"
	bw := bufio.NewWriterSize(io.Discard, 4096)
	for _, direct := range []bool{true, false} {
		b.Run(pathName(direct), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				req, _ := http.NewRequest(http.MethodPost, "https://api.twilio.com/2010-04-01/Accounts/AC1/Messages.json", strings.NewReader(form))
				req.Header["Authorization"] = []string{"Basic QUMxOnRva2Vu"}
				req.Header["Content-Type"] = []string{"application/x-www-form-urlencoded"}
				req.Header["User-Agent"] = []string{"campaignctl"}
				var err error
				if direct {
					_, err = writeRequest(bw, req)
				} else {
					err = req.Write(bw)
				}
				if err != nil {
					b.Fatal(err)
				}
				bw.Flush()
			}
		})
	}
}

// AppendForm encodes as url.Values.Encode.
func FuzzAppendForm(f *testing.F) {
	f.Add("Body", "Kampanya A.Ş.: Merhaba Müşteri 42, kodunuz K7Q2M9XW - RET yazıp 3338e gönderin", "To", "+905321234567", "From", "x y~z*'()!")
	f.Add("", "", "a", "", "a", "b")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, k3, v3 string) {
		v := url.Values{}
		v.Add(k1, v1)
		v.Add(k2, v2)
		v.Add(k3, v3)
		if got, want := string(AppendForm([]byte("prefix?"), v)), "prefix?"+v.Encode(); got != want {
			t.Fatalf("AppendForm %q, url.Values.Encode %q", got, want)
		}
	})
}

// pathName names a benchmark of the direct path or of net/http's.
func pathName(direct bool) string {
	if direct {
		return "direct"
	}
	return "net-http"
}
