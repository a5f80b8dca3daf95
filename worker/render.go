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
}

// Render renders r's message (To is r's address) and returns the template's data with it: the values the
// template reads (Template.DataOf), or every value when they go to a provider's template or a push's data.
func (rd *Renderer) Render(r *campaign.Recipient) (providers.Message, map[string]any, error) {
	c := rd.Campaign
	var listUnsubscribe string
	if rd.Unsubscribe != nil {
		listUnsubscribe, r.UnsubscribeURL = rd.listUnsubscribe(c.ID, r.UserID)
	}
	ch := c.Channel.Spec()
	var data map[string]any
	if c.TemplateID != "" || ch.Data {
		// Every value goes to the provider's template or the push's data.
		data = r.TemplateData(c.Channel, c.Name)
	} else {
		data = rd.Tmpl.DataOf(r, c.Channel, c.Name)
	}
	parts, err := rd.Tmpl.RenderParts(data)
	if err != nil {
		return providers.Message{}, nil, err
	}
	if ch.Segmented {
		if err := campaign.CheckSMSLength(parts.Text, c.MaxSegments); err != nil {
			return providers.Message{}, nil, fmt.Errorf("the message %w", err)
		}
	}
	if ch.SubjectHeader && strings.ContainsAny(parts.Subject, "\r\n") {
		return providers.Message{}, nil, fmt.Errorf("the subject would hold a line break (%s)", campaign.ReasonInvalidValue)
	}
	m := providers.Message{To: r.Address, Subject: parts.Subject, Body: parts.Text, HTML: parts.HTML,
		TemplateID: c.TemplateID, CampaignID: c.ID, UserID: r.UserID,
		Commercial: !c.Transactional, RecipientType: c.IYSRecipientType(), ListUnsubscribe: listUnsubscribe}
	if c.TemplateID != "" || ch.Data {
		// A provider-side template (and a push's data payload) gets the values themselves.
		m.Data = make(map[string]string, len(data))
		for k, v := range data {
			if k == ch.AddressColumn {
				continue
			}
			m.Data[k] = fmt.Sprint(v)
		}
	}
	return m, data, nil
}

// listUnsubscribe returns the List-Unsubscribe header of userID's message, "<URL>" and the mailto link with
// the URL's token where Mailto is set, and the URL, which the header holds: the link is signed once and
// both are one string.
func (rd *Renderer) listUnsubscribe(campaignID int64, userID string) (header, url string) {
	var buf [256]byte
	b := append(buf[:0], '<')
	b = rd.Unsubscribe.AppendURL(b, campaignID, userID)
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
