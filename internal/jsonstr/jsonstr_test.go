package jsonstr

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
)

// pieces exercise every escape of encoding/json, and what it writes as it is.
var pieces = []string{
	"", "a", "Merhaba Ali, kodunuz K7Q2M9XW - RET yazıp 3338e gönderin", " ", "0", "é", "ş", "İ", "ğü", "☃", "😀",
	"\u00a0", "\ufffd", "\u2028", "\u2029", "\u2027", "\u202a", `"`, `\`, "/", "<", ">", "&", "'", "+", "=",
	"\x00", "\x01", "\b", "\f", "\n", "\r", "\t", "\x0b", "\x1f", "\x7f", "\x80", "\xff", "\xc3", "\xe2\x80",
	"\xed\xa0\x80", "\xf4\x90\x80\x80", "<p>", "&amp;", `\u003c`,
}

func check(t *testing.T, s string) {
	t.Helper()
	want, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if got := Append(nil, s); !bytes.Equal(got, want) {
		t.Fatalf("Append(%q) = %s, encoding/json %s", s, got, want)
	}
	if got := AppendChars([]byte("x"), s); !bytes.Equal(got, append([]byte("x"), want[1:len(want)-1]...)) {
		t.Fatalf("AppendChars(%q) = %s, want %s after the prefix", s, got, want[1:len(want)-1])
	}
}

// A string is written as json.Marshal writes it: every piece alone, and strings made of them at random.
func TestAppendMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	for _, p := range pieces {
		check(t, p)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 3000 {
		var b strings.Builder
		for range rng.IntN(12) {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		check(t, b.String())
	}
}

func FuzzAppend(f *testing.F) {
	for _, p := range pieces {
		f.Add(p)
		f.Add("x" + p + "y" + p)
	}
	f.Add(strings.Join(pieces, ""))
	f.Fuzz(check)
}
