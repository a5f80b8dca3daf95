package campaign

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/campaignctl/campaignctl/providers"
)

// sample renders the message of the first planned recipient, so the marketer sees exactly what goes out.
func (p *Planner) sample(ctx context.Context, tx pgx.Tx, id int64, spec Spec, tmpl *Template, rep *Report) error {
	var r Recipient
	err := tx.QueryRow(ctx, `SELECT user_id, address, vars, coalesce(code, '') FROM campaign_recipients
		WHERE campaign_id = $1 ORDER BY batch, user_id LIMIT 1`, id).Scan(&r.UserID, &r.Address, &r.Vars, &r.Code)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	if spec.OneClickUnsubscribe() {
		r.UnsubscribeURL = UnsubscribeSample
		if spec.UnsubscribeSample != "" {
			r.UnsubscribeURL = spec.UnsubscribeSample
		}
	}
	parts, err := tmpl.RenderParts(r.TemplateData(spec.Channel, spec.Name))
	if err != nil {
		return templateFails(r.UserID, err)
	}
	msg := parts.Text
	// The code is shown masked: the sample is printed (a dry run's output lands in CI logs), and the code
	// in it is one a customer gets, the dry run's as well (it reserves the same codes the launch will).
	hide := func(s string) string {
		if r.Code == "" {
			return s
		}
		return strings.ReplaceAll(s, r.Code, strings.Repeat("*", utf8.RuneCountInString(r.Code)))
	}
	rep.SampleMessage, rep.SampleSubject, rep.SampleHTML = hide(msg), hide(parts.Subject), hide(parts.HTML)
	if spec.Channel.Spec().Segmented {
		rep.Encoding, rep.SegmentsPerMessage = providers.SMSSegments(msg)
		if err := CheckSMSLength(msg, spec.MaxSegments); err != nil {
			return fmt.Errorf("%w: the first message (user %s) %v", ErrInvalid, providers.MaskUserID(r.UserID), err)
		}
		if rep.SegmentsPerMessage > WarnSegments {
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("each message takes %d SMS segments (%s): it is billed %d times; shorten it to %d or fewer if you can",
				rep.SegmentsPerMessage, rep.Encoding, rep.SegmentsPerMessage, WarnSegments))
		}
		mean, err := sampleSegments(ctx, tx, id, spec, tmpl)
		if err != nil {
			return err
		}
		rep.SampleSegments = mean
	}
	return nil
}

// SampleMessages is how many SMS a plan renders for the mean of their segments (Report.SampleSegments).
const SampleMessages = 1000

// sampleSegments is the mean segments of the campaign's first SampleMessages SMS, in batch order, each
// rendered for its recipient; 0 when none renders (the launch's own checks say why).
func sampleSegments(ctx context.Context, tx pgx.Tx, id int64, spec Spec, tmpl *Template) (float64, error) {
	rows, err := tx.Query(ctx, `SELECT user_id, address, vars, coalesce(code, '') FROM campaign_recipients
		WHERE campaign_id = $1 ORDER BY batch, user_id LIMIT $2`, id, SampleMessages)
	if err != nil {
		return 0, fmt.Errorf("plan: %w", err)
	}
	defer rows.Close()
	var n, segments int
	for rows.Next() {
		var r Recipient
		if err := rows.Scan(&r.UserID, &r.Address, &r.Vars, &r.Code); err != nil {
			return 0, fmt.Errorf("plan: %w", err)
		}
		parts, err := tmpl.RenderParts(r.TemplateData(spec.Channel, spec.Name))
		if err != nil {
			continue
		}
		_, k := providers.SMSSegments(parts.Text)
		n, segments = n+1, segments+k
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("plan: %w", err)
	}
	if n == 0 {
		return 0, nil
	}
	return float64(segments) / float64(n), nil
}

// countSegments renders every planned message, as the worker will, and adds up its SMS segments. A
// message that fails to render, or that is longer than spec.MaxSegments, stops the launch before anything
// is written.
func (p *Planner) countSegments(ctx context.Context, tx pgx.Tx, id int64, spec Spec, tmpl *Template, rep *Report) error {
	return p.renderMessages(ctx, tx, id, spec, tmpl, rep, "")
}

// checkLengths refuses a launch of SMS one of whose messages would be refused at send time, as a dry run
// does (countSegments): a message longer than spec.MaxSegments, or one whose template fails for its row.
// When the message is plain (text and {{.field}} actions), a bound is computed in SQL for each row (the
// literal text's bytes and the bytes of each value it prints) and only the rows over the bound, or with a
// value the bound cannot vouch for, are rendered; otherwise every message is.
func (p *Planner) checkLengths(ctx context.Context, tx pgx.Tx, id int64, spec Spec, tmpl *Template) error {
	where, args, ok := lengthSuspects(tmpl, spec)
	if !ok {
		return p.renderMessages(ctx, tx, id, spec, tmpl, nil, "")
	}
	return p.renderMessages(ctx, tx, id, spec, tmpl, nil, where, args...)
}

// lengthSuspects is the SQL condition (over campaign_recipients, its arguments from $2 on) of the rows
// whose message may not fit spec.MaxSegments (more bytes than surelyFits), or may fail to render: false
// for every row whose message surely fits. ok is false when the template is not plain, or prints a value the bound cannot know
// (unsubscribe_url, signed by the worker for each recipient).
func lengthSuspects(tmpl *Template, spec Spec) (where string, args []any, ok bool) {
	literal, fields, ok := tmpl.TextLength()
	if !ok {
		return "", nil, false
	}
	limit := surelyFits(spec.MaxSegments)
	param := func(v any) string {
		args = append(args, v)
		return fmt.Sprintf("$%d", len(args)+1)
	}
	bound, more, unsure, ok := printedBytes(fields, spec, param)
	if !ok {
		return "", nil, false
	}
	// A message whose text and values are all blank: an SMS provider refuses it (Twilio's 21602) or
	// delivers a blank message.
	text, textFields, _ := tmpl.plainText.describe()
	if conds, more, ok := blankConds(text, textFields, spec, args); ok {
		args = more
		unsure = append(unsure, conds)
	}
	literal += more
	unsure = append([]string{"false"}, unsure...)
	sum := param(literal) + "::int"
	for _, b := range bound {
		sum += " + " + b
	}
	return " AND (" + sum + " > " + param(limit) + "::int OR " + strings.Join(unsure, " OR ") + ")", args, true
}

// printedBytes bounds in SQL the bytes the fields a plain part prints take in a row's message (a field
// printed twice counts twice): an expression of the row's columns for each (bound), the bytes known
// without the row (literal), and the conditions of the rows whose value the bound cannot vouch for
// (unsure: a value that is not a string, a number or a boolean prints in another form than its JSON
// text). param adds an argument of the statement and returns its placeholder. ok is false when a field's
// value is made for each recipient at send time (unsubscribe_url): only rendering tells.
func printedBytes(fields []string, spec Spec, param func(any) string) (bound []string, literal int, unsure []string, ok bool) {
	for _, f := range fields {
		// The values TemplateData gives, in its order: the engine's own fields win over the audience's.
		switch f {
		case "user_id":
			bound = append(bound, "octet_length(user_id)")
		case spec.Channel.AddressColumn():
			bound = append(bound, "octet_length(address)")
		case "campaign":
			literal += len(spec.Name)
		case "unsubscribe_url":
			return nil, 0, nil, false
		case "code":
			bound = append(bound, "coalesce(octet_length(NULLIF(code, '')), octet_length(vars->>'code'), 0)")
			unsure = append(unsure, "(coalesce(code, '') = '' AND coalesce(jsonb_typeof(vars->'code'), 'null') NOT IN ('string', 'number', 'boolean'))")
		default:
			k := param(f)
			// A string prints as it is, a number as its JSON text (the decoder keeps it), a boolean as
			// true or false: each the bytes ->> gives. Anything else (missing, null, an object) is rendered.
			bound = append(bound, "coalesce(octet_length(vars->>"+k+"), 0)")
			unsure = append(unsure, "coalesce(jsonb_typeof(vars->"+k+"), 'null') NOT IN ('string', 'number', 'boolean')")
		}
	}
	return bound, literal, unsure, true
}

// renderMessages renders the planned messages of the rows of campaign id that match where (a condition
// starting with AND, its arguments from $2 on; "" for every row), as the worker will. It fails when one
// fails to render or is longer than spec.MaxSegments. With rep, it adds up their SMS segments.
func (p *Planner) renderMessages(ctx context.Context, tx pgx.Tx, id int64, spec Spec, tmpl *Template, rep *Report, where string, args ...any) error {
	var tooLong, blanks, longest, overWarn int
	var firstLong, firstBlank, longestUser string
	err := eachPlanned(ctx, tx, id, where, args, func(r *Recipient) error {
		msg, err := tmpl.Render(r.TemplateData(spec.Channel, spec.Name))
		if err != nil {
			return templateFails(r.UserID, err)
		}
		enc, n := providers.SMSSegments(msg)
		if rep != nil {
			rep.TotalSegments += int64(n)
			if enc == providers.EncodingUCS2 {
				rep.UCS2Messages++
			}
			if n > WarnSegments {
				overWarn++
			}
			if n > longest {
				longest, longestUser = n, providers.MaskUserID(r.UserID)
			}
		}
		switch err := CheckSMSLength(msg, spec.MaxSegments); {
		case err == nil:
		case blank(msg):
			if blanks++; blanks == 1 {
				firstBlank = fmt.Sprintf("user %s's message %v", providers.MaskUserID(r.UserID), err)
			}
		default:
			if tooLong++; tooLong == 1 {
				firstLong = fmt.Sprintf("user %s's message %v", providers.MaskUserID(r.UserID), err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if blanks > 0 {
		what := "1 message is blank: "
		if blanks > 1 {
			what = fmt.Sprintf("%d messages are blank; ", blanks)
		}
		return fmt.Errorf("%w: %s%s; nothing was written", ErrInvalid, what, firstBlank)
	}
	if tooLong > 0 {
		return fmt.Errorf("%w: %s; nothing was written", ErrInvalid, tooLongSummary(tooLong, firstLong))
	}
	// The first message's warning (sample) says each message is long; when it is not, the longest ones
	// are still billed several times.
	if rep != nil && overWarn > 0 && rep.SegmentsPerMessage <= WarnSegments {
		what := fmt.Sprintf("%d messages take", overWarn)
		if overWarn == 1 {
			what = "1 message takes"
		}
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("%s more than %d SMS segments, the longest %d (user %s): each is billed as many times; shorten the values that make them long if you can",
			what, WarnSegments, longest, longestUser))
	}
	return nil
}

// eachPlanned calls fn with each planned row of campaign id that matches where (a condition starting with
// AND, its arguments from $2 on; "" for every row), and stops at fn's first error.
func eachPlanned(ctx context.Context, tx pgx.Tx, id int64, where string, args []any, fn func(*Recipient) error) error {
	rows, err := tx.Query(ctx, `SELECT user_id, address, vars, coalesce(code, '') FROM campaign_recipients WHERE campaign_id = $1`+where,
		append([]any{id}, args...)...)
	if err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	defer rows.Close()
	var r Recipient
	for rows.Next() {
		if err := rows.Scan(&r.UserID, &r.Address, &r.Vars, &r.Code); err != nil {
			return fmt.Errorf("plan: %w", err)
		}
		if err := fn(&r); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	return nil
}

// checkParts refuses a launch of e-mail or push one of whose messages its provider would refuse for its
// shape alone, as a launch of SMS refuses one longer than --max-segments (checkLengths): an e-mail whose
// subject renders blank (SendGrid requires a subject; a blank one is a template's fault in any case), a
// push over FCM's MaxPushBytes with its title and data. Only the rows a bound computed in SQL cannot clear
// are rendered; every row when the parts are not plain. Found now, they are fixed before anything is
// written; found by the sends, each would fail alone.
func (p *Planner) checkParts(ctx context.Context, tx pgx.Tx, id int64, spec Spec, tmpl *Template) error {
	if spec.TemplateID != "" {
		return nil // the provider's template holds the subject and the size
	}
	var where string
	var args []any
	var check func(r *Recipient, parts Parts) (string, bool)
	var one, many, why string // what is refused, for one message and for several
	switch spec.Channel {
	case ChannelEmail:
		var ok bool
		if where, args, ok = blankSubjectSuspects(tmpl, spec); !ok {
			return nil
		}
		check = func(r *Recipient, parts Parts) (string, bool) {
			return fmt.Sprintf("user %s's subject is %q", providers.MaskUserID(r.UserID), parts.Subject), blank(parts.Subject)
		}
		one, many, why = "e-mail subject renders blank", "e-mail subjects render blank", "give the subject text of its own or a fallback ({{or .first_name \"Merhaba\"}}), or leave those rows out of the audience"
	case ChannelPush:
		where, args = pushSizeSuspects(tmpl, spec)
		check = func(r *Recipient, parts Parts) (string, bool) {
			n := PushBytes(parts.Subject, parts.Text, PushData(tmpl, r.TemplateData(spec.Channel, spec.Name), spec.Channel.AddressColumn()))
			return fmt.Sprintf("user %s's is %d bytes", providers.MaskUserID(r.UserID), n), n > MaxPushBytes
		}
		limit := fmt.Sprintf(": FCM takes at most %d bytes of a message's title, body and data together", MaxPushBytes)
		one, many, why = "push message is too big"+limit, "push messages are too big"+limit, "shorten the message or the title, or the data_ columns of those rows"
	default:
		return nil
	}
	var bad int
	var first string
	err := eachPlanned(ctx, tx, id, where, args, func(r *Recipient) error {
		if spec.OneClickUnsubscribe() {
			r.UnsubscribeURL = UnsubscribeSample
		}
		parts, err := tmpl.RenderParts(r.TemplateData(spec.Channel, spec.Name))
		if err != nil {
			return templateFails(r.UserID, err)
		}
		if said, refused := check(r, parts); refused {
			if bad++; bad == 1 {
				first = said
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if bad > 0 {
		what := many
		if bad == 1 {
			what = one
		}
		return fmt.Errorf("%w: %d %s (%s): %s; nothing was written", ErrInvalid, bad, what, first, why)
	}
	return nil
}

// blank says whether s is empty or ASCII white space only, as the SQL of blankSubjectSuspects reads it: one
// rule whether the subject is plain or rendered. A subject of other spaces (U+00A0) is sent as it is;
// SendGrid takes it.
func blank(s string) bool { return strings.Trim(s, blankChars) == "" }

// blankChars are the characters a message of nothing else shows as blank: Unicode's white space (a CRM
// export's no-break space, an ideographic space, a line separator as well as ASCII's) and the zero-width
// space and joiners, and the byte order mark.
const blankChars = " \t\n\r\v\f\u0085\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" +
	"\u2028\u2029\u202f\u205f\u3000\u200b\u200c\u200d\u2060\ufeff"

// blankSubjectSuspects is the SQL condition (as lengthSuspects') of the rows whose e-mail subject may
// render blank: those whose every printed value is blank or missing, when the subject is plain and its
// own text is blank; every row when it is not plain. ok is false when no row's subject can be blank (its
// own text is not, or there is no subject).
func blankSubjectSuspects(tmpl *Template, spec Spec) (where string, args []any, ok bool) {
	if !tmpl.HasSubject() {
		return "", nil, false
	}
	literal, fields, plain := tmpl.SubjectParts()
	if !plain {
		return "", nil, true
	}
	conds, args, ok := blankConds(literal, fields, spec, nil)
	if !ok {
		return "", nil, false
	}
	return " AND " + conds, args, true
}

// blankConds is the SQL condition (over campaign_recipients, its arguments from $len(args)+2 on, appended
// to args) of the rows whose plain part of literal text literal, printing fields, renders blank: its every
// printed value blank or missing. ok is false when no row's part can be blank (its own text is not).
func blankConds(literal string, fields []string, spec Spec, args []any) (where string, _ []any, ok bool) {
	if !blank(literal) {
		return "", args, false
	}
	// Blank as blank reads it.
	trim := quoteLiteral(blankChars)
	conds := []string{"true"}
	for _, f := range fields {
		switch f {
		case "user_id":
			conds = append(conds, "btrim(user_id, "+trim+") = ''")
		case spec.Channel.AddressColumn():
			conds = append(conds, "btrim(address, "+trim+") = ''")
		case "campaign":
			if !blank(spec.Name) {
				return "", args, false
			}
		case "unsubscribe_url":
			return "", args, false
		case "code":
			conds = append(conds, "coalesce(btrim(coalesce(NULLIF(code, ''), vars->>'code'), "+trim+"), '') = ''")
		default:
			args = append(args, f)
			conds = append(conds, fmt.Sprintf("coalesce(btrim(vars->>$%d, %s), '') = ''", len(args)+1, trim))
		}
	}
	return "(" + strings.Join(conds, " AND ") + ")", args, true
}

// pushSizeSuspects is the SQL condition (as lengthSuspects') of the rows whose push may be over
// MaxPushBytes: more than a bound computed from the row's bytes, or with a value the bound cannot vouch
// for (an object or an array prints in Go's form). The bound is the title's and body's own text, each
// printed value's bytes, and for the data payload every column of the row with its name (its JSON text
// is longer) and the engine's values. Every row when the title or the body is not plain.
func pushSizeSuspects(tmpl *Template, spec Spec) (string, []any) {
	text, fields, ok := tmpl.TextLength()
	if !ok {
		return "", nil
	}
	literal := text
	if tmpl.HasSubject() {
		title, more, ok := tmpl.SubjectParts()
		if !ok {
			return "", nil
		}
		literal, fields = literal+len(title), append(fields, more...)
	}
	var args []any
	param := func(v any) string {
		args = append(args, v)
		return fmt.Sprintf("$%d", len(args)+1)
	}
	bound, more, _, ok := printedBytes(fields, spec, param)
	if !ok {
		return "", nil
	}
	// The data payload: every column with its name, and the engine's values with theirs.
	bound = append(bound, "octet_length(vars::text)", "coalesce(octet_length(code), 0)", "octet_length(user_id)")
	literal += more + len("code") + len("campaign") + len(spec.Name) + len("user_id")
	sum := param(literal) + "::int + " + strings.Join(bound, " + ")
	return " AND (" + sum + " > " + param(MaxPushBytes) + "::int" +
		` OR jsonb_path_exists(vars, '$.* ? (@.type() == "object" || @.type() == "array")'))`, args
}

// tooLongSummary says how many messages are too long, and why the first is.
func tooLongSummary(n int, first string) string {
	if n == 1 {
		return "1 message is too long: " + first
	}
	return fmt.Sprintf("%d messages are too long; %s", n, first)
}

// ReasonCounts returns the campaign's failed and skipped recipients counted by reason, at most top
// reasons of each (the most frequent).
func (s *Store) ReasonCounts(ctx context.Context, id int64, top int) (failed, skipped map[string]int64, err error) {
	rows, err := s.pool.Query(ctx, `
		SELECT status, reason, n FROM (
			SELECT status, coalesce(reason, '') AS reason, count(*) AS n,
			       row_number() OVER (PARTITION BY status ORDER BY count(*) DESC, coalesce(reason, '')) AS rank
			FROM campaign_recipients WHERE campaign_id = $1 AND status IN ('failed', 'skipped') GROUP BY status, coalesce(reason, '')
		) r WHERE rank <= $2`, id, top)
	if err != nil {
		return nil, nil, fmt.Errorf("reasons: %w", err)
	}
	defer rows.Close()
	failed, skipped = map[string]int64{}, map[string]int64{}
	for rows.Next() {
		var st, reason string
		var n int64
		if err := rows.Scan(&st, &reason, &n); err != nil {
			return nil, nil, fmt.Errorf("reasons: %w", err)
		}
		if st == StatusFailed {
			failed[reason] = n
		} else {
			skipped[reason] = n
		}
	}
	return failed, skipped, rows.Err()
}

// templateFails says that the message template fails for user's row, with err (which may already be an
// ErrInvalid: its words are not said twice).
func templateFails(user string, err error) error {
	return fmt.Errorf("%w: the message template fails for user %s: %s", ErrInvalid, providers.MaskUserID(user), strings.TrimPrefix(err.Error(), ErrInvalid.Error()+": "))
}
