package campaign

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	htmltemplate "html/template"
	"io"
	"regexp"
	"slices"
	"sort"
	"strings"
	"text/template"
	"text/template/parse"
	"time"
)

// Template is a parsed message template: Go text/template over the audience columns plus "code" and
// "campaign". A key the data lacks is an error, never an empty string in a customer's message. An e-mail
// template also has a subject (text/template) and an HTML part (html/template, which escapes the values);
// Fields and Check cover every part.
type Template struct {
	src     string
	t       *template.Template
	subject *template.Template
	html    *htmltemplate.Template
	// The plain forms of the parts, when they are plain and render exactly as the templates do (nil when
	// not): see template_plain.go.
	plainText, plainSubject, plainHTMLPart *plainTemplate
	// plainFields are the fields the parts read when every part is plain, nil when not (DataOf).
	plainFields []string
	// nullable are the fields the parts only test (Fields less PrintedFields): a NULL column of the row
	// (left out of its data) is given to the template as nil, and takes the template's fallback.
	nullable []string
}

// Content is the source of every part of a campaign's message.
type Content struct {
	// Text is the message (SMS, push body, plain-text e-mail).
	Text string
	// Subject is the e-mail subject or push title ("" for none).
	Subject string
	// HTML is the HTML e-mail body ("" for none).
	HTML string
	// TemplateID names a template kept at the provider (a SendGrid dynamic template); Text may then be empty.
	TemplateID string
}

// ParseContent parses every part of c.
func ParseContent(c Content) (*Template, error) {
	var t *Template
	var err error
	if c.TemplateID != "" && strings.TrimSpace(c.Text) == "" {
		t = &Template{}
	} else if t, err = ParseTemplate(c.Text); err != nil {
		return nil, err
	}
	if c.Subject != "" {
		if t.subject, err = template.New("subject").Funcs(limitFuncs).Option("missingkey=error").Parse(c.Subject); err != nil {
			return nil, fmt.Errorf("%w: the subject template does not parse: %s", ErrInvalid, explainParse(err))
		}
		if err := guardTree("subject", t.subject.Tree, len(t.subject.Templates())); err != nil {
			return nil, err
		}
		t.plainSubject = agreed(compilePlain(t.subject.Tree.Root, false), t.subject.Execute)
	}
	if c.HTML != "" {
		if t.html, err = htmltemplate.New("html").Funcs(htmltemplate.FuncMap(limitFuncs)).Option("missingkey=error").Parse(c.HTML); err != nil {
			return nil, fmt.Errorf("%w: the HTML template does not parse: %s", ErrInvalid, explainParse(err))
		}
		if err := guardTree("HTML", t.html.Tree, len(t.html.Templates())); err != nil {
			return nil, err
		}
		// html/template escapes a template at its first execution, and one it cannot escape (it ends inside
		// a tag, an attribute, a comment or a script, or an action sits where no escaping fits) fails then,
		// with its tree gone: an execution over no data makes that happen here, where it can be said.
		var he *htmltemplate.Error
		if err := t.html.Execute(io.Discard, nil); errors.As(err, &he) {
			return nil, fmt.Errorf("%w: the HTML template (--html) cannot be escaped: %s; close every tag, attribute, comment and script it opens, and put actions only in text or attribute values", ErrInvalid, explainHTMLEscape(he))
		}
		t.plainHTMLPart = agreed(plainHTML(t.html), t.html.Execute)
	}
	t.plainFields = t.readsOnly()
	t.nullable = t.testedOnly()
	return t, nil
}

// explainHTMLEscape is an html/template escaping error without the template's internal name.
func explainHTMLEscape(e *htmltemplate.Error) string {
	msg := e.Description
	if e.Line > 0 {
		msg = fmt.Sprintf("line %d: %s", e.Line, msg)
	}
	return msg
}

// Hash identifies the content (every part) in the audit: the SHA-256 of the parts, hex.
func (c Content) Hash() string {
	h := sha256.New()
	for _, part := range []string{c.Text, c.Subject, c.HTML, c.TemplateID} {
		fmt.Fprintf(h, "%d:%s", len(part), part)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Parts is a message rendered for one recipient.
type Parts struct {
	Subject, Text, HTML string
}

// RenderParts renders every part over data.
func (t *Template) RenderParts(data map[string]any) (Parts, error) {
	t.fillNulls(data)
	var p Parts
	var err error
	if p.Text, err = t.Render(data); err != nil {
		return p, err
	}
	if t.subject != nil {
		if p.Subject, err = renderPart(t.plainSubject, t.subject.Execute, data); err != nil {
			return p, err
		}
	}
	if t.html != nil {
		if p.HTML, err = renderPart(t.plainHTMLPart, t.html.Execute, data); err != nil {
			return p, err
		}
	}
	return p, nil
}

// ParseTemplate parses src.
func ParseTemplate(src string) (*Template, error) {
	if strings.TrimSpace(src) == "" {
		return nil, fmt.Errorf("%w: the message template is empty; pass --message 'Merhaba {{.first_name}}, kodunuz {{.code}}'", ErrInvalid)
	}
	t, err := template.New("message").Funcs(limitFuncs).Option("missingkey=error").Parse(src)
	if err != nil {
		return nil, fmt.Errorf("%w: the message template does not parse: %s", ErrInvalid, explainParse(err))
	}
	if err := guardTree("message", t.Tree, len(t.Templates())); err != nil {
		return nil, err
	}
	tmpl := &Template{src: src, t: t, plainText: agreed(compilePlain(t.Tree.Root, false), t.Execute)}
	tmpl.plainFields = tmpl.readsOnly()
	tmpl.nullable = tmpl.testedOnly()
	return tmpl, nil
}

// HasSubject says whether the template has a subject (an e-mail's, a push's title).
func (t *Template) HasSubject() bool { return t.subject != nil }

// Source returns the template text.
func (t *Template) Source() string { return t.src }

var missingKey = regexp.MustCompile(`map has no entry for key "([^"]*)"`)

// Render executes the (text) message template over data.
func (t *Template) Render(data map[string]any) (string, error) {
	if t.t == nil {
		return "", nil
	}
	t.fillNulls(data)
	return renderPart(t.plainText, t.t.Execute, data)
}

// renderPart renders one part: through its plain form when it has one and can, else through the
// template package.
func renderPart(p *plainTemplate, run func(w io.Writer, data any) error, data map[string]any) (string, error) {
	if p != nil {
		if out, ok, err := p.render(data); ok {
			if err == nil && len(out) > MaxPartBytes {
				return "", limitError(errPartTooLong)
			}
			return out, err
		}
	}
	return execute(run, data)
}

// agreed returns p when it renders as run does (plainAgrees), else nil.
func agreed(p *plainTemplate, run func(w io.Writer, data any) error) *plainTemplate {
	if p == nil || !plainAgrees(p, run) {
		return nil
	}
	return p
}

func execute(run func(w io.Writer, data any) error, data map[string]any) (string, error) {
	if data == nil {
		data = map[string]any{}
	}
	budget := &renderBudget{deadline: time.Now().Add(RenderDeadline)}
	b := boundedBuffer{deadline: budget.deadline}
	data[budgetKey] = budget
	err := run(&b, data)
	delete(data, budgetKey)
	if err != nil {
		if lerr := limitError(err); lerr != nil {
			return "", lerr
		}
		if m := missingKey.FindStringSubmatch(err.Error()); m != nil {
			return "", fmt.Errorf("%w: template uses {{.%s}} but there is no such value", ErrInvalid, m[1])
		}
		return "", fmt.Errorf("render message: %s", explainExec(err))
	}
	return b.String(), nil
}

var (
	execFailure  = regexp.MustCompile(`^template: [^:]*:(\d+):(\d+): executing "[^"]*" at <([^>]*)>: (.*)$`)
	parseFailure = regexp.MustCompile(`^template: [^:]*:(\d+): (.*)$`)
)

// explainExec says where a template failed for a row and what would fix it, in place of the template
// package's own words (which name its internal templates).
func explainExec(err error) string {
	m := execFailure.FindStringSubmatch(err.Error())
	if m == nil {
		return err.Error()
	}
	reason, hint := m[4], "fix the template there"
	switch {
	case strings.Contains(reason, "can't evaluate field"):
		hint = "a column's value is text or a number, with no fields of its own: write {{.column}}"
	case strings.Contains(reason, "range can't iterate over"):
		hint = "{{range}} needs a list (an array column), not a single value"
	case strings.Contains(reason, "incompatible types for comparison"):
		hint = `compare a value with one of its type: a number column with a number, a text one with "quoted text"`
	}
	return fmt.Sprintf("line %s, column %s, at {{%s}}: %s; %s", m[1], m[2], m[3], reason, hint)
}

// explainParse says where a template does not parse and how a value is written, in place of the template
// package's own words.
func explainParse(err error) string {
	m := parseFailure.FindStringSubmatch(err.Error())
	if m == nil {
		return err.Error()
	}
	reason := m[2]
	if strings.Contains(reason, "unclosed action") {
		reason += " (a {{ without its }})"
	}
	return fmt.Sprintf("line %s: %s; a value is written {{.column}}, e.g. {{.first_name}}", m[1], reason)
}

// Fields returns the top-level fields the template names (outside range/with blocks), each once.
func (t *Template) Fields() []string { return t.collect(walkFields) }

// collect returns the fields walk finds in the parts' trees, each once, in the order found.
func (t *Template) collect(walk func(parse.Node, func(string))) []string {
	var out []string
	seen := map[string]bool{}
	add := func(name string) {
		if !seen[name] {
			seen[name] = true
			out = append(out, name)
		}
	}
	for _, tree := range t.trees() {
		walk(tree.Root, add)
	}
	return out
}

// trees returns the parse trees of the parts the template has: the text, the subject, the HTML part.
func (t *Template) trees() []*parse.Tree {
	var out []*parse.Tree
	for _, tree := range []*parse.Tree{treeOf(t.t), treeOf(t.subject), htmlTreeOf(t.html)} {
		if tree != nil {
			out = append(out, tree)
		}
	}
	return out
}

// FixedTexts returns the message's literal texts that every rendered message carries as they are: the
// text at the template's top level, outside any action, condition, range or comment. A text inside
// {{if}} reaches only some recipients, and a comment none. An action next to a text stands as an "x" at
// that edge: what it prints there may be a letter, glued to the text ({{.code}}RET is no word RET).
func (t *Template) FixedTexts() []string {
	if t.t == nil || t.t.Tree == nil {
		return nil
	}
	nodes := t.t.Tree.Root.Nodes
	var out []string
	for i, n := range nodes {
		tn, ok := n.(*parse.TextNode)
		if !ok {
			continue
		}
		text := string(tn.Text)
		if i > 0 && !isText(nodes[i-1]) {
			text = "x" + text
		}
		if i+1 < len(nodes) && !isText(nodes[i+1]) {
			text += "x"
		}
		out = append(out, text)
	}
	return out
}

func isText(n parse.Node) bool {
	_, ok := n.(*parse.TextNode)
	return ok
}

// partWith names the first part of the message that uses field: "message template" (--message),
// "subject" (--subject) or "HTML part" (--html).
func (t *Template) partWith(field string) string {
	for _, p := range []struct {
		name string
		tree *parse.Tree
	}{{"message template", treeOf(t.t)}, {"subject", treeOf(t.subject)}, {"HTML part (--html)", htmlTreeOf(t.html)}} {
		if p.tree == nil {
			continue
		}
		found := false
		walkFields(p.tree.Root, func(name string) { found = found || name == field })
		if found {
			if p.name == "subject" {
				return "subject (--subject)"
			}
			return p.name
		}
	}
	return "message template"
}

func treeOf(t *template.Template) *parse.Tree {
	if t == nil {
		return nil
	}
	return t.Tree
}

func htmlTreeOf(t *htmltemplate.Template) *parse.Tree {
	if t == nil {
		return nil
	}
	return t.Tree
}

// HeaderFields returns the top-level fields the subject names: their values go into a header.
func (t *Template) HeaderFields() []string {
	var out []string
	if t.subject != nil {
		seen := map[string]bool{}
		walkFields(t.subject.Tree.Root, func(name string) {
			if !seen[name] {
				seen[name] = true
				out = append(out, name)
			}
		})
	}
	return out
}

// Check verifies that every field the template names (outside range/with blocks, where dot changes) is
// one of keys, and that the template executes over those keys. The error names the missing field and the
// keys that exist, so the fix is plain.
func (t *Template) Check(keys []string) error {
	have := map[string]bool{}
	for _, k := range keys {
		have[k] = true
	}
	var missing []string
	for _, f := range t.Fields() {
		if !have[f] {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		sorted := append([]string(nil), keys...)
		sort.Strings(sorted)
		if missing[0] == "code" {
			return fmt.Errorf("%w: the message template uses {{.code}} but no --code-pool is given; pass --code-pool POOL (campaignctl codes generate makes one)", ErrInvalid)
		}
		return fmt.Errorf("%w: the %s uses {{.%s}} but the audience query returns no column %q; available: %s (add the column to the audience SELECT or fix the template)",
			ErrInvalid, t.partWith(missing[0]), missing[0], missing[0], strings.Join(sorted, ", "))
	}
	data := map[string]any{}
	for _, k := range keys {
		data[k] = "x"
	}
	if _, err := t.RenderParts(data); err != nil && !errors.Is(err, ErrInvalid) {
		return fmt.Errorf("%w: the message template fails on sample data: %v", ErrInvalid, err)
	}
	return nil
}

// AlwaysPrints says whether every message shows field: one of the parts prints it outside any condition,
// or in both branches of an {{if}} (an {{else if}} chain counts as long as each branch prints it). Inside
// a {{range}} or a {{with}} it is not taken for shown (they may run for none).
func (t *Template) AlwaysPrints(field string) bool {
	return slices.ContainsFunc(t.trees(), func(tree *parse.Tree) bool { return listPrints(tree.Root, field) })
}

// listPrints says whether the nodes of l, run in order, always print field.
func listPrints(l *parse.ListNode, field string) bool {
	if l == nil {
		return false
	}
	for _, n := range l.Nodes {
		switch n := n.(type) {
		case *parse.ActionNode:
			if len(n.Pipe.Decl) > 0 {
				continue // {{$x := .code}} prints nothing
			}
			found := false
			walkFields(n.Pipe, func(name string) { found = found || name == field })
			if found {
				return true
			}
		case *parse.IfNode:
			if listPrints(n.List, field) && listPrints(n.ElseList, field) {
				return true
			}
		}
	}
	return false
}

// testedOnly returns the fields the parts read only as tests (Fields less PrintedFields).
func (t *Template) testedOnly() []string {
	printed := t.PrintedFields()
	var out []string
	for _, f := range t.Fields() {
		if !slices.Contains(printed, f) {
			out = append(out, f)
		}
	}
	return out
}

// fillNulls gives the fields the parts only test that data lacks (a NULL column) as nil: {{or .f "x"}}
// then takes its fallback where missingkey=error would fail. A field the parts print stays missing, and
// fails rather than print "<no value>".
func (t *Template) fillNulls(data map[string]any) {
	for _, f := range t.nullable {
		if _, ok := data[f]; !ok && data != nil {
			data[f] = nil
		}
	}
}

// PrintedFields returns the top-level fields the template's parts read other than only as a test that a
// missing (NULL) value passes: the condition of {{if .f}} or {{with .f}}, the arguments of not, and those
// of an or whose last argument is a constant ({{or .first_name "Müşterimiz"}}). A row whose value of such a field is NULL prints "<no value>" or
// fails, and is excluded (missing_value); one whose guarded field is NULL takes the fallback.
func (t *Template) PrintedFields() []string { return t.collect(walkPrinted) }

// walkPrinted is walkFields without the fields a NULL passes (PrintedFields).
func walkPrinted(n parse.Node, f func(string)) {
	switch n := n.(type) {
	case *parse.ListNode:
		if n == nil {
			return
		}
		for _, c := range n.Nodes {
			walkPrinted(c, f)
		}
	case *parse.ActionNode:
		if !nullSafe(n.Pipe) {
			walkFields(n.Pipe, f)
		}
	case *parse.IfNode:
		if !nullSafe(n.Pipe) && !fieldTest(n.Pipe) {
			walkFields(n.Pipe, f)
		}
		walkPrinted(n.List, f)
		walkPrinted(n.ElseList, f)
	case *parse.WithNode:
		if !nullSafe(n.Pipe) && !fieldTest(n.Pipe) {
			walkFields(n.Pipe, f)
		}
		walkPrinted(n.ElseList, f)
	default:
		walkFields(n, f)
	}
}

// fieldTest says whether p is a lone field ({{if .f}}, {{with .f}}): nil is false there.
func fieldTest(p *parse.PipeNode) bool {
	cmds := unescaped(p)
	if cmds == nil || len(cmds) != 1 || len(cmds[0].Args) != 1 {
		return false
	}
	_, ok := cmds[0].Args[0].(*parse.FieldNode)
	return ok
}

// nullSafe says whether p prints no nil whatever its fields: {{not .f}} (a boolean), or {{or .f … "x"}}
// whose arguments are fields and constants and whose last is a constant (or prints its first true
// argument, else its last). {{and .f "x"}} is not: it prints its first false argument, a nil field.
func nullSafe(p *parse.PipeNode) bool {
	cmds := unescaped(p)
	if cmds == nil || len(cmds) != 1 || len(cmds[0].Args) < 2 {
		return false
	}
	args := cmds[0].Args
	id, ok := args[0].(*parse.IdentifierNode)
	if !ok || (id.Ident != "or" && id.Ident != "not") {
		return false
	}
	for _, a := range args[1:] {
		switch a.(type) {
		case *parse.FieldNode, *parse.StringNode, *parse.NumberNode, *parse.BoolNode:
		default:
			return false
		}
	}
	if id.Ident == "or" {
		_, field := args[len(args)-1].(*parse.FieldNode)
		return !field
	}
	return true
}

// unescaped returns p's commands without the escapers html/template appends to an action once it has run
// ({{or .f "x" | _html_template_htmlescaper}}); nil for no pipe or one that declares a variable.
func unescaped(p *parse.PipeNode) []*parse.CommandNode {
	if p == nil || len(p.Decl) > 0 {
		return nil
	}
	cmds := p.Cmds
	for len(cmds) > 1 {
		last := cmds[len(cmds)-1]
		id, ok := last.Args[0].(*parse.IdentifierNode)
		if !ok || len(last.Args) != 1 || !strings.HasPrefix(id.Ident, "_html_template_") {
			break
		}
		cmds = cmds[:len(cmds)-1]
	}
	return cmds
}

// walkFields calls f with the first identifier of every .field reference evaluated against the top-level
// data. Bodies of range and with are skipped: there dot is something else.
func walkFields(n parse.Node, f func(string)) {
	switch n := n.(type) {
	case *parse.ListNode:
		if n == nil {
			return
		}
		for _, c := range n.Nodes {
			walkFields(c, f)
		}
	case *parse.ActionNode:
		walkFields(n.Pipe, f)
	case *parse.PipeNode:
		if n == nil {
			return
		}
		for _, c := range n.Cmds {
			walkFields(c, f)
		}
	case *parse.CommandNode:
		for _, a := range n.Args {
			walkFields(a, f)
		}
	case *parse.FieldNode:
		if len(n.Ident) > 0 {
			f(n.Ident[0])
		}
	case *parse.ChainNode:
		walkFields(n.Node, f)
	case *parse.IfNode:
		walkFields(n.Pipe, f)
		walkFields(n.List, f)
		walkFields(n.ElseList, f)
	case *parse.RangeNode:
		walkFields(n.Pipe, f)
		walkFields(n.ElseList, f)
	case *parse.WithNode:
		walkFields(n.Pipe, f)
		walkFields(n.ElseList, f)
	case *parse.TemplateNode:
		walkFields(n.Pipe, f)
	}
}
