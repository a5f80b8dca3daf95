package sandbox

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/json"
	"math/big"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/campaignctl/campaignctl/providers"
)

// Netgsm's answer codes the fake gives.
const (
	netgsmOK          = "00"
	netgsmText        = "20" // empty or too long text
	netgsmAuth        = "30" // credentials, or the API user's IP is not allowed
	netgsmHeader      = "40" // the sender header is not defined
	netgsmIYS         = "50" // İYS-controlled sending not allowed for the number
	netgsmParams      = "70" // a parameter is wrong or missing
	netgsmRate        = "80" // sending rate limit
	netgsmPerNumber   = "85" // more than 20 messages to the same number within a minute
	netgsmSystem      = "100"
	netgsmUnavailable = "101"
)

// netgsmMaxText is the longest text the fake takes (Netgsm's limit for a long SMS in Turkish).
const netgsmMaxText = 917

func (s *Server) netgsmRoutes() {
	s.mux.HandleFunc("/sms/rest/v2/send", s.netgsmSend)
	s.mux.HandleFunc("/sms/rest/v2/report", s.netgsmReport)
}

type netgsmAnswer struct {
	Code        string `json:"code"`
	Description string `json:"description"`
	JobID       string `json:"jobid,omitempty"`
}

func (s *Server) netgsmError(w http.ResponseWriter, status int, code, description string) {
	mark(w, outRequest) // Netgsm refuses in a 200 too: the status does not tell
	n, _ := strconv.Atoi(code)
	s.log.rejected(status, n)
	writeJSON(w, status, netgsmAnswer{Code: code, Description: description})
}

// netgsmSend imitates POST /sms/rest/v2/send of Netgsm's REST API: Basic auth, a JSON body with the sender
// header, the İYS filter and one or more messages to 10-digit numbers (5XXXXXXXXX), and an answer with a
// code (00 accepted, with a job ID) whatever the outcome, in a 200 unless the request is malformed (406).
// Every number is recorded as +90 and the number, so duplicates count across providers. The magic numbers
// of the Twilio fake fail here as an İYS refusal (code 50).
func (s *Server) netgsmSend(w http.ResponseWriter, r *http.Request) {
	w, done, user, ok := s.netgsmArrive(w, r)
	defer done()
	if !ok {
		return
	}
	if s.overRate(w, r) {
		return
	}
	var req struct {
		Header    string `json:"msgheader"`
		Encoding  string `json:"encoding"`
		IYSFilter string `json:"iysfilter"`
		Messages  []struct {
			Msg string `json:"msg"`
			No  string `json:"no"`
		} `json:"messages"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil {
		s.netgsmError(w, http.StatusNotAcceptable, netgsmParams, "Hatalı sorgulama: "+err.Error())
		return
	}

	hangAfterAccept := false
	f := s.faults.Load().pick("netgsm")
	if f != noFault && f != faultTimeout {
		mark(w, faultOutcome(f))
	}
	switch f {
	case fault429:
		s.netgsmError(w, http.StatusOK, netgsmRate, "Gönderim hız sınırı aşıldı.")
		return
	case fault500:
		s.netgsmError(w, http.StatusInternalServerError, netgsmSystem, "Sistem hatası.")
		return
	case fault503:
		s.netgsmError(w, http.StatusServiceUnavailable, netgsmUnavailable, "Sistem hatası.")
		return
	case faultRaw503:
		s.log.rejected(http.StatusServiceUnavailable, 0)
		writeRaw503(w)
		return
	case faultReset:
		s.log.connReset()
		resetConn(w)
		return
	case faultTimeout:
		hangAfterAccept = true
	}

	switch {
	case req.Header == "" || len(req.Header) > 11:
		s.netgsmError(w, http.StatusOK, netgsmHeader, "Mesaj başlığınız (gönderici adınız) sistemde tanımlı değil.")
		return
	case req.IYSFilter != "" && req.IYSFilter != "0" && req.IYSFilter != "11" && req.IYSFilter != "12":
		s.netgsmError(w, http.StatusNotAcceptable, netgsmParams, "Hatalı iysfilter değeri.")
		return
	case len(req.Messages) == 0:
		s.netgsmError(w, http.StatusNotAcceptable, netgsmParams, "Mesaj listesi boş.")
		return
	}
	for _, m := range req.Messages {
		switch {
		case m.Msg == "" || utf8.RuneCountInString(m.Msg) > netgsmMaxText:
			s.netgsmError(w, http.StatusOK, netgsmText, "Mesaj metni boş ya da çok uzun.")
			return
		case len(m.No) != 10 || m.No[0] != '5' || strings.Trim(m.No, "0123456789") != "":
			s.netgsmError(w, http.StatusNotAcceptable, netgsmParams, "Hatalı numara.")
			return
		case req.IYSFilter != "0" && strings.HasPrefix("+90"+m.No, magicPrefix):
			s.netgsmError(w, http.StatusOK, netgsmIYS, "İYS kontrollü gönderimde alıcının onayı yok.")
			return
		}
	}
	nos := make([]string, len(req.Messages))
	for i, m := range req.Messages {
		nos[i] = m.No
	}
	if !s.netgsm.take(s.opts.NetgsmPerNumber, nos, s.now()) {
		s.netgsmError(w, http.StatusOK, netgsmPerNumber, "Aynı numaraya 1 dakika içinde 20'den fazla gönderim yapılamaz.")
		return
	}
	job := netgsmJobID()
	at := time.Now().UTC()
	rec := &netgsmJob{at: at}
	if rs := s.receipts.settings.Load(); !rs.Off {
		rec.ready = at.Add(time.Duration(rs.DelayMS) * time.Millisecond)
	}
	for _, m := range req.Messages {
		msg := Message{Provider: "netgsm", SID: job, AccountSID: user, To: "+90" + m.No, From: req.Header, Body: m.Msg,
			Status: "queued", At: at, Hung: hangAfterAccept, IYSFilter: req.IYSFilter}
		_, msg.NumSegments = providers.SMSSegments(m.Msg)
		rec.places = append(rec.places, s.log.accept(msg))
		rec.nos = append(rec.nos, msg.To)
		rec.msglen = max(rec.msglen, utf8.RuneCountInString(m.Msg))
		recorded(w, 1, msg.NumSegments)
	}
	s.netgsmJobs.add(job, rec)
	if hangAfterAccept {
		mark(w, outHung)
		hang(r)
		return
	}
	writeJSON(w, http.StatusOK, netgsmAnswer{Code: netgsmOK, Description: "queued", JobID: job})
}

// netgsmArrive starts a request to one of Netgsm's routes (arrive: the API's outages, concurrency limit
// and latency), then checks that it is a POST and its Basic auth against the credentials the fake takes
// (any non-empty pair when none are set). It returns the ResponseWriter to use from then on, done, which
// the handler must defer, and the user code; ok is false when the request was answered already (code 30
// for wrong credentials).
func (s *Server) netgsmArrive(w http.ResponseWriter, r *http.Request) (_ http.ResponseWriter, done func(), user string, ok bool) {
	w, done, ok = s.arrive(w, r, apiNetgsm, true)
	if !ok {
		return w, done, "", false
	}
	if r.Method != http.MethodPost {
		s.netgsmError(w, http.StatusMethodNotAllowed, netgsmParams, "Method not allowed")
		return w, done, "", false
	}
	user, pass, ok := r.BasicAuth()
	if !ok || user == "" || pass == "" ||
		(s.opts.NetgsmUserCode != "" && user != s.opts.NetgsmUserCode) ||
		(s.opts.NetgsmPassword != "" && subtle.ConstantTimeCompare([]byte(pass), []byte(s.opts.NetgsmPassword)) != 1) {
		s.netgsmError(w, http.StatusOK, netgsmAuth, "Geçersiz kullanıcı adı, şifre veya kullanıcınızın API erişim izni yok.")
		return w, done, "", false
	}
	return w, done, user, true
}

// netgsmJobID returns a job ID shaped like Netgsm's: a number of about ten digits.
func netgsmJobID() string {
	n, _ := rand.Int(rand.Reader, big.NewInt(9_000_000_000))
	return n.Add(n, big.NewInt(1_000_000_000)).String()
}

// netgsmNumbers counts the messages each number took within a minute of the first, for Netgsm's limit on
// messages to one number (code 85).
type netgsmNumbers struct {
	mu   sync.Mutex
	seen map[string]*numberMinute
}

type numberMinute struct {
	from time.Time
	n    int
}

// take counts a message to each of nos and reports true, or, when one of them has had limit messages
// within the minute from its first, counts none and reports false. A limit of 0 takes everything.
func (c *netgsmNumbers) take(limit int, nos []string, now time.Time) bool {
	if limit <= 0 {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen == nil {
		c.seen = map[string]*numberMinute{}
	}
	for _, no := range nos {
		if m := c.seen[no]; m != nil && now.Sub(m.from) < time.Minute && m.n >= limit {
			return false
		}
	}
	if len(c.seen) > 100_000 {
		for no, m := range c.seen {
			if now.Sub(m.from) >= time.Minute {
				delete(c.seen, no)
			}
		}
	}
	for _, no := range nos {
		m := c.seen[no]
		if m == nil || now.Sub(m.from) >= time.Minute {
			m = &numberMinute{from: now}
			c.seen[no] = m
		}
		m.n++
	}
	return true
}
