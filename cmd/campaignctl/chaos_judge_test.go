package main

import (
	"strings"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/providers/sandbox"
)

// chaosJudge tells the documented cost of --resend-unknown from a double send by the evidence that
// existed when the recipient was resent.
func TestChaosJudge(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	held := func(s float64) sandbox.Message { return sandbox.Message{SID: "SM1", At: at(s), Hung: true} }
	receipted := func(m sandbox.Message, s float64) sandbox.Message {
		m.Receipt, m.ReceiptAt = "delivered", at(s)
		return m
	}
	second := sandbox.Message{SID: "SM2", At: at(10)}
	unknown := chaosLogEntry{Status: "unknown", Reason: "twilio: Post ...: context deadline exceeded", At: at(2)}
	resend := chaosLogEntry{Status: "pending", Reason: "resend of an unknown outcome (resume --resend-unknown)", At: at(5)}
	resendRun := &chaosResend{start: at(4.9), claims: map[string]string{"u1": "u|twilio: timeout"}}

	for _, c := range []struct {
		name    string
		ms      []sandbox.Message
		hist    []chaosLogEntry
		resends []*chaosResend
		cost    bool
		class   string
	}{
		{"accepted twice without a resend", []sandbox.Message{held(1), second}, []chaosLogEntry{unknown}, nil,
			false, "no resend-unknown between"},
		{"resent with no evidence", []sandbox.Message{held(1), second}, []chaosLogEntry{unknown, resend}, []*chaosResend{resendRun},
			true, "cost of --resend-unknown"},
		{"resent although a receipt had reached the receiver", []sandbox.Message{receipted(held(1), 1.2), second}, []chaosLogEntry{unknown, resend}, []*chaosResend{resendRun},
			false, "despite a receipt; the earlier acceptance held, recorded unknown by the provider timeout"},
		{"a receipt that came only after the resend proves nothing then", []sandbox.Message{receipted(held(1), 6), second}, []chaosLogEntry{unknown, resend}, []*chaosResend{resendRun},
			true, "cost of --resend-unknown"},
		{"resent although recorded sent before", []sandbox.Message{held(1), second}, []chaosLogEntry{{Status: "sent", MessageID: "SM1", At: at(1.5)}, unknown, resend}, []*chaosResend{resendRun},
			false, "despite a sent outcome"},
		{"resent although the claim said sent", []sandbox.Message{held(1), second}, []chaosLogEntry{unknown, resend},
			[]*chaosResend{{start: at(4.9), claims: map[string]string{"u1": "s|~SMabc"}}},
			false, "despite a sent claim"},
		{"a claim read before an earlier resend does not count for a later one", []sandbox.Message{held(1), second}, []chaosLogEntry{unknown, resend},
			[]*chaosResend{{start: at(0.5), claims: map[string]string{"u1": "s|~SMabc"}}, resendRun},
			true, "cost of --resend-unknown"},
		{"one resend, two more acceptances", []sandbox.Message{held(1), second, {SID: "SM3", At: at(12)}}, []chaosLogEntry{unknown, resend}, []*chaosResend{resendRun},
			false, "no resend-unknown between"},
	} {
		v := chaosJudge(c.ms, c.hist, c.resends, "u1")
		if v.cost != c.cost || !strings.Contains(v.class, c.class) {
			t.Errorf("%s: cost %v, class %q (%s); want cost %v and a class with %q", c.name, v.cost, v.class, v.why, c.cost, c.class)
		}
	}
}
