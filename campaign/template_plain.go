package campaign

import (
	"encoding/json"
	"fmt"
	htmltemplate "html/template"
	"io"
	"strings"
	"text/template/parse"
)

// plainTemplate is a template part made only of text and {{.field}} actions (what nearly every campaign
// message is), rendered by writing the text and looking the values up, without text/template's
// reflection. It renders exactly what the template package would, or reports that it cannot (a value
// that is not a string or a number), and then the template package renders: see plainParts.
type plainTemplate struct {
	segs []plainSeg
	// html escapes values as html/template does in HTML text and quoted attributes.
	html bool
	size int // bytes of text, a hint for the buffer
}

// plainSeg is literal text, or the value of field when field is not empty.
type plainSeg struct {
	text, field string
	idx         int // field's index in the template's plainFields, when every part is plain
}

// htmlValue escapes a value as html/template's escaper for HTML text and quoted attribute values does.
var htmlValue = strings.NewReplacer("\x00", "\uFFFD", `"`, "&#34;", "&", "&amp;", "'", "&#39;", "+", "&#43;", "<", "&lt;", ">", "&gt;")

// writeHTMLValue writes s to b escaped as htmlValue escapes it. (htmlValue.WriteString would take b as an
// io.Writer, and so put every builder of a render on the heap.)
func writeHTMLValue(b *strings.Builder, s string) {
	start := 0
	for i := 0; i < len(s); i++ {
		var esc string
		switch s[i] {
		case 0:
			esc = "\uFFFD"
		case '"':
			esc = "&#34;"
		case '&':
			esc = "&amp;"
		case '\'':
			esc = "&#39;"
		case '+':
			esc = "&#43;"
		case '<':
			esc = "&lt;"
		case '>':
			esc = "&gt;"
		default:
			continue
		}
		b.WriteString(s[start:i])
		b.WriteString(esc)
		start = i + 1
	}
	b.WriteString(s[start:])
}

// html/template's escaper for HTML text and quoted attribute values, as the escaped tree names it.
const htmlEscaperName = "_html_template_htmlescaper"

// compilePlain returns the plain form of a template's tree, or nil when the tree has anything but text
// and single-field actions (pipelines, functions, conditions, nested fields). With html, every action must
// be the field piped into the HTML escaper and nothing else (the tree html/template escaped).
func compilePlain(root *parse.ListNode, html bool) *plainTemplate {
	if root == nil {
		return nil
	}
	p := &plainTemplate{html: html}
	for _, n := range root.Nodes {
		switch n := n.(type) {
		case *parse.TextNode:
			p.segs = append(p.segs, plainSeg{text: string(n.Text)})
			p.size += len(n.Text)
		case *parse.ActionNode:
			if n.Pipe == nil || len(n.Pipe.Decl) > 0 || n.Pipe.IsAssign {
				return nil
			}
			cmds := n.Pipe.Cmds
			if html {
				if len(cmds) != 2 || len(cmds[1].Args) != 1 {
					return nil
				}
				if id, ok := cmds[1].Args[0].(*parse.IdentifierNode); !ok || id.Ident != htmlEscaperName {
					return nil
				}
				cmds = cmds[:1]
			}
			if len(cmds) != 1 || len(cmds[0].Args) != 1 {
				return nil
			}
			f, ok := cmds[0].Args[0].(*parse.FieldNode)
			if !ok || len(f.Ident) != 1 {
				return nil
			}
			p.segs = append(p.segs, plainSeg{field: f.Ident[0]})
		default:
			return nil
		}
	}
	return p
}

// render renders p over data. ok is false when a value is of a type p does not print itself (the
// template package must render it); a missing value is the template package's error.
func (p *plainTemplate) render(data map[string]any) (out string, ok bool, err error) {
	return p.fill(func(s plainSeg) (string, bool, error) { return plainValue(data, s.field) })
}

// fill writes p's text with the value of each field segment from value (escaped when p is HTML). ok is
// false, and nothing is written, when value says a field is not p's to print.
func (p *plainTemplate) fill(value func(s plainSeg) (str string, ok bool, err error)) (out string, ok bool, err error) {
	var b strings.Builder
	b.Grow(p.size + 16*len(p.segs))
	for _, s := range p.segs {
		if s.field == "" {
			b.WriteString(s.text)
			continue
		}
		str, ok, err := value(s)
		if !ok || err != nil {
			return "", ok, err
		}
		if p.html {
			writeHTMLValue(&b, str)
		} else {
			b.WriteString(str)
		}
	}
	return b.String(), true, nil
}

// plainValue is field's value in data as the template packages print it, for the values a plain form
// prints itself: strings and numbers. ok is false for any other type; a missing value is the error the
// template packages' missingkey=error gives, in the words RenderParts uses.
func plainValue(data map[string]any, field string) (str string, ok bool, err error) {
	v, found := data[field]
	if !found {
		return "", true, noValue(field)
	}
	switch v := v.(type) {
	case string:
		return v, true, nil
	case json.Number:
		return string(v), true, nil
	}
	return "", false, nil
}

// noValue is the error of a template that names a value the data lacks, in RenderParts' words.
func noValue(field string) error {
	return fmt.Errorf("%w: template uses {{.%s}} but there is no such value", ErrInvalid, field)
}

// plainHTML returns the plain form of an HTML template, or nil. html/template escapes a template when it
// first runs: it runs once here (into nothing) so that its tree shows the escaper of every action.
func plainHTML(t *htmltemplate.Template) *plainTemplate {
	t.Execute(io.Discard, map[string]any{}) //nolint:errcheck // run only to escape the tree; a missing key is expected
	if t.Tree == nil {
		return nil
	}
	return compilePlain(t.Tree.Root, true)
}

// plainAgrees reports whether p renders what run renders, over values that hold every character the
// escapers treat specially, for each field p names: the plain form is used only when it does.
func plainAgrees(p *plainTemplate, run func(w io.Writer, data any) error) bool {
	data := map[string]any{}
	for i, s := range p.segs {
		if s.field != "" {
			data[s.field] = fmt.Sprintf("<a href='x'>\"%s\" & + \x00 ğ ü %d</a>", s.field, i)
		}
	}
	want, err := execute(run, data)
	if err != nil {
		return false
	}
	got, ok, err := p.render(data)
	return ok && err == nil && got == want
}

// TextLength describes the text part's length for a bound computed without rendering: the bytes of its
// literal text, and the field each of its actions prints (a field printed twice is listed twice). ok is
// false when the part is not plain (conditions, functions, pipelines): only rendering tells its length.
func (t *Template) TextLength() (literal int, fields []string, ok bool) {
	text, fields, ok := t.plainText.describe()
	return len(text), fields, ok
}

// SubjectParts describes the subject (an e-mail's, a push's title) as TextLength does the text: its
// literal text, joined, and the field each of its actions prints. ok is false when there is no subject or
// it is not plain.
func (t *Template) SubjectParts() (literal string, fields []string, ok bool) {
	return t.plainSubject.describe()
}

// describe is p's literal text, joined, and the field each of its actions prints; ok is false for a nil p
// (a part that is not plain, or none).
func (p *plainTemplate) describe() (literal string, fields []string, ok bool) {
	if p == nil {
		return "", nil, false
	}
	var b strings.Builder
	for _, s := range p.segs {
		if s.field == "" {
			b.WriteString(s.text)
		} else {
			fields = append(fields, s.field)
		}
	}
	return b.String(), fields, true
}
