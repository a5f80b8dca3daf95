package worker

import (
	"sync"
	"sync/atomic"
	"time"
)

// suspects remembers, in this process, the addresses whose sends a provider failed (a 5xx, a failed
// connection) since when: the first failure of each. An address that failed before the provider last
// accepted another send (Handler.lastAccepted) fails alone: the provider works, the address does not take
// what it is sent (an in-house receiver that answers 500 for one user, a token the service cannot deliver
// to). Counted as the provider's, such failures made its shared pace call it down once nothing but them
// was left to send; the probes, one a second, were theirs and failed, so it stayed down, nobody's attempts
// were used, the recipients never failed and every campaign of that provider crawled behind them. An
// outage fails every address, and no send is accepted after the failures began: nobody is a suspect.
type suspects struct {
	mu     sync.Mutex
	first  map[string]time.Time // provider + "\x00" + address → the first failure of its run of failures
	n      atomic.Int64         // len(first): an accepted send takes no lock while nobody fails
	pruned time.Time
}

// suspectMemory is how long a failure of an address is remembered; suspectsMax bounds how many are.
const (
	suspectMemory = time.Hour
	suspectsMax   = 10_000
)

func suspectKey(provider, addr string) string { return provider + "\x00" + addr }

// accepted notes that addr (when given) takes what provider sends it: its failures are forgotten.
func (s *suspects) accepted(provider, addr string) {
	if addr == "" || s.n.Load() == 0 {
		return
	}
	s.mu.Lock()
	delete(s.first, suspectKey(provider, addr))
	s.n.Store(int64(len(s.first)))
	s.mu.Unlock()
}

// failed notes that provider failed a send to addr at now.
func (s *suspects) failed(provider, addr string, now time.Time) {
	if addr == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.first == nil {
		s.first = map[string]time.Time{}
	}
	if len(s.first) >= suspectsMax || now.Sub(s.pruned) > suspectMemory {
		s.pruned = now
		for k, at := range s.first {
			if now.Sub(at) >= suspectMemory || len(s.first) >= suspectsMax {
				delete(s.first, k)
			}
		}
	}
	k := suspectKey(provider, addr)
	if at, ok := s.first[k]; !ok || now.Sub(at) >= suspectMemory {
		s.first[k] = now
	}
	s.n.Store(int64(len(s.first)))
}

// failedBefore says whether provider's failures of addr began, within suspectMemory of now, before
// lastAccepted (unix ns): the provider took another send since.
func (s *suspects) failedBefore(provider, addr string, lastAccepted int64, now time.Time) bool {
	if addr == "" || lastAccepted == 0 || s.n.Load() == 0 {
		return false
	}
	s.mu.Lock()
	at, ok := s.first[suspectKey(provider, addr)]
	s.mu.Unlock()
	return ok && at.UnixNano() < lastAccepted && now.Sub(at) < suspectMemory
}
