package worker

import (
	"sync"
	"time"
)

// senderIdle is how long a sender goroutine waits for another send before it ends.
const senderIdle = 10 * time.Second

// senders runs the sends of windows on goroutines that outlive a window. A send goes through twilio-go,
// net/http and encoding/json, a deep stack: a goroutine started for each send grows its stack (a copy each
// time it doubles) on every message, which cost about 7 % of a worker's CPU. A sender that finished waits
// senderIdle for the next send, so at full speed the goroutines and their grown stacks are reused; there
// are never more than the sends in flight at the busiest moment, and none left once sending stops.
type senders struct {
	work chan func() // unbuffered: a send is handed over only to a sender waiting for one
}

// newSenders returns a pool with no sender yet.
func newSenders() *senders { return &senders{work: make(chan func())} }

// Go runs f on an idle sender, or on a new one when none is idle, and marks it done in wg.
func (s *senders) Go(wg *sync.WaitGroup, f func()) {
	wg.Add(1)
	job := func() {
		defer wg.Done()
		f()
	}
	select {
	case s.work <- job: // an idle sender took it
	default:
		go s.run(job)
	}
}

// run runs job and then whatever comes, until it has been idle for senderIdle.
func (s *senders) run(job func()) {
	idle := time.NewTimer(senderIdle)
	defer idle.Stop()
	for {
		job()
		idle.Reset(senderIdle)
		select {
		case job = <-s.work:
		case <-idle.C:
			return
		}
	}
}
