package sandbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/campaignctl/campaignctl/providers"
)

// iysControlRoutes registers the İYS fake's part of the control API (see iys.go).
func (s *Server) iysControlRoutes() {
	s.mux.HandleFunc("POST /_sandbox/iys/consents", s.iysControlAdd)
	s.mux.HandleFunc("GET /_sandbox/iys/consents", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.IYSConsents())
	})
	s.mux.HandleFunc("GET /_sandbox/iys/stats", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.IYSStats())
	})
	s.mux.HandleFunc("GET /_sandbox/iys/faults", func(w http.ResponseWriter, r *http.Request) {
		s.iys.mu.Lock()
		f := s.iys.faults
		s.iys.mu.Unlock()
		writeJSON(w, http.StatusOK, f)
	})
	s.mux.HandleFunc("POST /_sandbox/iys/faults", func(w http.ResponseWriter, r *http.Request) {
		var f IYSFaults
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&f); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "decode İYS faults: " + err.Error()})
			return
		}
		if f.RateLimited < 0 || f.ServerError < 0 || f.Unavailable < 0 || f.Malformed < 0 {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "İYS fault counts must not be negative"})
			return
		}
		s.SetIYSFaults(f)
		s.logger.Info("sandbox iys faults set", "faults", f)
		writeJSON(w, http.StatusOK, f)
	})
	s.mux.HandleFunc("POST /_sandbox/iys/tokens/expire", func(w http.ResponseWriter, r *http.Request) {
		s.ExpireIYSTokens()
		w.WriteHeader(http.StatusNoContent)
	})
	s.mux.HandleFunc("POST /_sandbox/iys/tokens/revoke", func(w http.ResponseWriter, r *http.Request) {
		s.RevokeIYSTokens()
		w.WriteHeader(http.StatusNoContent)
	})
	s.mux.HandleFunc("POST /_sandbox/iys/reset", func(w http.ResponseWriter, r *http.Request) {
		s.ResetIYS()
		w.WriteHeader(http.StatusNoContent)
	})
}

// iysControlAdd records the posted consent changes: one JSON object, or an array of them, all or none.
// The answer has the same shape, with each change as recorded.
func (s *Server) iysControlAdd(w http.ResponseWriter, r *http.Request) {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 16<<20))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "read body: " + err.Error()})
		return
	}
	array := bytes.HasPrefix(bytes.TrimSpace(data), []byte("["))
	var in []IYSConsent
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if array {
		err = dec.Decode(&in)
	} else {
		in = make([]IYSConsent, 1)
		err = dec.Decode(&in[0])
	}
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "decode consent: " + err.Error()})
		return
	}
	out, err := s.AddIYSConsents(in...)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	if array {
		writeJSON(w, http.StatusCreated, out)
		return
	}
	writeJSON(w, http.StatusCreated, out[0])
}

// AddIYSConsents records consent changes as if made in İYS: by a citizen (an IYS_* source such as
// IYS_KISAMESAJ, the 3338 short number) or by the brand (an HS_* source). Recipient, Type, Status and
// Source are required; RecipientType defaults to BIREYSEL; ConsentDate defaults to the change's time, or
// to none for TACIR; CreationDate defaults to now and may be earlier (not later), to backdate the change;
// TransactionID is assigned. Either every change is valid and recorded, or none is. It returns the
// changes as recorded, which status and the pull will answer.
func (s *Server) AddIYSConsents(cs ...IYSConsent) ([]IYSConsent, error) {
	st := s.iys
	st.settle()
	now := st.now()
	out := make([]IYSConsent, len(cs))
	created := make([]time.Time, len(cs))
	for i, c := range cs {
		rc, at, err := st.checkControlConsent(c, now)
		if err != nil {
			if len(cs) > 1 {
				return nil, fmt.Errorf("consent %d: %w", i, err)
			}
			return nil, err
		}
		out[i], created[i] = rc, at
	}
	for i, c := range out {
		st.record(c, created[i])
		s.logger.Debug("sandbox iys consent recorded", "recipient", providers.MaskAddress(c.Recipient), "type", c.Type,
			"recipient_type", c.RecipientType, "status", c.Status, "source", c.Source)
	}
	return out, nil
}

// checkControlConsent validates and completes one control-API change.
func (st *iysState) checkControlConsent(c IYSConsent, now time.Time) (IYSConsent, time.Time, error) {
	if c.RecipientType == "" {
		c.RecipientType = iysIndividual
	}
	if e, ok := iysCheckType(c.Type); !ok {
		return c, now, errors.New(e.Message)
	}
	if e, ok := iysCheckRecipientType(c.RecipientType); !ok {
		return c, now, errors.New(e.Message)
	}
	if c.Status != iysApproved && c.Status != iysRejected {
		return c, now, fmt.Errorf("status %q must be ONAY or RET", c.Status)
	}
	rcpt, e, ok := iysCheckRecipient(c.Type, c.Recipient, nil)
	if !ok {
		return c, now, fmt.Errorf("%s (%s)", e.Message, e.Code)
	}
	c.Recipient = rcpt
	switch {
	case strings.HasPrefix(c.Source, "HS_"):
		if !slices.Contains(iysHSSources, c.Source) {
			return c, now, fmt.Errorf("source %q is not one of İYS's HS_ sources (%s)", c.Source, strings.Join(iysHSSources, ", "))
		}
	case strings.HasPrefix(c.Source, "IYS_") && len(c.Source) > 4 &&
		strings.Trim(c.Source, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") == "":
	default:
		return c, now, fmt.Errorf("source %q must be an HS_ value (the brand) or an IYS_ value such as IYS_KISAMESAJ, IYS_MOBIL or IYS_WEB (a citizen)", c.Source)
	}
	if c.TransactionID != "" {
		return c, now, errors.New("transactionId is assigned by İYS; leave it out")
	}
	at := now
	if c.CreationDate != "" {
		t, err := time.ParseInLocation(iysDateLayout, c.CreationDate, iysZone)
		if err != nil {
			return c, now, fmt.Errorf("creationDate %q must be YYYY-MM-DD HH:MM:SS (Turkish time)", c.CreationDate)
		}
		if t.After(now) {
			return c, now, fmt.Errorf("creationDate %q is in the future", c.CreationDate)
		}
		at = t
	}
	if c.ConsentDate != "" {
		t, err := time.ParseInLocation(iysDateLayout, c.ConsentDate, iysZone)
		if err != nil {
			return c, now, fmt.Errorf("consentDate %q must be YYYY-MM-DD HH:MM:SS (Turkish time)", c.ConsentDate)
		}
		if t.After(at) {
			return c, now, fmt.Errorf("consentDate %q is after the change's creationDate", c.ConsentDate)
		}
	} else if c.RecipientType == iysIndividual {
		c.ConsentDate = at.In(iysZone).Format(iysDateLayout)
	}
	c.CreationDate = at.In(iysZone).Format(iysDateLayout)
	c.TransactionID = newTransactionID()
	return c, at, nil
}

// IYSConsents returns the current consent of every key, as single status answers it, sorted by
// recipient, type and recipient type.
func (s *Server) IYSConsents() []IYSConsent {
	st := s.iys
	st.settle()
	st.mu.Lock()
	out := make([]IYSConsent, 0, len(st.current))
	for _, ev := range st.current {
		out = append(out, ev.c)
	}
	st.mu.Unlock()
	slices.SortFunc(out, func(a, b IYSConsent) int {
		return strings.Compare(a.Recipient+"\x00"+a.Type+"\x00"+a.RecipientType, b.Recipient+"\x00"+b.Type+"\x00"+b.RecipientType)
	})
	return out
}

// IYSStats returns the İYS fake's counters since the start or the last ResetIYS.
func (s *Server) IYSStats() IYSStats {
	st := s.iys
	st.settle()
	st.mu.Lock()
	defer st.mu.Unlock()
	out := st.stats
	out.ByCode = maps.Clone(st.stats.ByCode)
	out.AddsRefused = maps.Clone(st.stats.AddsRefused)
	out.AddsAcceptedByKey = maps.Clone(st.stats.AddsAcceptedByKey)
	out.MultiStatusBatches = slices.Clone(st.stats.MultiStatusBatches)
	return out
}

// SetIYSFaults replaces the İYS faults still pending; negative counts are taken as 0.
func (s *Server) SetIYSFaults(f IYSFaults) {
	for _, n := range []*int{&f.RateLimited, &f.ServerError, &f.Unavailable, &f.Malformed} {
		*n = max(0, *n)
	}
	s.iys.mu.Lock()
	s.iys.faults = f
	s.iys.mu.Unlock()
}

// ResetIYS clears the İYS fake's consents and changes, the batch adds and the V2 idempotence memory,
// IYSStats, the pending faults and its rate and hourly token buckets. Issued tokens stay valid, so that a
// running client keeps its session, and so do the IYSSettings.
func (s *Server) ResetIYS() {
	st := s.iys
	st.mu.Lock()
	st.events = nil
	clear(st.current)
	clear(st.tokenHr)
	st.faults = IYSFaults{}
	st.stats = newIYSStats()
	st.add.reset()
	st.mu.Unlock()
	st.limiter.reset()
}
