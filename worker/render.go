package worker

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/unsubscribe"
	"github.com/campaignctl/campaignctl/providers"
)

// Renderer makes a recipient's message exactly as it goes out: the parts of the template over the
// recipient's row, the SMS length and subject checks, the one-click unsubscribe link and header of a
// commercial e-mail, the values for a provider-side template or a push's data. The worker's sends and a
// launch's test send both use it, so a test shows what the campaign will send.
type Renderer struct {
	Campaign *campaign.Campaign
	Tmpl     *campaign.Template
	// Unsubscribe signs the link of a commercial e-mail (nil: no link); Mailto is offered besides.
	Unsubscribe *unsubscribe.Signer
	Mailto      string
	// Form, when set, is the template's shared form, and Shared its content as a provider that sends many
	// messages in one request takes it (providers.Message.Shared): a message it can carry goes with its
	// values, without a text and HTML of its own.
	Form   *campaign.SharedForm
	Shared *providers.Shared
	// Nonce is the campaign's (Nonce), sent with each message for its receipts to name back
	// (providers.Message.CampaignNonce); "" sends none.
	Nonce string
}

// Render renders r's message (To is r's address).
func (rd *Renderer) Render(r *campaign.Recipient) (providers.Message, error) {
	c := rd.Campaign
	var listUnsubscribe string
	if rd.Unsubscribe != nil {
		listUnsubscribe, r.UnsubscribeURL = rd.listUnsubscribe(unsubscribe.Link{CampaignID: c.ID, Nonce: rd.Nonce, UserID: r.UserID})
	}
	ch := c.Channel.Spec()
	m := providers.Message{To: r.Address, TemplateID: c.TemplateID, CampaignID: c.ID, UserID: r.UserID, CampaignNonce: rd.Nonce,
		Commercial: !c.Transactional, RecipientType: c.IYSRecipientType(), ListUnsubscribe: listUnsubscribe}
	if rd.Form != nil && !ch.Segmented {
		if p, ok, err := rd.Tmpl.RenderShared(rd.Form, r, c.Channel, c.Name); ok {
			if err != nil {
				return providers.Message{}, err
			}
			if err := subjectCheck(ch, p.Subject); err != nil {
				return providers.Message{}, err
			}
			m.Subject, m.Shared, m.Values = p.Subject, rd.Shared, p.Values
			return m, nil
		}
	}
	var data map[string]any
	if c.TemplateID != "" || ch.Data {
		// Every value goes to the provider's template or the push's data.
		data = r.TemplateData(c.Channel, c.Name)
	} else {
		data = rd.Tmpl.DataOf(r, c.Channel, c.Name)
	}
	parts, err := rd.Tmpl.RenderParts(data)
	if err != nil {
		return providers.Message{}, err
	}
	if ch.Segmented {
		if err := campaign.CheckSMSLength(parts.Text, c.MaxSegments); err != nil {
			return providers.Message{}, fmt.Errorf("the message %w", err)
		}
	}
	if err := subjectCheck(ch, parts.Subject); err != nil {
		return providers.Message{}, err
	}
	m.Subject, m.Body, m.HTML = parts.Subject, parts.Text, parts.HTML
	if rd.Form != nil {
		// A value only the template packages print, a subject that is not plain: rendered here, and when
		// the values can still go into the shared content they do.
		if vals, ok, err := rd.Form.Values(data); ok && err == nil {
			m.Body, m.HTML, m.Shared, m.Values = "", "", rd.Shared, vals
		}
	}
	if c.TemplateID != "" || ch.Data {
		// A provider-side template (and a push's data payload) gets the values themselves.
		if c.TemplateID != "" {
			m.Data = make(map[string]string, len(data))
			for k, v := range data {
				if k != ch.AddressColumn {
					m.Data[k] = fmt.Sprint(v)
				}
			}
		} else {
			m.Data = campaign.PushData(rd.Tmpl, data, ch.AddressColumn)
		}
	}
	return m, nil
}

// subjectCheck refuses a subject that would hold a line break where the subject is a header.
func subjectCheck(ch campaign.ChannelSpec, subject string) error {
	if ch.SubjectHeader && strings.ContainsAny(subject, "\r\n") {
		return fmt.Errorf("the subject would hold a line break (%s)", campaign.ReasonInvalidValue)
	}
	return nil
}

// listUnsubscribe returns the List-Unsubscribe header of the message with the link l, "<URL>" and the
// mailto link with the URL's token where Mailto is set, and the URL, which the header holds: the link is
// signed once and both are one string. The link carries the campaign's nonce (Nonce) where there is one.
func (rd *Renderer) listUnsubscribe(l unsubscribe.Link) (header, url string) {
	var buf [256]byte
	b := append(buf[:0], '<')
	b = rd.Unsubscribe.AppendURL(b, l)
	end := len(b)
	b = append(b, '>')
	if rd.Mailto != "" {
		token := b[bytes.LastIndexByte(b[:end], '/')+1 : end]
		b = append(b, ", <mailto:"...)
		b = append(b, rd.Mailto...)
		b = append(b, "?subject=unsubscribe%20"...)
		b = append(b, token...)
		b = append(b, '>')
	}
	header = string(b)
	return header, header[1:end]
}
