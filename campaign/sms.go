package campaign

import (
	"fmt"

	"github.com/campaignctl/campaignctl/providers"
)

// CheckSMSLength says why an SMS body cannot go out (nil when it can): blank, more than maxSegments
// segments, or more characters than providers take.
func CheckSMSLength(body string, maxSegments int) error {
	if blank(body) {
		return fmt.Errorf("is blank (%q): an SMS provider refuses an empty body and delivers a blank one; give the message text of its own, or leave the rows whose values are blank out of the audience", body)
	}
	if maxSegments <= 0 {
		maxSegments = DefaultMaxSegments
	}
	enc, n := providers.SMSSegments(body)
	if units := utf16Len(body); units > MaxSMSChars {
		return fmt.Errorf("is %d characters long, more than the %d an SMS provider takes; shorten it", units, MaxSMSChars)
	}
	if n > maxSegments {
		return fmt.Errorf("takes %d SMS segments (%s), more than --max-segments %d; shorten it (a single Turkish letter such as ı makes the whole message UCS-2, 67 characters a segment) or raise --max-segments", n, enc, maxSegments)
	}
	return nil
}

func utf16Len(s string) int {
	n := 0
	for _, r := range s {
		n++
		if r >= 0x10000 {
			n++
		}
	}
	return n
}

// surelyFits is the most bytes (UTF-8) an SMS body may have to fit maxSegments segments whatever its
// characters (0: DefaultMaxSegments). A body of B bytes has at most B UTF-16 units and at most 2B GSM-7
// septets, so it fits one segment when B ≤ 70, and N when B ≤ 66 N (UCS-2 parts of 67 units, one of which
// a surrogate pair that does not split may leave empty; GSM-7 parts of 153 septets hold 132 N and more).
// It is also under MaxSMSChars for any N up to 24.
func surelyFits(maxSegments int) int {
	if maxSegments <= 0 {
		maxSegments = DefaultMaxSegments
	}
	if maxSegments == 1 {
		return 70
	}
	return 66 * maxSegments
}
