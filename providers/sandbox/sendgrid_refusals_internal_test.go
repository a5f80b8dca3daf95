package sandbox

import (
	"strconv"
	"testing"
)

// The memory of sent messages keeps the last sendgridMaxRemembered recipients, and a recipient sent to
// again counts from its latest message.
func TestSendgridSentBounded(t *testing.T) {
	m := newSendgridSent()
	mail := func(id string) sendgridSentMail { return sendgridSentMail{sgMessageID: id} }
	m.remember([]sendgridRemember{{email: "First@example.com", mail: mail("first-1")}, {email: "second@example.com", mail: mail("second-1")}})
	// The first recipient is sent to again: its latest message is the one remembered, and it now counts
	// from there (the third slot).
	m.remember([]sendgridRemember{{email: "first@example.com", mail: mail("first-2")}})
	// Two more than the ring holds: the first two slots go, the first recipient's older one and the second
	// recipient's.
	var batch []sendgridRemember
	for i := range sendgridMaxRemembered - 1 {
		batch = append(batch, sendgridRemember{email: "r" + strconv.Itoa(i) + "@example.com", mail: mail("r")})
	}
	m.remember(batch)

	if got, ok := m.lookup("FIRST@example.com"); !ok || got.sgMessageID != "first-2" {
		t.Errorf("first: %+v %v, want its second message, kept when the slot of its first went", got, ok)
	}
	if _, ok := m.lookup("second@example.com"); ok {
		t.Error("the oldest recipient is still remembered")
	}
	if len(m.last) > sendgridMaxRemembered || len(m.ring) != sendgridMaxRemembered {
		t.Errorf("%d remembered, ring %d; want at most %d", len(m.last), len(m.ring), sendgridMaxRemembered)
	}
	// One more, and the first recipient is the oldest.
	m.remember([]sendgridRemember{{email: "new@example.com", mail: mail("new")}})
	if _, ok := m.lookup("first@example.com"); ok {
		t.Error("the oldest recipient is still remembered")
	}
	if _, ok := m.lookup("new@example.com"); !ok {
		t.Error("the newest recipient is not remembered")
	}
	m.reset()
	if _, ok := m.lookup("new@example.com"); ok || len(m.ring) != 0 {
		t.Error("reset kept the messages")
	}
}
