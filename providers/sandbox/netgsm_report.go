package sandbox

import (
	"cmp"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Netgsm delivery reports
//
// Netgsm posts no receipts: a sender asks POST /sms/rest/v2/report what became of its messages, with
// Basic auth and the JSON {"jobids":[...],"startdate":"dd.MM.yyyy HH:mm:ss","stopdate":"...",
// "pagenumber":0,"pagesize":100} (the dates in Turkey's time, both required; jobids optional: without
// them, every job sent between the dates). The answer is {"code":"00","description":"...","jobs":[{"jobid",
// "number","status","operator","msglen","deliveredDate","errorCode","referansID"}]}, or code 60 when no
// job matches, 70 for a malformed query (406), 30 for wrong credentials, and 80 beyond
// Options.NetgsmReportsPerMinute queries in a minute (Netgsm's limit is 10).
//
// A message's status is 0 (pending) until the receipt delay (ReceiptSettings) has passed since it was
// accepted, then final: 1 (delivered) unless its number is a magic report number +9055501SSNNN, whose
// report says status SS (02 expired, 03 invalid number, 04 not sent to the operator, 11 refused by the
// operator, 12 delivery error, 13 duplicate, 14 no credit, 15 blacklisted, 16 İYS rejected, 17 İYS
// error; any other SS is delivered). A message accepted while receipts are off stays pending. A final
// status served is noted in the message log (Message.Receipt "netgsm:<status>"). The jobs live in the
// sandbox's memory: a restarted sandbox knows none of those accepted before (code 60), as Netgsm would
// not forget them.

// netgsmReportPrefix is the prefix of the magic report numbers; the two digits after it are the status.
const netgsmReportPrefix = "+9055501"

// netgsmNoRecords is the report's code for a query no job matches; netgsmDateIn the layout of its dates.
const (
	netgsmNoRecords = "60"
	netgsmDateIn    = "02.01.2006 15:04:05"
)

// netgsmMagicReports are the statuses a magic report number may ask for.
var netgsmMagicReports = map[int]bool{2: true, 3: true, 4: true, 11: true, 12: true, 13: true, 14: true, 15: true, 16: true, 17: true}

// netgsmJob is what the report needs of one accepted job.
type netgsmJob struct {
	places []int // in the message log
	nos    []string
	at     time.Time // accepted
	ready  time.Time // its status is final from then; zero: never (receipts were off)
	msglen int
}

// netgsmReports is the fake's record of the jobs it accepted, and of the report queries of the last minute.
type netgsmReports struct {
	mu      sync.Mutex
	jobs    map[string]*netgsmJob
	queries []time.Time
}

// add records the job accepted at at, its messages at places in the log.
func (r *netgsmReports) add(job string, j *netgsmJob) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.jobs == nil {
		r.jobs = map[string]*netgsmJob{}
	}
	r.jobs[job] = j
}

// query counts a report query at now and reports false when limit queries were made within the minute
// before it (limit < 0: no limit).
func (r *netgsmReports) query(limit int, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	keep := r.queries[:0]
	for _, t := range r.queries {
		if now.Sub(t) < time.Minute {
			keep = append(keep, t)
		}
	}
	r.queries = keep
	if limit >= 0 && len(r.queries) >= limit {
		return false
	}
	r.queries = append(r.queries, now)
	return true
}

func (r *netgsmReports) reset() {
	r.mu.Lock()
	r.jobs, r.queries = nil, nil
	r.mu.Unlock()
}

// netgsmReportStatus is the report status of a message to no that is final (ready) at now.
func netgsmReportStatus(no string, final bool) int {
	if !final {
		return 0
	}
	if rest, ok := strings.CutPrefix(no, netgsmReportPrefix); ok && len(rest) == 5 {
		if st, err := strconv.Atoi(rest[:2]); err == nil && netgsmMagicReports[st] {
			return st
		}
	}
	return 1
}

type netgsmReportJob struct {
	JobID         string `json:"jobid"`
	Number        string `json:"number"`
	Status        int    `json:"status"`
	Operator      int    `json:"operator"`
	MsgLen        int    `json:"msglen"`
	DeliveredDate string `json:"deliveredDate"`
	ErrorCode     int    `json:"errorCode"`
	ReferansID    string `json:"referansID"`
}

type netgsmReportAnswer struct {
	Code        string            `json:"code"`
	Description string            `json:"description"`
	Jobs        []netgsmReportJob `json:"jobs"`
}

// netgsmReport imitates POST /sms/rest/v2/report (see above).
func (s *Server) netgsmReport(w http.ResponseWriter, r *http.Request) {
	// The API's outages, concurrency limit and latency hold for its reports too.
	w, done, _, ok := s.netgsmArrive(w, r)
	defer done()
	if !ok {
		return
	}
	now := s.now()
	limit := s.opts.NetgsmReportsPerMinute
	if limit == 0 {
		limit = 10
	}
	if !s.netgsmJobs.query(limit, now) {
		s.netgsmError(w, http.StatusOK, netgsmRate, "Dakikada en fazla 10 sorgu yapılabilir.")
		return
	}
	var q struct {
		JobIDs     []string `json:"jobids"`
		StartDate  string   `json:"startdate"`
		StopDate   string   `json:"stopdate"`
		PageNumber int      `json:"pagenumber"`
		PageSize   int      `json:"pagesize"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&q); err != nil {
		s.netgsmError(w, http.StatusNotAcceptable, netgsmParams, "Hatalı sorgulama: "+err.Error())
		return
	}
	start, err1 := time.ParseInLocation(netgsmDateIn, q.StartDate, turkeyTime)
	stop, err2 := time.ParseInLocation(netgsmDateIn, q.StopDate, turkeyTime)
	if err1 != nil || err2 != nil || stop.Before(start) || q.PageNumber < 0 || q.PageSize < 0 || q.PageSize > 100 {
		s.netgsmError(w, http.StatusNotAcceptable, netgsmParams, "Hatalı sorgulama: startdate, stopdate (gg.aa.yyyy ss:dd:sn), pagenumber ve pagesize (en fazla 100) alanlarını kontrol edin.")
		return
	}
	if q.PageSize == 0 {
		q.PageSize = 100
	}
	type hit struct {
		id string
		j  *netgsmJob
	}
	var hits []hit
	s.netgsmJobs.mu.Lock()
	in := func(j *netgsmJob) bool {
		return !j.at.Before(start.Truncate(time.Second)) && !j.at.After(stop.Add(time.Second))
	}
	if len(q.JobIDs) > 0 {
		for _, id := range q.JobIDs {
			if j := s.netgsmJobs.jobs[id]; j != nil && in(j) {
				hits = append(hits, hit{id, j})
			}
		}
	} else {
		for id, j := range s.netgsmJobs.jobs {
			if in(j) {
				hits = append(hits, hit{id, j})
			}
		}
	}
	s.netgsmJobs.mu.Unlock()
	slices.SortFunc(hits, func(a, b hit) int { return cmp.Or(a.j.at.Compare(b.j.at), strings.Compare(a.id, b.id)) })
	var jobs []netgsmReportJob
	for _, h := range hits {
		final := !h.j.ready.IsZero() && !now.Before(h.j.ready)
		for i, no := range h.j.nos {
			st := netgsmReportStatus(no, final)
			rj := netgsmReportJob{JobID: h.id, Number: strings.TrimPrefix(no, "+90"), Status: st, Operator: 30, MsgLen: h.j.msglen}
			if st == 1 {
				rj.DeliveredDate = h.j.ready.In(turkeyTime).Format(netgsmDateIn)
			}
			jobs = append(jobs, rj)
			if st != 0 {
				s.log.receipted(h.j.places[i], h.id, "netgsm:"+strconv.Itoa(st), now)
			}
		}
	}
	from := q.PageNumber * q.PageSize
	if from >= len(jobs) {
		s.netgsmError(w, http.StatusOK, netgsmNoRecords, "Kayıt bulunamadı.")
		return
	}
	jobs = jobs[from:min(len(jobs), from+q.PageSize)]
	writeJSON(w, http.StatusOK, netgsmReportAnswer{Code: netgsmOK, Description: "ok", Jobs: jobs})
}

// turkeyTime is Turkey's time (UTC+3 all year), in which Netgsm reads and writes dates.
var turkeyTime = time.FixedZone("TRT", 3*60*60)
