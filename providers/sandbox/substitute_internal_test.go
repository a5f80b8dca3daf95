package sandbox

import (
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// substitute does what a strings.Replacer of the tags (longest first) does: one pass, values never
// searched again, a longer tag winning over one that starts it.
func TestSubstituteAsAReplacer(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	alphabet := []string{"-a-", "-ab-", "-", "a", "b", "ğ", " ", "-name-", "-code-"}
	for i := 0; i < 2000; i++ {
		subs := map[string]string{}
		for range 1 + rng.IntN(3) {
			subs[alphabet[rng.IntN(len(alphabet))]+alphabet[rng.IntN(len(alphabet))]] = alphabet[rng.IntN(len(alphabet))]
		}
		var b strings.Builder
		for range rng.IntN(12) {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		s := b.String()
		tags := slices.SortedFunc(maps.Keys(subs), func(a, b string) int { return len(b) - len(a) })
		pairs := []string{}
		for _, k := range tags {
			pairs = append(pairs, k, subs[k])
		}
		if got, want := substitute(s, tags, subs), strings.NewReplacer(pairs...).Replace(s); got != want {
			t.Fatalf("substitute(%q, %q) = %q, a Replacer gives %q", s, subs, got, want)
		}
	}
}
