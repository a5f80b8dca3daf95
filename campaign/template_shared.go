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
	index := map[sharedSlot]int{}
	write := func(b *strings.Builder, p *plainTemplate) bool {
		for _, s := range p.segs {
			if s.field == "" {
				if strings.Contains(s.text, prefix) {
					return false
				}
				b.WriteString(s.text)
				continue
			}
			slot := sharedSlot{field: s.field, html: p.html}
			i, ok := index[slot]
			if !ok {
				i = len(slots)
				index[slot] = i
				slots = append(slots, slot)
			}
			b.WriteString(sharedTag(prefix, i))
		}
		return true
	}
	var text, html strings.Builder
	if !write(&text, t.plainText) {
		return nil
	}
	if t.html != nil && !write(&html, t.plainHTMLPart) {
		return nil
	}
	f := &SharedForm{Text: text.String(), HTML: html.String(), Tags: make([]string, len(slots)), slots: slots}
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
