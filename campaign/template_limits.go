package campaign

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"text/template"
	"text/template/parse"
	"time"
)

// What a message template may do and produce. A template is written by whoever launches the campaign and
// runs once per recipient in every worker: without bounds, `{{range 1000000000}}x{{end}}` ran for minutes
// and gigabytes and could not be stopped.
const (
	// MaxRangeItems is the most items one {{range}} may go over (a number, a list, a map).
	MaxRangeItems = 1000
	// MaxRangeDepth is how deeply {{range}} blocks may nest.
	MaxRangeDepth = 2
	// MaxPartBytes is the most one rendered part (text, subject, HTML) may hold.
	MaxPartBytes = 1 << 20
	// RenderDeadline is how long rendering one part may take.
	RenderDeadline = time.Second
	// MaxValueBytes is the most one audience value may hold.
	MaxValueBytes = 64 << 10
)

// Errors of a render that went past a bound.
var (
	errPartTooLong = fmt.Errorf("a rendered part is longer than %d KiB", MaxPartBytes>>10)
	errRenderSlow  = fmt.Errorf("rendering took longer than %v", RenderDeadline)
	errRangeTooBig = fmt.Errorf("a {{range}} goes over more than %d items", MaxRangeItems)
	errWideFormat  = fmt.Errorf("a printf width or precision is over %d", MaxFormatWidth)
)

// rangeLimitFunc is the function every {{range}} pipeline passes through (see guardTree), with the root
// data ($) as its first argument: the render's budget travels in it.
const rangeLimitFunc = "campaignctlRangeLimit"

// MaxRenderItems is the most items all the {{range}} blocks of one rendered part may go over together.
const MaxRenderItems = 10 * MaxRangeItems

// MaxFormatWidth is the widest width or precision printf may be asked for ("%0999999d" is a megabyte).
const MaxFormatWidth = 1000

var limitFuncs = map[string]any{rangeLimitFunc: rangeLimit, "printf": boundedPrintf}

// budgetKey holds a render's budget in its data; no template can name it.
const budgetKey = "\x00budget"

// renderBudget is what one render may still spend.
type renderBudget struct {
	deadline time.Time
	items    int
}

// rootVar is a {{$}} node, for the range pipelines guardTree extends.
var rootVar = func() parse.Node {
	t := template.Must(template.New("root").Funcs(limitFuncs).Parse(`{{` + rangeLimitFunc + ` $ 0}}`))
	return t.Tree.Root.Nodes[0].(*parse.ActionNode).Pipe.Cmds[0].Args[1]
}()

// rangeLimit lets through what a {{range}} may go over: at most MaxRangeItems of it, within the render's
// budget of items and time.
func rangeLimit(root any, v any) (any, error) {
	var b *renderBudget
	if m, ok := root.(map[string]any); ok {
		b, _ = m[budgetKey].(*renderBudget)
	}
	if b != nil && time.Now().After(b.deadline) {
		return nil, errRenderSlow
	}
	rv := reflect.ValueOf(v)
	var n int64
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n = rv.Int()
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		n = int64(min(rv.Uint(), uint64(MaxRangeItems+1)))
	case reflect.Slice, reflect.Array, reflect.Map, reflect.String:
		n = int64(rv.Len())
	case reflect.Chan, reflect.Func:
		return nil, fmt.Errorf("%w: a {{range}} over a %s", errRangeTooBig, rv.Kind())
	}
	if n > MaxRangeItems {
		return nil, fmt.Errorf("%w (%d)", errRangeTooBig, n)
	}
	if b != nil {
		if b.items += int(max(n, 0)); b.items > MaxRenderItems {
			return nil, fmt.Errorf("%w (%d in all, more than %d)", errRangeTooBig, b.items, MaxRenderItems)
		}
	}
	return v, nil
}

// boundedPrintf is printf that refuses a width or precision past MaxFormatWidth.
func boundedPrintf(format string, args ...any) (string, error) {
	star := 0
	for i := 0; i < len(format); i++ {
		if format[i] != '%' {
			continue
		}
		for i++; i < len(format); i++ {
			c := format[i]
			switch {
			case c == '*':
				star++
			case c >= '0' && c <= '9':
				n := 0
				for ; i < len(format) && format[i] >= '0' && format[i] <= '9'; i++ {
					if n = n*10 + int(format[i]-'0'); n > MaxFormatWidth {
						return "", errWideFormat
					}
				}
				i--
			case strings.IndexByte("+-# .[]", c) >= 0:
			default:
				goto next
			}
		}
	next:
	}
	if star > 0 {
		for _, a := range args {
			if n, ok := a.(int); ok && (n > MaxFormatWidth || n < -MaxFormatWidth) {
				return "", errWideFormat
			}
		}
	}
	return fmt.Sprintf(format, args...), nil
}

// guardTree refuses in a part's parse tree what no campaign message needs and what would let it run
// without bound, and routes every {{range}} through rangeLimit:
//   - {{define}}, {{template}} and {{block}} (templates that call themselves recurse without end);
//   - {{range}} nested more than MaxRangeDepth deep;
//   - {{.}} and {{$}} outside range and with, which print the whole audience row (every column, the
//     code included) instead of one named value.
func guardTree(part string, tree *parse.Tree, templates int) error {
	if templates > 1 {
		return fmt.Errorf("%w: the %s template defines templates of its own ({{define}} or {{block}}); a campaign message is one template: write it out", ErrInvalid, part)
	}
	g := &treeGuard{part: part, tree: tree}
	g.walk(tree.Root, 0, false)
	return g.err
}

type treeGuard struct {
	part string
	tree *parse.Tree
	err  error
}

func (g *treeGuard) fail(format string, args ...any) {
	if g.err == nil {
		g.err = fmt.Errorf("%w: the %s template %s", ErrInvalid, g.part, fmt.Sprintf(format, args...))
	}
}

// walk checks n; depth is the number of enclosing ranges, inDot whether dot is something else than the
// row there (inside range or with).
func (g *treeGuard) walk(n parse.Node, depth int, inDot bool) {
	switch n := n.(type) {
	case *parse.ListNode:
		if n == nil {
			return
		}
		for _, c := range n.Nodes {
			g.walk(c, depth, inDot)
		}
	case *parse.ActionNode:
		g.walk(n.Pipe, depth, inDot)
	case *parse.PipeNode:
		if n == nil {
			return
		}
		for _, c := range n.Cmds {
			g.walk(c, depth, inDot)
		}
	case *parse.CommandNode:
		for _, a := range n.Args {
			g.walk(a, depth, inDot)
		}
	case *parse.DotNode:
		if !inDot {
			g.fail("prints {{.}}, the whole audience row with every column; name the value instead, e.g. {{.first_name}}")
		}
	case *parse.VariableNode:
		if len(n.Ident) == 1 && n.Ident[0] == "$" {
			g.fail("prints {{$}}, the whole audience row with every column; name the value instead, e.g. {{$.first_name}}")
		}
	case *parse.ChainNode:
		g.walk(n.Node, depth, inDot)
	case *parse.IfNode:
		g.walk(n.Pipe, depth, inDot)
		g.walk(n.List, depth, inDot)
		g.walk(n.ElseList, depth, inDot)
	case *parse.RangeNode:
		if depth+1 > MaxRangeDepth {
			g.fail("nests {{range}} more than %d deep", MaxRangeDepth)
			return
		}
		g.walk(n.Pipe, depth, inDot)
		n.Pipe.Cmds = append(n.Pipe.Cmds, &parse.CommandNode{NodeType: parse.NodeCommand, Pos: n.Pipe.Pos,
			Args: []parse.Node{parse.NewIdentifier(rangeLimitFunc).SetTree(g.tree).SetPos(n.Pipe.Pos), rootVar}})
		g.walk(n.List, depth+1, true)
		g.walk(n.ElseList, depth, inDot)
	case *parse.WithNode:
		g.walk(n.Pipe, depth, inDot)
		g.walk(n.List, depth, true)
		g.walk(n.ElseList, depth, inDot)
	case *parse.TemplateNode:
		g.fail("calls another template ({{template %q}}); a campaign message is one template: write it out", n.Name)
	}
}

// boundedBuffer is what a part renders into: it refuses to grow past MaxPartBytes or to be written after
// the deadline, which stops a template that would run on.
type boundedBuffer struct {
	bytes.Buffer
	deadline time.Time
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	if b.Len()+len(p) > MaxPartBytes {
		return 0, errPartTooLong
	}
	if time.Now().After(b.deadline) {
		return 0, errRenderSlow
	}
	return b.Buffer.Write(p)
}

// limitError says which bound a render went past, in words a marketer can act on (nil when none).
func limitError(err error) error {
	switch {
	case errors.Is(err, errPartTooLong), errors.Is(err, errRenderSlow):
		return fmt.Errorf("%w: %v; shorten the message or the values it loops over", ErrInvalid, err)
	case strings.Contains(err.Error(), errPartTooLong.Error()):
		return fmt.Errorf("%w: %v; shorten the message or the values it prints", ErrInvalid, err)
	case strings.Contains(err.Error(), errWideFormat.Error()):
		return fmt.Errorf("%w: %v; use widths and precisions up to %d", ErrInvalid, errWideFormat, MaxFormatWidth)
	case strings.Contains(err.Error(), errRenderSlow.Error()):
		return fmt.Errorf("%w: %v; simplify the message", ErrInvalid, errRenderSlow)
	case strings.Contains(err.Error(), errRangeTooBig.Error()):
		msg := err.Error()
		if i := strings.Index(msg, errRangeTooBig.Error()); i >= 0 {
			msg = msg[i:]
		}
		return fmt.Errorf("%w: %s; a message may loop over at most %d items", ErrInvalid, msg, MaxRangeItems)
	}
	return nil
}
