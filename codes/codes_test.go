package codes

import (
	"bytes"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
)

func TestGeneratorUsesAlphabetUniformly(t *testing.T) {
	t.Parallel()
	g := newGenerator(rand.Reader, "YAZ-", 8)
	counts := map[byte]int{}
	const n = 20_000
	for range n {
		c, err := g.next()
		if err != nil {
			t.Fatal(err)
		}
		if len(c) != 12 || !strings.HasPrefix(c, "YAZ-") {
			t.Fatalf("code %q: want YAZ- and 8 characters", c)
		}
		for i := 4; i < len(c); i++ {
			if strings.IndexByte(Alphabet, c[i]) < 0 {
				t.Fatalf("code %q has %q, not in the alphabet", c, c[i])
			}
			counts[c[i]]++
		}
	}
	if len(counts) != len(Alphabet) {
		t.Errorf("%d distinct characters used, want %d", len(counts), len(Alphabet))
	}
	// Each character is expected n*8/31 ≈ 5161 times; a modulo bias would put the first 8 characters about
	// 3% above the rest. Allow ±6%.
	want := float64(n*8) / float64(len(Alphabet))
	for c, got := range counts {
		if float64(got) < want*0.94 || float64(got) > want*1.06 {
			t.Errorf("character %q appears %d times, want about %.0f", c, got, want)
		}
	}
}

// TestGeneratorRejectsBiasedBytes feeds the generator bytes at and above acceptBelow, which must be
// skipped, and bytes below it, which map by modulo.
func TestGeneratorRejectsBiasedBytes(t *testing.T) {
	t.Parallel()
	in := bytes.Repeat([]byte{255, 248, 0, 30, 31, 247}, randomChunk/6+1)[:randomChunk]
	g := newGenerator(bytes.NewReader(in), "", 6)
	got, err := g.next()
	if err != nil {
		t.Fatal(err)
	}
	// 0 → '2', 30 → 'Z', 31 → '2', 247 → 247%31 = 30 → 'Z', then 0 → '2', 30 → 'Z'.
	if want := "2Z2Z2Z"; got != want {
		t.Errorf("next() = %q, want %q", got, want)
	}
}

func TestGenerateOptionsValidate(t *testing.T) {
	t.Parallel()
	bad := []GenerateOptions{
		{Pool: "", Count: 1},
		{Pool: "Yaz", Count: 1},
		{Pool: "yaz 2026", Count: 1},
		{Pool: strings.Repeat("a", 65), Count: 1},
		{Pool: "yaz", Count: 0},
		{Pool: "yaz", Count: -5},
		{Pool: "yaz", Count: 1, Length: 5},
		{Pool: "yaz", Count: 1, Length: 33},
		{Pool: "yaz", Count: 1, Prefix: "yaz-"},
		{Pool: "yaz", Count: 1, Prefix: "YAZ_"},
		{Pool: "yaz", Count: 1, Prefix: strings.Repeat("A", 17)},
		{Pool: "yaz", Count: 99999999999999},           // more than the codes of the default length: it never ends
		{Pool: "yaz", Count: MaxCount + 1, Length: 12}, // more than one run makes
		{Pool: "yaz", Count: 9_000_000, Length: 6},     // over a hundredth of 31^6
	}
	for _, o := range bad {
		if err := o.validate(); !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("validate(%+v) = %v, want ErrInvalidOptions", o, err)
		}
	}
	for _, o := range []GenerateOptions{{Pool: "yaz", Count: MaxCount}, {Pool: "yaz", Count: 8_000_000, Length: 6}} {
		if err := o.validate(); err != nil {
			t.Errorf("validate(%+v) = %v, want nil", o, err)
		}
	}
	o := GenerateOptions{Pool: "yaz_2026-a", Count: 1, Prefix: "YAZ-26"}
	if err := o.validate(); err != nil || o.Length != DefaultLength {
		t.Errorf("validate(%+v) = %v; want nil and the default length", o, err)
	}
}
