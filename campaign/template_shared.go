package campaign

import (
	"strconv"
	"strings"
)

// SharedForm is a message's text and HTML parts written once for many recipients, with a substitution tag
// where each recipient's value goes: what a provider that puts each recipient's values into one shared
// content (SendGrid's substitutions) sends instead of every recipient's rendered message. Replacing each
// tag by the value of the same index that SharedValues returns gives, byte for byte, the parts RenderParts
// renders.
type SharedForm struct {
	Text, HTML string
	Tags       []string
	slots      []sharedSlot // what each tag stands for
	// The slots of the text's and the HTML's values, in the parts' order, for RenderShared; and each slot's
	// field's index in the template's plainFields (when every part is plain).
	textSlots, htmlSlots []int
	slotField            []int
}

// sharedSlot is one tag: a field's value as written into the text part, or (html) into the HTML part.
type sharedSlot struct {
	field string
	html  bool
}

// Shared returns the shared form of t's text and HTML parts with tags that start with prefix, or nil when a
// part is not plain (anything but text and {{.field}}), t has a provider-side template, or prefix occurs in
// the parts' own text. The subject is not part of it: each recipient's is rendered.
func (t *Template) Shared(prefix string) *SharedForm {
	if t.t == nil || t.plainText == nil || (t.html != nil && t.plainHTMLPart == nil) || prefix == "" {
		return nil
	}
	var slots []sharedSlot
	var slotField []int
	slotOf := map[sharedSlot]int{}
	write := func(b *strings.Builder, p *plainTemplate, segSlots *[]int) bool {
		for _, s := range p.segs {
			if s.field == "" {
				if strings.Contains(s.text, prefix) {
					return false
				}
				b.WriteString(s.text)
				continue
			}
			slot := sharedSlot{field: s.field, html: p.html}
			i, ok := slotOf[slot]
			if !ok {
				i = len(slots)
				slotOf[slot] = i
				slots = append(slots, slot)
				slotField = append(slotField, index(t.plainFields, s.field))
			}
			*segSlots = append(*segSlots, i)
			b.WriteString(sharedTag(prefix, i))
		}
		return true
	}
	var text, html strings.Builder
	var textSlots, htmlSlots []int
	if !write(&text, t.plainText, &textSlots) {
		return nil
	}
	if t.html != nil && !write(&html, t.plainHTMLPart, &htmlSlots) {
		return nil
	}
	f := &SharedForm{Text: text.String(), HTML: html.String(), Tags: make([]string, len(slots)), slots: slots,
		textSlots: textSlots, htmlSlots: htmlSlots, slotField: slotField}
	for i := range slots {
		f.Tags[i] = sharedTag(prefix, i)
	}
	if !t.sharedAgrees(f) {
		return nil
	}
	return f
}

func sharedTag(prefix string, i int) string {
	return prefix + strconv.Itoa(i) + "-"
}

// Values returns data's values for f's tags, each written as its part writes it (escaped for HTML in the
// HTML part). ok is false when a value is of a type only the template package prints (the recipient's
// message must be sent rendered); a missing value is the error RenderParts gives for it.
func (f *SharedForm) Values(data map[string]any) (vals []string, ok bool, err error) {
	vals = make([]string, len(f.slots))
	for i, s := range f.slots {
		str, ok, err := plainValue(data, s.field)
		if !ok || err != nil {
			return nil, false, err
		}
		if s.html {
			str = htmlValue.Replace(str)
		}
		vals[i] = str
	}
	return vals, true, nil
}

// sharedAgrees reports whether f with its values put in renders what RenderParts renders, over values
// that hold every character the escapers treat specially and the tags' own prefix characters: the shared
// form is offered only when it does.
func (t *Template) sharedAgrees(f *SharedForm) bool {
	data := map[string]any{}
	for _, s := range f.slots {
		data[s.field] = "<a href='x'>\"" + s.field + "\" & + \x00 ğ ü -</a>"
	}
	want, err := t.RenderParts(data)
	if err != nil {
		return false
	}
	vals, ok, err := f.Values(data)
	if !ok || err != nil {
		return false
	}
	return SubstituteOnce(f.Text, f.Tags, vals) == want.Text && SubstituteOnce(f.HTML, f.Tags, vals) == want.HTML
}

// SubstituteOnce replaces every tag in s by its value in one pass, leftmost first: a value is never
// searched for tags again.
func SubstituteOnce(s string, tags, vals []string) string {
	if len(tags) == 0 {
		return s
	}
	pairs := make([]string, 0, 2*len(tags))
	for i, tag := range tags {
		pairs = append(pairs, tag, vals[i])
	}
	return strings.NewReplacer(pairs...).Replace(s)
}

// SharedParts is a recipient's message in a SharedForm: its subject, and its values for the form's Tags.
// The form's Text and HTML with the values put in (SubstituteOnce) are its text and HTML.
type SharedParts struct {
	Subject string
	Values  []string
}

// RenderShared renders r's message as RenderParts renders it over t.DataOf(r, ch, campaignName), but for
// f, t's shared form: the subject and the values of f's tags, without writing the text and HTML (a
// thousand recipients' copies of a newsletter are what a request of them held). Their checks are made
// all the same, in RenderParts' order, and fail as RenderParts fails: a value missing from the text, the
// subject or the HTML, a part over MaxPartBytes. ok is false when r's message cannot be rendered so: a
// value only the template packages print, a row that is not one valid JSON object, a part of t that is
// not plain; RenderParts renders it then.
func (t *Template) RenderShared(f *SharedForm, r *Recipient, ch Channel, campaignName string) (p SharedParts, ok bool, err error) {
	fields := t.plainFields
	if fields == nil {
		return p, false, nil
	}
	// The row's values of the template's fields, by index: a few, kept on the stack.
	var buf [8]rowValue
	vals := buf[:0]
	if len(fields) <= len(buf) {
		vals = buf[:len(fields)]
	} else {
		vals = make([]rowValue, len(fields))
	}
	other := false
	if len(fields) > 0 && len(r.Vars) > 0 && !scanFields(r.Vars, fields, func(k int, raw []byte) {
		s, null, o := rowText(raw)
		vals[k] = rowValue{s: s, set: !null, other: o}
	}) {
		return p, false, nil
	}
	addr := ch.AddressColumn()
	for k, fd := range fields {
		switch {
		case fd == "user_id":
			vals[k] = rowValue{s: r.UserID, set: true}
		case fd == addr:
			vals[k] = rowValue{s: r.Address, set: true}
		case fd == "code" && r.Code != "":
			vals[k] = rowValue{s: r.Code, set: true}
		case fd == "campaign":
			vals[k] = rowValue{s: campaignName, set: true}
		case fd == "unsubscribe_url" && r.UnsubscribeURL != "":
			vals[k] = rowValue{s: r.UnsubscribeURL, set: true}
		}
		other = other || (vals[k].set && vals[k].other)
	}
	if other {
		return p, false, nil
	}
	p.Values = make([]string, len(f.slots))
	for i, s := range f.slots {
		if v := vals[f.slotField[i]]; v.set {
			p.Values[i] = v.s
			if s.html {
				p.Values[i] = htmlValue.Replace(v.s)
			}
		}
	}
	if err := f.check(t.plainText, f.textSlots, vals, p.Values); err != nil {
		return p, true, err
	}
	if t.plainSubject != nil {
		if p.Subject, err = renderValues(t.plainSubject, vals); err != nil {
			return p, true, err
		}
	}
	if t.plainHTMLPart != nil {
		if err := f.check(t.plainHTMLPart, f.htmlSlots, vals, p.Values); err != nil {
			return p, true, err
		}
	}
	return p, true, nil
}

// rowValue is a value of a recipient's row as a plain form prints it; other when only the template
// packages print it.
type rowValue struct {
	s          string
	set, other bool
}

// check fails as rendering the part p would: at its first missing value, or when it would be longer than
// MaxPartBytes. slots are the slots of p's values, in order; values the slots' values.
func (f *SharedForm) check(p *plainTemplate, slots []int, vals []rowValue, values []string) error {
	n, j := p.size, 0
	for _, s := range p.segs {
		if s.field == "" {
			continue
		}
		if !vals[s.idx].set {
			return noValue(s.field)
		}
		n += len(values[slots[j]])
		j++
	}
	if n > MaxPartBytes {
		return limitError(errPartTooLong)
	}
	return nil
}

// renderValues renders p over a row's values by index, as render does over its data.
func renderValues(p *plainTemplate, vals []rowValue) (string, error) {
	out, _, err := p.fill(func(s plainSeg) (string, bool, error) {
		if v := vals[s.idx]; v.set {
			return v.s, true, nil
		}
		return "", true, noValue(s.field)
	})
	if err != nil {
		return "", err
	}
	if len(out) > MaxPartBytes {
		return "", limitError(errPartTooLong)
	}
	return out, nil
}
