package providers

import (
	"errors"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// contentMark replaces what a provider's answer quotes of the messages it was sent.
const contentMark = "[content]"

// quotedRun is the shortest run of a message's text that is masked wherever an answer quotes it: shorter
// runs (a word or two: "Merhaba ", " gönderi") are as likely the provider's own words as the message's
// (Netgsm answers in Turkish too). The audience values, where a quote names someone, are masked on their
// own, however short.
const quotedRun = 16

// quotedValue is the shortest audience value masked on its own (a first name "Ali" is; "TR" is not).
const quotedValue = 3

// MaskContent masks, in the text of a provider's error, what it quotes of the messages the request
// carried: their texts, subject and HTML (any run of 16 bytes or more of them, in any of the encodings a
// request carries them in: as is, form- or URL-encoded, JSON-escaped) and their audience values (the
// substitutions and data of each recipient, 3 bytes or more). A gateway or provider that echoes the
// request would otherwise put recipients' names, codes and identity numbers into the reasons that
// status, report, dlq and the logs show. err is returned as it is unless it is a *Error with a message;
// that Error is changed in place (each call of an adapter returns its own).
func MaskContent(err error, ms ...Message) error {
	var pe *Error
	if !errors.As(err, &pe) || pe.Message == "" || len(ms) == 0 {
		return err
	}
	pe.Message = maskQuoted(pe.Message, ms)
	return err
}

// maskQuoted is MaskContent's work on one text.
func maskQuoted(text string, ms []Message) string {
	seen := map[string]bool{}
	quote := func(q string) {
		if len(q) < quotedValue || seen[q] {
			return
		}
		seen[q] = true
		for _, v := range encodings(q) {
			if len(v) < quotedRun {
				text = replaceTokens(text, v)
				continue
			}
			text = maskRuns(text, v)
		}
	}
	for i := range ms {
		m := &ms[i]
		if m.Shared != nil {
			// The content a request's messages share, once (seen), and each one's values: not every
			// rendered copy of a newsletter.
			for _, part := range []string{m.Shared.Text, m.Shared.HTML} {
				for _, piece := range splitTags(part, m.Shared.Tags) {
					quote(piece)
				}
			}
		} else {
			quote(m.Body)
			quote(m.HTML)
		}
		quote(m.Subject)
		for _, v := range m.Values {
			quote(v)
		}
		for _, v := range m.Data {
			quote(v)
		}
	}
	return text
}

// replaceTokens replaces, in text, each occurrence of a short value v that stands as a token of its own:
// not inside a word of the answer (a letter or digit on the side where v has one). A first name "Ali" is
// masked where an answer quotes it, not in the provider's "Invalid": that garbled the provider's wording,
// and made one error's reason differ with the names of the recipients it met.
func replaceTokens(text, v string) string {
	if !strings.Contains(text, v) {
		return text
	}
	first, _ := utf8.DecodeRuneInString(v)
	last, _ := utf8.DecodeLastRuneInString(v)
	var b strings.Builder
	done := 0
	for i := 0; ; {
		k := strings.Index(text[i:], v)
		if k < 0 {
			break
		}
		at, end := i+k, i+k+len(v)
		before, _ := utf8.DecodeLastRuneInString(text[:at])
		after, _ := utf8.DecodeRuneInString(text[end:])
		if (at == 0 || !isWordRune(first) || !isWordRune(before)) && (end == len(text) || !isWordRune(last) || !isWordRune(after)) {
			b.WriteString(text[done:at])
			b.WriteString(contentMark)
			done, i = end, end
			continue
		}
		_, size := utf8.DecodeRuneInString(text[at:])
		i = at + size
	}
	if done == 0 {
		return text
	}
	b.WriteString(text[done:])
	return b.String()
}

// isWordRune says whether r is a letter or a digit.
func isWordRune(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) }

// splitTags cuts a shared content at its tags: the pieces every message carries as they are.
func splitTags(s string, tags []string) []string {
	pieces := []string{s}
	for _, tag := range tags {
		var next []string
		for _, p := range pieces {
			next = append(next, strings.Split(p, tag)...)
		}
		pieces = next
	}
	return pieces
}

// encodings are the spellings of q a request may carry and an answer quote: as is, upper- and
// lower-cased, form-encoded, URL-encoded, and JSON-escaped (with and without its non-ASCII letters
// escaped).
func encodings(q string) []string {
	out := []string{q, strings.ToUpper(q), strings.ToLower(q), url.QueryEscape(q), url.PathEscape(q)}
	ascii := strconv.QuoteToASCII(q)
	out = append(out, ascii[1:len(ascii)-1])
	quoted := strconv.Quote(q)
	out = append(out, quoted[1:len(quoted)-1])
	return slices.Compact(slices.Sorted(slices.Values(out)))
}

// maskRuns replaces, in text, every run of quotedRun bytes or more that is also in q with contentMark,
// widened to whole UTF-8 characters.
func maskRuns(text, q string) string {
	if len(text) < quotedRun {
		return text
	}
	grams := make(map[string]struct{}, len(q))
	for i := 0; i+quotedRun <= len(q); i++ {
		grams[q[i:i+quotedRun]] = struct{}{}
	}
	var b strings.Builder
	last := 0
	for i := 0; i+quotedRun <= len(text); {
		if _, ok := grams[text[i:i+quotedRun]]; !ok {
			i++
			continue
		}
		j := i + quotedRun
		for j < len(text) && strings.Contains(q, text[i:j+1]) {
			j++
		}
		start := i
		for start > last && !utf8.RuneStart(text[start]) {
			start--
		}
		for j < len(text) && !utf8.RuneStart(text[j]) {
			j++
		}
		b.WriteString(text[last:start])
		b.WriteString(contentMark)
		last, i = j, j
	}
	if last == 0 {
		return text
	}
	b.WriteString(text[last:])
	return b.String()
}
