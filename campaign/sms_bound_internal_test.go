package campaign

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// A body no longer than surelyFits(N) bytes fits N segments whatever its characters: GSM-7 ones, the
// extension table's two-septet ones, Turkish letters that force UCS-2, emoji that take two units and do
// not split. A launch leaves such rows unrendered (lengthSuspects), so the bound must never be wrong.
// (Mutation: 70 N, a single segment's size, fails on a body of Latin letters with one Turkish letter.)
func TestABodyWithinTheBoundAlwaysFits(t *testing.T) {
	t.Parallel()
	alphabet := []string{"a", "Z", "0", " ", "{", "€", "~", "Ö", "ç", "ı", "ş", "😀", "\n", "é"}
	rng := rand.New(rand.NewPCG(1, 2))
	for n := 1; n <= 24; n++ {
		limit := surelyFits(n)
		for i := 0; i < 2000; i++ {
			// Mostly one or two kinds of character, to reach each encoding's worst case.
			kinds := alphabet
			if i%2 == 0 {
				kinds = []string{alphabet[rng.IntN(len(alphabet))], alphabet[rng.IntN(len(alphabet))]}
			}
			var b strings.Builder
			for {
				c := kinds[rng.IntN(len(kinds))]
				if b.Len()+len(c) > limit {
					break
				}
				b.WriteString(c)
			}
			// A blank body is refused for its blankness, which lengthSuspects finds apart (blankConds).
			if err := CheckSMSLength(b.String(), n); err != nil && !blank(b.String()) {
				t.Fatalf("--max-segments %d: a body of %d bytes (bound %d) %v: %q", n, b.Len(), limit, err, b.String())
			}
		}
		// The worst cases, whole: a unit a byte in UCS-2 (one Turkish letter, then Latin ones), two
		// septets a byte in GSM-7 (extension characters), and emoji where each part's last unit cannot
		// take one.
		worst := []string{
			"ı" + strings.Repeat("a", limit-2),
			strings.Repeat("{", limit),
			strings.Repeat("😀", limit/4),
			strings.Repeat(strings.Repeat("a", 65)+"😀", limit/69),
		}
		for _, body := range worst {
			if err := CheckSMSLength(body, n); err != nil {
				t.Fatalf("--max-segments %d: a body of %d bytes (bound %d) %v", n, len(body), limit, err)
			}
		}
	}
}
