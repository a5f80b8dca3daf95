package sendgrid

import (
	"fmt"
	"html"
	"strconv"
	"strings"

	sgmail "github.com/sendgrid/sendgrid-go/helpers/mail"

	"github.com/campaignctl/campaignctl/providers"
)

// The request as the adapter built it with sendgrid-go's helpers before it wrote the body itself, kept as
// the reference the body is held to: referenceMail is that buildMail, and its helpers are copied as they
// were, so that a change to the package's own cannot move the reference along with it.

// referenceBody is the body mail.GetRequestBody writes for ms from from, or the refusal of the request.
func referenceBody(from *sgmail.Email, ms []providers.Message) ([]byte, error) {
	mail, err := referenceMail(from, ms)
	if err != nil {
		return nil, err
	}
	return sgmail.GetRequestBody(mail), nil
}

// referenceMail builds the Mail Send body for ms, or refuses with a Permanent error what SendGrid would
// refuse for the whole request.
func referenceMail(from *sgmail.Email, ms []providers.Message) (*sgmail.SGMailV3, error) {
	if len(ms) > maxBatch {
		return nil, refuse(fmt.Sprintf("batch of %d messages is over SendGrid's %d per request", len(ms), maxBatch))
	}
	seen := make(map[string]struct{}, len(ms))
	template, anyHTML := ms[0].TemplateID, false
	for _, m := range ms {
		to := strings.ToLower(m.To)
		if _, dup := seen[to]; dup {
			// SendGrid answers 400 for the whole request; refusing here saves the round trip.
			return nil, refuse("two messages of one request go to the same address")
		}
		seen[to] = struct{}{}
		if m.TemplateID != template {
			return nil, refuse("the messages of one request must share one template ID")
		}
		anyHTML = anyHTML || m.HTML != ""
	}
	multi := template == "" && len(ms) > 1
	var shared *providers.Shared
	if multi {
		shared = refSharedOf(ms)
	}
	if multi && shared == nil {
		for _, m := range ms {
			if strings.Contains(m.Subject, textTag) || strings.Contains(m.Subject, htmlTag) {
				// SendGrid would put the recipient's text into the subject.
				return nil, refuse("a subject holds the tag that stands for a recipient's text: it must be sent alone")
			}
			if refSubstitutionSize(m, anyHTML) > MaxSubstitutionBytes {
				return nil, refuse("a rendered message is over 10,000 bytes, SendGrid's limit for substitutions: it must be sent alone")
			}
		}
	}

	mail := sgmail.NewV3Mail()
	mail.SetFrom(from)
	switch {
	case template != "":
		mail.SetTemplateID(template)
	case shared != nil:
		mail.AddContent(sgmail.NewContent("text/plain", shared.Text))
		if shared.HTML != "" {
			mail.AddContent(sgmail.NewContent("text/html", shared.HTML))
		}
	case multi:
		mail.AddContent(sgmail.NewContent("text/plain", textTag))
		if anyHTML {
			mail.AddContent(sgmail.NewContent("text/html", htmlTag))
		}
	default:
		m := ms[0]
		if m.Body != "" || m.HTML == "" {
			mail.AddContent(sgmail.NewContent("text/plain", m.Body))
		}
		if m.HTML != "" {
			mail.AddContent(sgmail.NewContent("text/html", m.HTML))
		}
	}
	for _, m := range ms {
		pz := sgmail.NewPersonalization()
		pz.AddTos(sgmail.NewEmail("", m.To))
		pz.Subject = m.Subject
		pz.SetCustomArg("campaign_id", strconv.FormatInt(m.CampaignID, 10))
		pz.SetCustomArg("user_id", m.UserID)
		if m.ListUnsubscribe != "" {
			// Per recipient: each link is signed for its own audience row.
			pz.SetHeader("List-Unsubscribe", m.ListUnsubscribe)
			pz.SetHeader("List-Unsubscribe-Post", providers.OneClickPost)
		}
		switch {
		case template != "":
			for k, v := range m.Data {
				pz.SetDynamicTemplateData(k, v)
			}
		case shared != nil:
			for i, tag := range shared.Tags {
				pz.SetSubstitution(tag, m.Values[i])
			}
		case multi:
			pz.SetSubstitution(textTag, m.Body)
			if anyHTML {
				pz.SetSubstitution(htmlTag, refHTMLOf(m))
			}
		}
		mail.AddPersonalizations(pz)
	}
	return mail, nil
}

// refSharedOf returns the content every message of ms shares (providers.Message.Shared) when the request can
// carry it once with each recipient's values as substitutions, or nil: then each recipient's rendered
// text and HTML are the substitutions. It can when every message has the same Shared with a value for each
// tag, no value holds the tags' prefix (a value is never mistaken for a tag), and each recipient's values
// fit SendGrid's limit.
func refSharedOf(ms []providers.Message) *providers.Shared {
	shared := ms[0].Shared
	if shared == nil || shared.Text == "" {
		return nil
	}
	for _, m := range ms {
		// SendGrid substitutes in the subject too: a subject that holds the prefix goes without tags.
		if m.Shared != shared || len(m.Values) != len(shared.Tags) || strings.Contains(m.Subject, providers.SharedTagPrefix) {
			return nil
		}
		n := 0
		for i, v := range m.Values {
			if strings.Contains(v, providers.SharedTagPrefix) {
				return nil
			}
			n += len(shared.Tags[i]) + len(v)
		}
		if n > MaxSubstitutionBytes {
			return nil
		}
	}
	return shared
}

// refSubstitutionSize is what m's substitutions weigh against MaxSubstitutionBytes.
func refSubstitutionSize(m providers.Message, withHTML bool) int {
	n := len(textTag) + len(m.Body)
	if withHTML {
		n += len(htmlTag) + len(refHTMLOf(m))
	}
	return n
}

// refHTMLOf is m's HTML part in a request where other messages have one. Content is shared by the whole
// request, so a message without HTML still gets an HTML part; an empty one would show a blank mail in
// clients that prefer HTML, so it gets its text, escaped, with its line breaks kept.
func refHTMLOf(m providers.Message) string {
	if m.HTML != "" || m.Body == "" {
		return m.HTML
	}
	return `<div style="white-space: pre-wrap">` + html.EscapeString(m.Body) + `</div>`
}
