// Package faults injects failures into the send path's calls to its Redis state and to Postgres, for tests
// that must see what the send path does when call N fails, stalls, or loses its reply after the server
// acted on it. The servers stay real: a rule sits in a wrapper around the real state.Store (the worker's
// State) or the real campaign.Store (its Store), the two interfaces the worker reaches them through.
package faults

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Kind is what happens to a call a rule picks.
type Kind int

const (
	// Fail fails the call before it reaches the server: nothing was done.
	Fail Kind = iota + 1
	// LoseReply lets the call reach the server and run there, then fails it as if the answer never came
	// back: the write happened, the caller cannot know.
	LoseReply
	// Stall holds the call for Delay (or until its context ends, which fails it) and then lets it go on.
	Stall
	// SlowReply lets the call run at the server at once, then holds its reply for Delay: what the server
	// did is there for everyone else meanwhile (a stalled Redis answering its queue, a slow network).
	SlowReply
)

func (k Kind) String() string {
	switch k {
	case Fail:
		return "fail"
	case LoseReply:
		return "lose the reply"
	case Stall:
		return "stall"
	case SlowReply:
		return "slow reply"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// ErrInjected is the error of a call a rule failed (Fail) or whose reply it dropped (LoseReply).
var ErrInjected = errors.New("injected fault: connection reset by peer")

// Call is one call as the rules see it: the name of the method called.
type Call struct {
	Name string
}

// Rule picks calls and says what happens to them.
type Rule struct {
	// Match picks the calls the rule counts; nil matches every call.
	Match func(Call) bool
	// Skip lets the first Skip matching calls through untouched.
	Skip int
	// Times is how many matching calls after those the rule acts on; 0 means every one.
	Times int
	Kind  Kind
	// Delay is how long a Stall holds a call; with Fail, the call fails after that long (a timeout).
	Delay time.Duration

	mu   sync.Mutex
	seen int
	hits int
}

// Hits returns how many calls the rule acted on.
func (r *Rule) Hits() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.hits
}

// take counts a call and reports whether the rule acts on it.
func (r *Rule) take(c Call) bool {
	if r.Match != nil && !r.Match(c) {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen++
	if r.seen <= r.Skip || (r.Times > 0 && r.seen > r.Skip+r.Times) {
		return false
	}
	r.hits++
	return true
}

// rules is an ordered set of rules; the first that acts on a call decides.
type rules struct {
	mu   sync.Mutex
	list []*Rule
}

// Add adds r and returns it (to read its Hits later).
func (s *rules) Add(r *Rule) *Rule {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.list = append(s.list, r)
	return r
}

// Clear removes every rule: from now on every call goes through.
func (s *rules) Clear() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.list = nil
}

// pick returns the rule that acts on c, or nil.
func (s *rules) pick(c Call) *Rule {
	s.mu.Lock()
	list := s.list
	s.mu.Unlock()
	for _, r := range list {
		if r.take(c) {
			return r
		}
	}
	return nil
}

// around runs call under rule r (nil: untouched): the fault before or after it.
func around(ctx context.Context, r *Rule, call func() error) error {
	if r == nil {
		return call()
	}
	if r.Kind == SlowReply {
		err := call()
		if werr := wait(ctx, r.Delay); werr != nil {
			return werr
		}
		return err
	}
	if err := wait(ctx, r.Delay); err != nil {
		return err
	}
	switch r.Kind {
	case Fail:
		return ErrInjected
	case LoseReply:
		if err := call(); err != nil {
			return err
		}
		return ErrInjected
	}
	return call()
}

// Method matches calls by method name, e.g. Method("Record", "ReleaseBatch").
func Method(names ...string) func(Call) bool {
	return func(c Call) bool {
		for _, n := range names {
			if c.Name == n {
				return true
			}
		}
		return false
	}
}

// wait holds for d (none when d is 0), or until ctx ends, which it returns.
func wait(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
