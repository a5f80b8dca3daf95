package worker

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testredis"
	"github.com/campaignctl/campaignctl/internal/unsubscribe"
	"github.com/campaignctl/campaignctl/providers"
)

// Every commercial e-mail carries its recipient's own signed one-click link, in the List-Unsubscribe
// header and as {{.unsubscribe_url}} in the body.
func TestCommercialEmailCarriesItsRecipientsUnsubscribeLink(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	store, id, p, h := planEmail(t, 5, 10, rdb, func(s *campaign.Spec) { s.Message = "Size özel. Çıkmak için: {{.unsubscribe_url}}" })
	h.cfg.UnsubscribeMailto = "cikis@example.com"
	if err := h.RunBatch(context.Background(), id, 0); err != nil {
		t.Fatal(err)
	}
	c, err := store.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.accepted) != 5 {
		t.Fatalf("%d recipients e-mailed, want 5", len(p.accepted))
	}
	seen := map[string]bool{}
	for to, ms := range p.accepted {
		m := ms[0]
		link, _, ok := strings.Cut(strings.TrimPrefix(m.ListUnsubscribe, "<"), ">")
		if !ok || !strings.HasPrefix(link, "https://hooks.example.com/u/") || seen[link] {
			t.Fatalf("%s: List-Unsubscribe %q: want its own https link first", to, m.ListUnsubscribe)
		}
		seen[link] = true
		if !strings.Contains(m.ListUnsubscribe, "<mailto:cikis@example.com?subject=unsubscribe%20") {
			t.Errorf("%s: List-Unsubscribe %q offers no mailto", to, m.ListUnsubscribe)
		}
		if text, _ := m.Parts(); !strings.HasSuffix(text, "Çıkmak için: "+link) {
			t.Errorf("%s: body %q does not show the same link", to, text)
		}
		// The link names its campaign with the campaign's nonce: a link of another campaign that had the
		// same ID (a database re-created) refuses nobody of this one.
		got, err := testSigner.Check(strings.TrimPrefix(link, "https://hooks.example.com/u/"))
		if want := (unsubscribe.Link{CampaignID: id, Nonce: Nonce(c), UserID: m.UserID}); err != nil || got != want {
			t.Errorf("%s: link names %+v (%v), want %+v", to, got, err, want)
		}
	}
}

// A worker that cannot sign the links sends no commercial e-mail: the batch waits without using its
// retries. A transactional e-mail needs no link and goes.
func TestCommercialEmailWaitsForAWorkerThatCanSignTheLinks(t *testing.T) {
	t.Parallel()
	rdb, _ := testredis.New(t)
	store, id, p, h := planEmail(t, 3, 10, rdb)
	h.cfg.Unsubscribe = nil
	err := h.RunBatch(context.Background(), id, 0)
	var re *RetryError
	if !errors.As(err, &re) || re.Failure || !strings.Contains(err.Error(), "UNSUBSCRIBE_SECRET") {
		t.Fatalf("err = %v, want a RetryError that waits without using retries and names UNSUBSCRIBE_SECRET", err)
	}
	if c, _ := store.Counts(context.Background(), id); len(p.requests) != 0 || c.Pending != 3 {
		t.Fatalf("%d requests, counts %+v; want none, everyone pending", len(p.requests), c)
	}

	_, tid, tp, th := planEmail(t, 3, 10, rdb, func(s *campaign.Spec) { s.Transactional = true })
	th.cfg.Unsubscribe = nil
	if err := th.RunBatch(context.Background(), tid, 0); err != nil {
		t.Fatal(err)
	}
	for to, ms := range tp.accepted {
		if ms[0].ListUnsubscribe != "" {
			t.Fatalf("%s: a transactional e-mail carries List-Unsubscribe %q", to, ms[0].ListUnsubscribe)
		}
	}
	if len(tp.accepted) != 3 {
		t.Fatalf("%d transactional e-mails sent, want 3", len(tp.accepted))
	}
	_ = providers.OneClickPost
}
