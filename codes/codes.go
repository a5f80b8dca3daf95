// Package codes manages pools of single-use promo codes in Postgres (tables code_pools and promo_codes).
//
// A code is unique across every pool, which the database enforces (promo_codes.code is UNIQUE); a pool is
// just a name that codes and campaigns refer to. Codes are either generated here, from crypto/rand over an
// alphabet without look-alike characters, or imported from a file. A free code is one above its pool's
// cursor (never given out) or one given back to released_codes that no recipient holds; the launch planner
// reserves free codes for (campaign, user), and the codes of recipients who were never sent are given back.
package codes

import (
	"errors"
	"fmt"
	"io"
	"math"
)

// ErrPoolNotFound is returned, wrapped, when a named code pool does not exist.
var ErrPoolNotFound = errors.New("code pool not found")

// ErrPoolExhausted is returned, wrapped, when a pool has fewer free codes than a plan needs. Callers that
// reserve codes (the launch planner) return it before anything is sent; the fix is to generate or import
// more codes into the pool.
var ErrPoolExhausted = errors.New("code pool exhausted")

// ErrInvalidOptions is returned, wrapped with the reason, when Generate or Import is called with options
// that cannot work (a bad pool name, count, length or prefix).
var ErrInvalidOptions = errors.New("invalid options")

// Alphabet is the set of characters generated codes are made of: digits and upper-case letters without the
// look-alikes 0, O, 1, I and L, so that a code read aloud or typed from an SMS comes out right.
const Alphabet = "23456789ABCDEFGHJKMNPQRSTUVWXYZ"

// DefaultLength is the length of the random part of a generated code when GenerateOptions.Length is 0:
// 31^8 ≈ 8.5·10^11 codes, about 40 bits, so that guessing a valid code in a pool of a million takes on the
// order of a million tries.
const DefaultLength = 8

// Limits of GenerateOptions and of imported codes.
const (
	// MaxCount is the most codes one Generate makes: 50,000,000 codes are about 4 GB in Postgres with their
	// index, far more than any campaign reserves; more is a typo (or a run to split in several).
	MaxCount        = 50_000_000
	MinLength       = 6  // MinLength is the shortest random part Generate accepts.
	MaxLength       = 32 // MaxLength is the longest random part Generate accepts.
	MaxPrefixLen    = 16 // MaxPrefixLen is the longest prefix Generate accepts.
	MinImportLength = 4  // MinImportLength is the shortest code Import accepts.
	MaxImportLength = 64 // MaxImportLength is the longest code Import accepts.
	MaxPoolNameLen  = 64 // MaxPoolNameLen is the longest pool name Generate and Import accept.
)

// GenerateOptions says what Generate makes.
type GenerateOptions struct {
	Pool   string // pool name, [a-z0-9_-]{1,64}; created if it does not exist
	Count  int    // how many new codes to add, at least 1
	Prefix string // optional fixed prefix, [A-Z0-9-]{0,16}, e.g. "YAZ24-"
	Length int    // length of the random part, MinLength to MaxLength; 0 means DefaultLength

	// Progress, if not nil, is called with the number of codes generated so far, about every 10,000 codes,
	// and once with Count at the end. It may be called from another goroutine, never concurrently.
	Progress func(done int)
}

// GenerateReport says what Generate did.
type GenerateReport struct {
	Pool        string
	PoolCreated bool // the pool did not exist before
	Generated   int  // new codes added: always the requested Count on success
	Collisions  int  // generated codes dropped because they already existed (or repeated); replaced by others
	Rounds      int  // COPY-and-insert rounds it took (1 unless there were collisions)
}

// ImportReport says what Import did.
type ImportReport struct {
	Lines      int64 // codes in the file (blank lines excluded)
	Inserted   int64 // new codes added to the pool
	Duplicates int64 // codes skipped: already stored (in any pool) or repeated in the file
	// InOtherPools counts, by pool, the skipped codes that another pool holds (a code belongs to one pool).
	InOtherPools map[string]int64
	// SkippedHeader is the file's first line when it named the column ("code") and was not imported.
	SkippedHeader string
}

// PoolStats counts the codes of one pool.
type PoolStats struct {
	Pool     string
	Total    int64 // Free + Reserved
	Free     int64 // not reserved by any campaign
	Reserved int64 // reserved for a (campaign, user)
}

// LineError reports a bad line of a code file. Line is 1-based.
type LineError struct {
	Line int
	Msg  string
}

// Error returns "line N: " followed by Msg.
func (e *LineError) Error() string { return fmt.Sprintf("line %d: %s", e.Line, e.Msg) }

// ValidPoolName reports whether name is usable as a new pool name: 1 to 64 of a–z, 0–9, '_' and '-'.
func ValidPoolName(name string) bool {
	if name == "" || len(name) > MaxPoolNameLen {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func checkPoolName(name string) error {
	if !ValidPoolName(name) {
		return fmt.Errorf("%w: pool name %q must be 1 to %d characters of a-z, 0-9, '_' and '-'", ErrInvalidOptions, name, MaxPoolNameLen)
	}
	return nil
}

// codeSpace is how many random parts of length characters there are.
func codeSpace(length int) float64 { return math.Pow(float64(len(Alphabet)), float64(length)) }

// validate checks opts and fills in defaults.
// Check reports what is wrong with o (an error wrapping ErrInvalidOptions), without touching a database:
// Generate checks the same first. A Length of 0 stands for DefaultLength.
func (o GenerateOptions) Check() error { return o.validate() }

func (o *GenerateOptions) validate() error {
	if err := checkPoolName(o.Pool); err != nil {
		return err
	}
	if o.Count < 1 {
		return fmt.Errorf("%w: count must be at least 1, got %d", ErrInvalidOptions, o.Count)
	}
	if o.Length == 0 {
		o.Length = DefaultLength
	}
	if o.Length < MinLength || o.Length > MaxLength {
		return fmt.Errorf("%w: length must be between %d and %d, got %d", ErrInvalidOptions, MinLength, MaxLength, o.Length)
	}
	if o.Count > MaxCount {
		return fmt.Errorf("%w: count %d is more than the %d codes one run makes; run it again for more", ErrInvalidOptions, o.Count, MaxCount)
	}
	// Codes are drawn at random: a pool that fills a large share of the codes of its length spends more and
	// more draws on codes it has, and one larger than them never ends.
	if space := codeSpace(o.Length); float64(o.Count) > space/100 {
		return fmt.Errorf("%w: count %d is more than a hundredth of the %.3g codes of length %d; give a longer --length", ErrInvalidOptions, o.Count, space, o.Length)
	}
	if len(o.Prefix) > MaxPrefixLen {
		return fmt.Errorf("%w: prefix %q is longer than %d characters", ErrInvalidOptions, o.Prefix, MaxPrefixLen)
	}
	for i := 0; i < len(o.Prefix); i++ {
		if c := o.Prefix[i]; !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Errorf("%w: prefix %q may only contain A-Z, 0-9 and '-'", ErrInvalidOptions, o.Prefix)
		}
	}
	return nil
}

// randomChunk is how many random bytes the generator reads from crypto/rand at a time.
const randomChunk = 64 << 10

// acceptBelow is the largest multiple of len(Alphabet) that fits in a byte: random bytes at or above it
// are thrown away, so that b % len(Alphabet) is uniform (rejection sampling instead of a modulo bias).
const acceptBelow = 256 / len(Alphabet) * len(Alphabet)

// generator makes codes of prefix plus length random characters of Alphabet, whose first random character
// is one of Alphabet[lo:hi] (all of it, unless Generate splits the work between connections).
type generator struct {
	rand   io.Reader
	prefix string
	length int
	lo, hi int
	buf    []byte
	pos    int
	code   []byte
}

func newGenerator(random io.Reader, prefix string, length int) *generator {
	return &generator{rand: random, prefix: prefix, length: length, hi: len(Alphabet),
		code: make([]byte, 0, len(prefix)+length)}
}

// next returns a new random code.
func (g *generator) next() (string, error) {
	g.code = append(g.code[:0], g.prefix...)
	for len(g.code) < len(g.prefix)+g.length {
		if g.pos == len(g.buf) {
			if g.buf == nil {
				g.buf = make([]byte, randomChunk)
			}
			if _, err := io.ReadFull(g.rand, g.buf); err != nil {
				return "", fmt.Errorf("read random bytes: %w", err)
			}
			g.pos = 0
		}
		b := int(g.buf[g.pos])
		g.pos++
		if b >= acceptBelow {
			continue
		}
		c := b % len(Alphabet)
		if len(g.code) == len(g.prefix) && (c < g.lo || c >= g.hi) {
			continue
		}
		g.code = append(g.code, Alphabet[c])
	}
	return string(g.code), nil
}

// validImportCode reports whether s is 4 to 64 of A–Z, a–z, 0–9, '-' and '_'.
func validImportCode(s string) bool {
	if len(s) < MinImportLength || len(s) > MaxImportLength {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}
