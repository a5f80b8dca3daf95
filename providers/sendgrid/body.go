package sendgrid

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	sgmail "github.com/sendgrid/sendgrid-go/helpers/mail"

	"github.com/campaignctl/campaignctl/internal/jsonstr"
	"github.com/campaignctl/campaignctl/providers"
)

// The Mail Send body is written here byte for byte as sendgrid-go writes it (mail.GetRequestBody of the
// mail.SGMailV3 its helpers build), without building that mail: the helpers give every personalization
// four maps and three slices, and encoding/json walks them by reflection and sorts each map's keys, a
// fifth of a worker's CPU at 1000 personalizations a request. TestBodyIsWhatSendGridGoWrites holds this
// writer to mail.GetRequestBody over generated requests, and FuzzString to encoding/json.

// layout is how one request carries its messages.
type layout struct {
	// template is the provider-side template every message names ("" for none).
	template string
	// shared is the content the messages share, sent once with each recipient's values as substitutions
	// (nil when it cannot be: see sharedOf).
	shared *providers.Shared
	// multi: several messages without a template; unless shared, each recipient's rendered text (and HTML,
	// when anyHTML) are the substitutions of tags.
	multi, anyHTML bool
	// texts and htmls are the messages' text and HTML (Message.Parts) when the request carries them: one
	// message, or several without shared content.
	texts, htmls []string
}

// plan checks ms against what SendGrid refuses for a whole request (a Permanent error: nothing is sent)
// and says how the request carries them.
func plan(ms []providers.Message) (layout, error) {
	if len(ms) > maxBatch {
		return layout{}, refuse(fmt.Sprintf("batch of %d messages is over SendGrid's %d per request", len(ms), maxBatch))
	}
	seen := make(map[string]struct{}, len(ms))
	l := layout{template: ms[0].TemplateID}
	for i := range ms {
		m := &ms[i]
		to := strings.ToLower(m.To)
		if _, dup := seen[to]; dup {
			// SendGrid answers 400 for the whole request; refusing here saves the round trip.
			return layout{}, refuse("two messages of one request go to the same address")
		}
		seen[to] = struct{}{}
		if m.TemplateID != l.template {
			return layout{}, refuse("the messages of one request must share one template ID")
		}
	}
	l.multi = l.template == "" && len(ms) > 1
	if l.multi {
		l.shared = sharedOf(ms)
	}
	if l.template != "" || l.shared != nil {
		return l, nil
	}
	l.texts, l.htmls = make([]string, len(ms)), make([]string, len(ms))
	for i := range ms {
		l.texts[i], l.htmls[i] = ms[i].Parts()
		l.anyHTML = l.anyHTML || l.htmls[i] != ""
	}
	if l.multi {
		for i := range ms {
			if strings.Contains(ms[i].Subject, textTag) || strings.Contains(ms[i].Subject, htmlTag) {
				// SendGrid would put the recipient's text into the subject.
				return layout{}, refuse("a subject holds the tag that stands for a recipient's text: it must be sent alone")
			}
			if substitutionSize(l.texts[i], l.htmls[i], l.anyHTML) > MaxSubstitutionBytes {
				return layout{}, refuse("a rendered message is over 10,000 bytes, SendGrid's limit for substitutions: it must be sent alone")
			}
		}
	}
	return l, nil
}

// appendBody appends the Mail Send body of ms laid out as l, from from: each message a personalization
// (its address, subject, unsubscribe headers, substitutions, custom_args campaign_id and user_id, and a
// provider template's data), then the content. Fields come in the order of sendgrid-go's structs, an empty
// one left out (their omitempty), a map's keys sorted, every string escaped as encoding/json escapes it.
func appendBody(b []byte, from *sgmail.Email, ms []providers.Message, l layout) []byte {
	b = append(b, `{"from":`...)
	b = appendEmail(b, from.Name, from.Address)
	b = append(b, `,"personalizations":[`...)
	w := pzWriter{l: l}
	if l.shared != nil {
		w.tagOrder = keyOrder(l.shared.Tags)
	}
	for i := range ms {
		if i > 0 {
			b = append(b, ',')
		}
		b = w.append(b, ms, i)
	}
	b = append(b, ']')
	switch {
	case l.template != "":
		b = append(b, `,"template_id":`...)
		b = jsonstr.Append(b, l.template)
	case l.shared != nil:
		b = appendContent(b, true, l.shared.Text, l.shared.HTML)
	case l.multi:
		html := ""
		if l.anyHTML {
			html = htmlTag
		}
		b = appendContent(b, true, textTag, html)
	default:
		text, html := l.texts[0], l.htmls[0]
		b = appendContent(b, text != "" || html == "", text, html)
	}
	return append(b, '}')
}

// appendContent appends the content: a text/plain part of text when withText, a text/html part of html
// when html is not empty.
func appendContent(b []byte, withText bool, text, html string) []byte {
	b = append(b, `,"content":[`...)
	if withText {
		b = appendPart(b, `{"type":"text/plain"`, text)
	}
	if html != "" {
		if withText {
			b = append(b, ',')
		}
		b = appendPart(b, `{"type":"text/html"`, html)
	}
	return append(b, ']')
}

func appendPart(b []byte, typ, value string) []byte {
	b = append(b, typ...)
	if value != "" {
		b = append(b, `,"value":`...)
		b = jsonstr.Append(b, value)
	}
	return append(b, '}')
}

// appendEmail appends a mail.Email: its name, then its address, each left out when empty.
func appendEmail(b []byte, name, address string) []byte {
	b = append(b, '{')
	if name != "" {
		b = append(b, `"name":`...)
		b = jsonstr.Append(b, name)
	}
	if address != "" {
		if name != "" {
			b = append(b, ',')
		}
		b = append(b, `"email":`...)
		b = jsonstr.Append(b, address)
	}
	return append(b, '}')
}

// pzWriter writes the personalizations of one request.
type pzWriter struct {
	l layout
	// tagOrder is the shared content's tags as the keys of a map are written: indices in the order of
	// their tags, each tag once (the last of equal ones: a map keeps the value set last).
	tagOrder []int
	keys     []string // a provider template's data keys, reused from one message to the next
}

// append appends m's personalization. Its maps have fixed keys written in sorted order: headers
// List-Unsubscribe < List-Unsubscribe-Post, the tags -campaignctl_html- < -campaignctl_text-, custom_args
// campaign_id < user_id.
func (w *pzWriter) append(b []byte, ms []providers.Message, i int) []byte {
	m := &ms[i]
	b = append(b, `{"to":[`...)
	b = appendEmail(b, "", m.To)
	b = append(b, ']')
	if m.Subject != "" {
		b = append(b, `,"subject":`...)
		b = jsonstr.Append(b, m.Subject)
	}
	if m.ListUnsubscribe != "" {
		b = append(b, `,"headers":{"List-Unsubscribe":`...)
		b = jsonstr.Append(b, m.ListUnsubscribe)
		b = append(b, `,"List-Unsubscribe-Post":`...)
		b = jsonstr.Append(b, providers.OneClickPost)
		b = append(b, '}')
	}
	switch {
	case w.l.template != "":
	case w.l.shared != nil:
		if len(w.tagOrder) > 0 {
			b = append(b, `,"substitutions":{`...)
			for j, i := range w.tagOrder {
				if j > 0 {
					b = append(b, ',')
				}
				b = jsonstr.Append(b, w.l.shared.Tags[i])
				b = append(b, ':')
				b = jsonstr.Append(b, m.Values[i])
			}
			b = append(b, '}')
		}
	case w.l.multi:
		b = append(b, `,"substitutions":{`...)
		if w.l.anyHTML {
			b = jsonstr.Append(b, htmlTag)
			b = append(b, ':')
			b = jsonstr.Append(b, htmlOf(w.l.texts[i], w.l.htmls[i]))
			b = append(b, ',')
		}
		b = jsonstr.Append(b, textTag)
		b = append(b, ':')
		b = jsonstr.Append(b, w.l.texts[i])
		b = append(b, '}')
	}
	b = append(b, `,"custom_args":{"campaign_id":"`...)
	b = strconv.AppendInt(b, m.CampaignID, 10)
	b = append(b, `","user_id":`...)
	b = jsonstr.Append(b, m.UserID)
	if m.CampaignNonce != "" {
		b = append(b, `,"campaign_nonce":`...)
		b = jsonstr.Append(b, m.CampaignNonce)
	}
	b = append(b, '}')
	if w.l.template != "" && len(m.Data) > 0 {
		w.keys = w.keys[:0]
		for k := range m.Data {
			w.keys = append(w.keys, k)
		}
		slices.Sort(w.keys)
		b = append(b, `,"dynamic_template_data":{`...)
		for j, k := range w.keys {
			if j > 0 {
				b = append(b, ',')
			}
			b = jsonstr.Append(b, k)
			b = append(b, ':')
			b = jsonstr.Append(b, m.Data[k])
		}
		b = append(b, '}')
	}
	return append(b, '}')
}

// keyOrder returns the indices of tags in the order a map keyed by them writes its keys: sorted, each key
// once, the last index of equal tags.
func keyOrder(tags []string) []int {
	order := make([]int, len(tags))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(i, j int) int { return strings.Compare(tags[i], tags[j]) })
	out := order[:0]
	for k, i := range order {
		if k+1 < len(order) && tags[order[k+1]] == tags[i] {
			continue
		}
		out = append(out, i)
	}
	return out
}

// bodySize is about the size of the body of ms: the bytes of what it carries and the names around them,
// with room for some escapes. The body is written into a buffer of that capacity, most often without
// growing it.
func bodySize(ms []providers.Message, l layout) int {
	n := 256
	for i := range ms {
		m := &ms[i]
		n += 180 + len(m.To) + len(m.Subject) + len(m.UserID) + len(m.ListUnsubscribe)
		switch {
		case l.template != "":
			for k, v := range m.Data {
				n += 6 + len(k) + len(v)
			}
		case l.shared != nil:
			for i, v := range m.Values {
				n += 6 + len(l.shared.Tags[i]) + len(v)
			}
		default:
			// An HTML part's tags are escaped (<, >, & take six bytes each): room for some.
			n += len(l.texts[i]) + 2*len(l.htmls[i])
		}
	}
	if l.shared != nil {
		n += len(l.shared.Text) + len(l.shared.HTML)
	}
	return n + n/8
}
