package pgtext

import (
	"testing"
	"unicode/utf8"
)

func TestClean(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", ""},
		{"550 5.1.1 mailbox unavailable", "550 5.1.1 mailbox unavailable"},
		{"ğüşİ ok", "ğüşİ ok"},
		{"a\x00b", "a\uFFFDb"},
		{"\x00", "\uFFFD"},
		{"bad \xff\xfe utf8", "bad \uFFFD utf8"},
		{"both \x00 and \xc3", "both \uFFFD and \uFFFD"},
	} {
		if got := Clean(c.in); got != c.want {
			t.Errorf("Clean(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	ss := []string{"ok", "x\x00y"}
	CleanAll(ss)
	if ss[0] != "ok" || ss[1] != "x\uFFFDy" {
		t.Errorf("CleanAll: %q", ss)
	}
}

func TestCutEndsWhereACharacterStarts(t *testing.T) {
	for _, c := range []struct {
		s    string
		n    int
		want string
	}{
		{"abc", 5, "abc"},
		{"abcdef", 3, "abc"},
		{"aaağ", 4, "aaa"}, // ğ is 2 bytes: byte 4 is inside it
		{"ğğ", 1, ""},
	} {
		if got := Cut(c.s, c.n); got != c.want || !utf8.ValidString(got) {
			t.Errorf("Cut(%q, %d) = %q, want %q", c.s, c.n, got, c.want)
		}
	}
}
