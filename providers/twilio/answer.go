package twilio

// readFields are the members of Twilio's Message resource that Send reads from what twilio-go decodes.
// The SDK decodes a 201's body into all of the resource's thirty fields with encoding/json (a tenth of a
// worker's CPU at full speed, about 10 µs a message); handed only these, it decodes them in about 1 µs.
var readFields = [...]string{"sid", "num_segments"}

// maxDepth bounds the nesting trimAnswer follows; a deeper answer goes to the SDK whole.
const maxDepth = 32

// trimAnswer appends to dst a JSON object holding only the members of the object in body that
// encoding/json would decode into readFields (the last of the same name; names matched case-insensitively,
// as encoding/json matches them), their values copied byte for byte. ok is false when body is not one
// well-formed JSON object (with nothing but white space after it), or names a member in a way this scan
// does not compare (an escape or a non-ASCII byte in a name): the caller then hands the SDK the whole body,
// and the SDK finds and reports whatever is wrong with it, as before.
func trimAnswer(dst, body []byte) (out []byte, ok bool) {
	s := scanner{b: body}
	var spans [len(readFields)][2]int
	var seen [len(readFields)]bool
	comparable := true
	s.ws()
	ok = s.object(0, func(name []byte, vs, ve int) {
		for _, c := range name {
			if c == '\\' || c >= 0x80 {
				comparable = false
			}
		}
		for f, want := range readFields {
			if equalFoldASCII(name, want) {
				spans[f], seen[f] = [2]int{vs, ve}, true
			}
		}
	})
	s.ws()
	if !ok || !comparable || s.i != len(body) {
		return dst, false
	}
	dst = append(dst, '{')
	first := true
	for f, name := range readFields {
		if !seen[f] {
			continue
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = append(dst, '"')
		dst = append(dst, name...)
		dst = append(dst, '"', ':')
		dst = append(dst, body[spans[f][0]:spans[f][1]]...)
	}
	return append(dst, '}'), true
}

func equalFoldASCII(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range b {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

// scanner checks JSON text (RFC 8259) one value at a time.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) eat(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

func (s *scanner) value(depth int) bool {
	if s.i >= len(s.b) || depth > maxDepth {
		return false
	}
	switch c := s.b[s.i]; {
	case c == '"':
		return s.str()
	case c == '{':
		return s.object(depth, nil)
	case c == '[':
		s.i++
		s.ws()
		if s.eat(']') {
			return true
		}
		for {
			s.ws()
			if !s.value(depth + 1) {
				return false
			}
			s.ws()
			if s.eat(']') {
				return true
			}
			if !s.eat(',') {
				return false
			}
		}
	case c == '-' || ('0' <= c && c <= '9'):
		return s.number()
	case c == 't':
		return s.word("true")
	case c == 'f':
		return s.word("false")
	case c == 'n':
		return s.word("null")
	}
	return false
}

// object scans an object at s.i, its members' values at depth+1, and gives member (when not nil) each
// member's name (without its quotes, as written) and where its value starts and ends.
func (s *scanner) object(depth int, member func(name []byte, vs, ve int)) bool {
	if !s.eat('{') {
		return false
	}
	s.ws()
	if s.eat('}') {
		return true
	}
	for {
		s.ws()
		ks := s.i
		if !s.str() {
			return false
		}
		name := s.b[ks+1 : s.i-1]
		s.ws()
		if !s.eat(':') {
			return false
		}
		s.ws()
		vs := s.i
		if !s.value(depth + 1) {
			return false
		}
		if member != nil {
			member(name, vs, s.i)
		}
		s.ws()
		if s.eat('}') {
			return true
		}
		if !s.eat(',') {
			return false
		}
	}
}

func (s *scanner) word(w string) bool {
	if len(s.b)-s.i >= len(w) && string(s.b[s.i:s.i+len(w)]) == w {
		s.i += len(w)
		return true
	}
	return false
}

func (s *scanner) str() bool {
	if !s.eat('"') {
		return false
	}
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return true
		case c < 0x20:
			return false
		case c == '\\':
			s.i++
			if s.i >= len(s.b) {
				return false
			}
			switch s.b[s.i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i++
			case 'u':
				if len(s.b)-s.i < 5 {
					return false
				}
				for _, h := range s.b[s.i+1 : s.i+5] {
					if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
						return false
					}
				}
				s.i += 5
			default:
				return false
			}
		default:
			s.i++
		}
	}
	return false
}

func (s *scanner) digits() int {
	n := 0
	for s.i < len(s.b) && '0' <= s.b[s.i] && s.b[s.i] <= '9' {
		s.i++
		n++
	}
	return n
}

func (s *scanner) number() bool {
	s.eat('-')
	if s.eat('0') {
		// no leading zeros
	} else if s.digits() == 0 {
		return false
	}
	if s.eat('.') && s.digits() == 0 {
		return false
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if !s.eat('+') {
			s.eat('-')
		}
		if s.digits() == 0 {
			return false
		}
	}
	return true
}
