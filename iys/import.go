package iys

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	_ "time/tzdata" // consent dates are Europe/Istanbul even on hosts without a zoneinfo database
	"unicode/utf8"

	"github.com/campaignctl/campaignctl/providers"
)

// Header is the exact header line of a consent CSV file (the design's contract).
const Header = "recipient,type,recipient_type,status,source,consent_date"

// DateLayout is the layout of consent_date in a consent CSV file, read in Europe/Istanbul time.
const DateLayout = "2006-01-02 15:04:05"

// maxSourceLen bounds the free-form source column; İYS sources are short enum names.
const maxSourceLen = 256

// istanbul is the zone of İYS dates. The embedded tzdata makes loading it infallible.
var istanbul = func() *time.Location {
	loc, err := time.LoadLocation("Europe/Istanbul")
	if err != nil {
		panic("iys: load Europe/Istanbul: " + err.Error())
	}
	return loc
}()

// Istanbul returns the Europe/Istanbul location that consent dates are read and written in.
func Istanbul() *time.Location { return istanbul }

// ImportOptions tunes Import. The zero value is valid.
type ImportOptions struct {
	// Progress, if not nil, is called with the number of data rows read so far, about every 10,000 rows
	// and once at the end. It is called from a goroutine other than the caller's, never concurrently.
	Progress func(rows int64)
	// BrandCode is the İYS brand the file's consents belong to ("" when there is one brand and the file
	// does not say).
	BrandCode string
}

// ImportReport counts what Import did. Rows = Superseded + Inserted + Updated + Unchanged.
type ImportReport struct {
	Rows       int64 // data rows in the file (the header and blank lines excluded)
	Superseded int64 // rows beaten by a later consent_date (or, of one second, a RET, then a later line) for the same key in the file
	Inserted   int64 // keys that had no stored consent
	Updated    int64 // stored consents replaced (the file's consent_date was later, or the same and not an ONAY over a RET, and it differed)
	Unchanged  int64 // stored consents kept: newer than the file's, or identical to it
	// Requeued counts the refusals made here that the file shows İYS does not hold: an ONAY older than the
	// refusal, stored as its RET, and the RET queued for İYS (iys push) unless one as new is on its way.
	Requeued int64
	// Missing counts the consents stored for the brand from İYS's data (an earlier import, a pull or a
	// re-verification) that the file does not list. A complete export lists them all; a file that leaves
	// some out is a partial one (new sign-ups, a CRM's extract), which says nothing of the consents it does
	// not list: it does not make the brand's consents count as up to date for launches' --max-consent-age.
	Missing int64
}

// LineError reports a malformed line of a consent file. Line is 1-based and counts the header as line 1;
// Column is the CSV column at fault ("header" for the header line, "" when the line as a whole is bad);
// Msg says what is wrong and how to fix it, and starts with the column name.
type LineError struct {
	Line   int
	Column string
	Msg    string
}

// Error returns "line N: " followed by Msg.
func (e *LineError) Error() string { return fmt.Sprintf("line %d: %s", e.Line, e.Msg) }

// consentRow is one validated data row.
type consentRow struct {
	line          int64
	recipient     string
	typ           string
	recipientType string
	status        string
	source        string
	consentDate   time.Time
}

const numColumns = 6

// consentReader streams validated rows out of a consent CSV file, one at a time.
type consentReader struct {
	csv    *csv.Reader
	header bool
	// latest is the latest consent_date a row may have: now, with a quarter hour for clocks that differ.
	latest time.Time
}

func newConsentReader(r io.Reader) *consentReader {
	c := csv.NewReader(&lineCap{r: bufio.NewReaderSize(r, 1<<16), max: MaxLineBytes})
	c.FieldsPerRecord = -1 // checked per line, for a better message
	c.ReuseRecord = true
	return &consentReader{csv: c, latest: time.Now().Add(15 * time.Minute)}
}

// next returns the next data row, io.EOF after the last one, or a *LineError.
func (cr *consentReader) next() (consentRow, error) {
	if !cr.header {
		if err := cr.readHeader(); err != nil {
			return consentRow{}, err
		}
		cr.header = true
	}
	rec, err := cr.csv.Read()
	if err != nil {
		if err == io.EOF {
			return consentRow{}, io.EOF
		}
		return consentRow{}, csvError(err)
	}
	line, _ := cr.csv.FieldPos(0)
	return parseRow(line, rec, cr.latest)
}

func (cr *consentReader) readHeader() error {
	rec, err := cr.csv.Read()
	if err == io.EOF {
		return &LineError{Line: 1, Column: "header", Msg: "header missing: the file is empty; the first line must be " + Header}
	}
	if err != nil {
		return csvError(err)
	}
	if line, _ := cr.csv.FieldPos(0); line != 1 {
		return &LineError{Line: 1, Column: "header", Msg: "header must be the first line, without blank lines before it: " + Header}
	}
	got := make([]string, len(rec))
	for i, f := range rec {
		if i == 0 {
			f = strings.TrimPrefix(f, "\uFEFF")
		}
		got[i] = strings.TrimSpace(f)
	}
	if strings.Join(got, ",") != Header {
		return &LineError{Line: 1, Column: "header", Msg: fmt.Sprintf("header %q must be exactly %s", strings.Join(rec, ","), Header)}
	}
	return nil
}

// MaxLineBytes is the longest line a consent file may have: a row is under 200 bytes, and a file whose
// line runs on (a truncated or binary file) is refused before it is held in memory.
const MaxLineBytes = 1 << 20

// lineCap reads r and fails once a line runs past max bytes without a line end.
type lineCap struct {
	r    io.Reader
	max  int
	run  int // bytes since the last line end
	line int // line ends read so far
}

// errLongLine is lineCap's error.
type errLongLine struct{ line int }

func (e errLongLine) Error() string {
	return fmt.Sprintf("line %d is longer than %d bytes: not a consent CSV (a truncated or binary file?)", e.line, MaxLineBytes)
}

func (l *lineCap) Read(p []byte) (int, error) {
	n, err := l.r.Read(p)
	for rest := p[:n]; len(rest) > 0; {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			l.run += len(rest)
			break
		}
		if l.run+i > l.max {
			return 0, errLongLine{line: l.line + 1}
		}
		l.run, l.line, rest = 0, l.line+1, rest[i+1:]
	}
	if l.run > l.max {
		return 0, errLongLine{line: l.line + 1}
	}
	return n, err
}

func csvError(err error) error {
	var long errLongLine
	if errors.As(err, &long) {
		return &LineError{Line: long.line, Msg: long.Error()}
	}
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		return &LineError{Line: pe.StartLine, Msg: fmt.Sprintf("malformed CSV (%v): quote fields that contain commas or quotes, and double any quote inside them", pe.Err)}
	}
	return fmt.Errorf("read consents: %w", err)
}

func parseRow(line int, rec []string, latest time.Time) (consentRow, error) {
	if len(rec) != numColumns {
		return consentRow{}, &LineError{Line: line, Msg: fmt.Sprintf("has %d columns, must have %d: %s", len(rec), numColumns, Header)}
	}
	row := consentRow{line: int64(line)}
	bad := func(col, format string, args ...any) (consentRow, error) {
		return consentRow{}, &LineError{Line: line, Column: col, Msg: col + " " + fmt.Sprintf(format, args...)}
	}

	switch row.typ = strings.TrimSpace(rec[1]); row.typ {
	case TypeMessage, TypeEmail, TypeCall:
	default:
		return bad("type", "%q must be MESAJ, EPOSTA or ARAMA", rec[1])
	}
	switch row.recipientType = strings.TrimSpace(rec[2]); row.recipientType {
	case RecipientIndividual, RecipientMerchant:
	default:
		return bad("recipient_type", "%q must be BIREYSEL or TACIR", rec[2])
	}
	switch row.status = strings.TrimSpace(rec[3]); row.status {
	case StatusApproved, StatusRejected:
	default:
		return bad("status", "%q must be ONAY or RET", rec[3])
	}

	var err error
	if row.typ == TypeEmail {
		if row.recipient, err = CanonicalEmail(rec[0]); err != nil {
			// The value is masked, as addresses are in every log: the line number finds it in the file.
			return bad("recipient", "%q is not a valid e-mail address for EPOSTA (%v); write it as name@example.com", providers.MaskAddress(rec[0]), unwrapDetail(err))
		}
	} else {
		if row.recipient, err = CanonicalPhone(rec[0]); err != nil {
			return bad("recipient", "%q is not a valid phone number for %s (%v); write it as +905XXXXXXXXX", providers.MaskAddress(rec[0]), row.typ, unwrapDetail(err))
		}
	}

	row.source = rec[4]
	if len(row.source) > maxSourceLen || !utf8.ValidString(row.source) || strings.IndexByte(row.source, 0) >= 0 {
		return bad("source", "%q must be UTF-8 text of at most %d bytes, e.g. HS_WEB", truncate(row.source, 40), maxSourceLen)
	}

	var shapeOK bool
	if row.consentDate, shapeOK, err = parseDate(strings.TrimSpace(rec[5])); !shapeOK {
		return bad("consent_date", "%q must be YYYY-MM-DD HH:MM:SS in Turkey time, e.g. 2024-05-17 14:30:00", rec[5])
	} else if err != nil {
		return bad("consent_date", "%q must be a real date and time as YYYY-MM-DD HH:MM:SS in Turkey time, e.g. 2024-05-17 14:30:00", rec[5])
	} else if row.consentDate.Before(earliestConsent) {
		// İYS holds no consent dated before it (H156): such a date is a placeholder or a typo, and a RET
		// of it would lose to any ONAY.
		return bad("consent_date", "%q is before 2015-05-01 00:00:00, the earliest date İYS takes (consents given before it are recorded with that date, source HS_2015); give the date İYS recorded the consent on", rec[5])
	} else if row.consentDate.After(latest) {
		// A consent dated in the future would also win over every real change made before that date.
		return bad("consent_date", "%q is in the future (Turkey time); give the date İYS recorded the consent on, as YYYY-MM-DD HH:MM:SS", rec[5])
	}
	return row, nil
}

var errDateRange = errors.New("date out of range")

// earliestConsent is the earliest consent date İYS takes: consents given before the law's register
// opened are recorded as of it (source HS_2015).
var earliestConsent = time.Date(2015, 5, 1, 0, 0, 0, 0, Istanbul())

// parseDate reads DateLayout in Europe/Istanbul, like time.ParseInLocation but several times faster, which
// matters at a million rows. shapeOK is false when s is not of the form 0000-00-00 00:00:00; err is set
// when it is but names no real time (month 13, 30 February, 24:00:00).
func parseDate(s string) (t time.Time, shapeOK bool, err error) {
	if len(s) != len(DateLayout) || s[4] != '-' || s[7] != '-' || s[10] != ' ' || s[13] != ':' || s[16] != ':' {
		return time.Time{}, false, nil
	}
	var v [6]int
	for i, at := range [6][2]int{{0, 4}, {5, 7}, {8, 10}, {11, 13}, {14, 16}, {17, 19}} {
		for j := at[0]; j < at[1]; j++ {
			c := s[j]
			if c < '0' || c > '9' {
				return time.Time{}, false, nil
			}
			v[i] = v[i]*10 + int(c-'0')
		}
	}
	year, month, day, hour, minute, sec := v[0], v[1], v[2], v[3], v[4], v[5]
	if month < 1 || month > 12 || day < 1 || hour > 23 || minute > 59 || sec > 59 {
		return time.Time{}, true, errDateRange
	}
	// time.Date normalises 30 February to 1 March; a round trip tells a real day from a normalised one.
	t = time.Date(year, time.Month(month), day, hour, minute, sec, 0, istanbul)
	if y, m, d := t.Date(); y != year || int(m) != month || d != day {
		return time.Time{}, true, errDateRange
	}
	return t, true, nil
}

// unwrapDetail returns the reason a recipient was rejected, without the sentinel's text, which the
// importer's message already says in its own words.
func unwrapDetail(err error) string {
	var ie *invalidError
	if errors.As(err, &ie) {
		return ie.detail
	}
	return err.Error()
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
