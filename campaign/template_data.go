package campaign

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// A plain template (every part text and {{.field}} values) reads a few values of a recipient's row, and
// decoding the whole row's JSON into a map with encoding/json for each recipient was a tenth of a worker's
// CPU on an e-mail campaign. DataOf decodes only the columns the template reads, and those with a scan
// that allocates nothing but the values.

// readsOnly returns the fields t reads when every part of t is plain, each once, and nil when a part is
// not (the template packages then render it, and it may read any value: see DataOf). Each field segment
// of the parts is given its field's index in them.
func (t *Template) readsOnly() []string {
	if t.t == nil || t.plainText == nil || (t.subject != nil && t.plainSubject == nil) || (t.html != nil && t.plainHTMLPart == nil) {
		return nil
	}
	fields := []string{}
	for _, p := range []*plainTemplate{t.plainText, t.plainSubject, t.plainHTMLPart} {
		if p == nil {
			continue
		}
		for i := range p.segs {
			s := &p.segs[i]
			if s.field == "" {
				continue
			}
			if s.idx = index(fields, s.field); s.idx < 0 {
				s.idx = len(fields)
				fields = append(fields, s.field)
			}
		}
	}
	return fields
}

// index is the index of s in ss, or -1.
func index(ss []string, s string) int {
	for i, x := range ss {
		if x == s {
			return i
		}
	}
	return -1
}

// DataOf returns the values of r.TemplateData(ch, campaignName) that t reads, for rendering r's message
// with t. When every part of t is plain, those are the fields its parts name, and only those columns of
// r.Vars are decoded; otherwise (and for a row the scan does not vouch for) it is the whole of
// r.TemplateData.
func (t *Template) DataOf(r *Recipient, ch Channel, campaignName string) map[string]any {
	fields := t.plainFields
	if fields == nil {
		return r.TemplateData(ch, campaignName)
	}
	data := make(map[string]any, len(fields))
	if len(fields) > 0 && len(r.Vars) > 0 && !scanFields(r.Vars, fields, func(k int, raw []byte) {
		if v, null := value(raw); null {
			delete(data, fields[k])
		} else {
			data[fields[k]] = v
		}
	}) {
		return r.TemplateData(ch, campaignName)
	}
	// The values the engine adds win over columns of the same name, as in TemplateData.
	addr := ch.AddressColumn()
	for _, f := range fields {
		switch {
		case f == "user_id":
			data[f] = r.UserID
		case f == addr:
			data[f] = r.Address
		case f == "code" && r.Code != "":
			data[f] = r.Code
		case f == "campaign":
			data[f] = campaignName
		case f == "unsubscribe_url" && r.UnsubscribeURL != "":
			data[f] = r.UnsubscribeURL
		}
	}
	return data
}

// scanFields calls f with the index in fields and the raw value of each member of the JSON object vars
// that fields names, in the object's order (a repeated name comes again: the last one is the decoder's).
// It reports false, having called nothing, when vars is not one valid JSON object.
func scanFields(vars []byte, fields []string, f func(k int, raw []byte)) bool {
	// Valid first: the decoder takes nothing from a row with a syntax error anywhere.
	if !json.Valid(vars) {
		return false
	}
	i := skipSpace(vars, 0)
	if i == len(vars) || vars[i] != '{' {
		return false
	}
	i = skipSpace(vars, i+1)
	for i < len(vars) && vars[i] == '"' {
		kEnd := skipValue(vars, i)
		key := vars[i+1 : kEnd-1]
		i = skipSpace(vars, kEnd)
		i = skipSpace(vars, i+1) // the colon
		vEnd := skipValue(vars, i)
		if k := field(key, fields); k >= 0 {
			f(k, vars[i:vEnd])
		}
		i = skipSpace(vars, vEnd)
		if i < len(vars) && vars[i] == ',' {
			i = skipSpace(vars, i+1)
		}
	}
	return true
}

// field returns the index of the name in fields the quoted key (without its quotes) spells, or -1.
func field(key []byte, fields []string) int {
	if bytes.IndexByte(key, '\\') >= 0 {
		var k string
		if json.Unmarshal(append(append([]byte{'"'}, key...), '"'), &k) != nil {
			return -1
		}
		key = []byte(k)
	}
	for i, f := range fields {
		if string(key) == f {
			return i
		}
	}
	return -1
}

// rowText is value(raw) as a plain form prints it, for a string or a number; null for a null, other for any
// other value.
func rowText(raw []byte) (s string, null, other bool) {
	switch c := raw[0]; {
	case c == '"':
		if s := raw[1 : len(raw)-1]; bytes.IndexByte(s, '\\') < 0 && utf8.Valid(s) {
			return string(s), false, false
		}
		json.Unmarshal(raw, &s) //nolint:errcheck // a valid string; unquoted as into an interface
		return s, false, false
	case c == '-' || ('0' <= c && c <= '9'):
		return string(raw), false, false
	case c == 'n':
		return "", true, false
	}
	return "", false, true
}

// value decodes one valid JSON value as a json.Decoder with UseNumber decodes it into an interface.
func value(raw []byte) (v any, null bool) {
	switch c := raw[0]; {
	case c == '"':
		if s := raw[1 : len(raw)-1]; bytes.IndexByte(s, '\\') < 0 && utf8.Valid(s) {
			return string(s), false
		}
	case c == '-' || ('0' <= c && c <= '9'):
		return json.Number(raw), false
	case c == 'n':
		return nil, true
	}
	// Escapes, bytes that are not UTF-8, true and false, objects and arrays: the decoder itself.
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	dec.Decode(&v) //nolint:errcheck // one value of a valid document
	return v, false
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipValue returns the end of the valid JSON value that starts at b[i].
func skipValue(b []byte, i int) int {
	depth := 0
	for ; i < len(b); i++ {
		switch b[i] {
		case '"':
			for i++; b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
			if depth == 0 {
				return i + 1
			}
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i // the end of a number or literal that closes its container
			}
			depth--
			if depth == 0 {
				return i + 1
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return i
			}
		}
	}
	return i
}

// PlainFields returns the fields t's parts read when every part is plain (text and {{.field}} actions);
// ok is false when a part is not, and may then read any value.
func (t *Template) PlainFields() (fields []string, ok bool) {
	return t.plainFields, t.plainFields != nil
}
