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
// not (the template packages then render it, and it may read any value: see DataOf).
func (t *Template) readsOnly() []string {
	if t.t == nil || t.plainText == nil || (t.subject != nil && t.plainSubject == nil) || (t.html != nil && t.plainHTMLPart == nil) {
		return nil
	}
	fields := []string{}
	for _, p := range []*plainTemplate{t.plainText, t.plainSubject, t.plainHTMLPart} {
		if p == nil {
			continue
		}
		for _, s := range p.segs {
			if s.field != "" && !contains(fields, s.field) {
				fields = append(fields, s.field)
			}
		}
	}
	return fields
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
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
	if len(fields) > 0 && len(r.Vars) > 0 && !decodeFields(r.Vars, fields, data) {
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

// decodeFields puts into data the members of the JSON object vars named in fields, each decoded as
// TemplateData's json.Decoder (UseNumber) decodes it, a null left out and a repeated name taking its last
// value. It reports false, having put nothing, when vars is not one valid JSON object.
func decodeFields(vars []byte, fields []string, data map[string]any) bool {
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
		if f, ok := field(key, fields); ok {
			if v, null := value(vars[i:vEnd]); null {
				delete(data, f)
			} else {
				data[f] = v
			}
		}
		i = skipSpace(vars, vEnd)
		if i < len(vars) && vars[i] == ',' {
			i = skipSpace(vars, i+1)
		}
	}
	return true
}

// field returns the name of fields the quoted key (without its quotes) spells, if any.
func field(key []byte, fields []string) (string, bool) {
	if bytes.IndexByte(key, '\\') >= 0 {
		var k string
		if json.Unmarshal(append(append([]byte{'"'}, key...), '"'), &k) != nil {
			return "", false
		}
		key = []byte(k)
	}
	for _, f := range fields {
		if string(key) == f {
			return f, true
		}
	}
	return "", false
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
