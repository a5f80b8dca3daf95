package iys

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Outbox states (iys_outbox.state).
const (
	OutboxWaiting  = "waiting"  // to send, from next_at on
	OutboxSent     = "sent"     // in a batch request whose result is awaited
	OutboxAccepted = "accepted" // İYS registered the RET
	OutboxAlready  = "already"  // İYS held RET already (H174)
	OutboxRefused  = "refused"  // İYS refused it: kept with its code, not tried again
)

// codeAlready is İYS's answer to an update that does not change the status: the RET is there already.
const codeAlready = "H174"

// PushOptions tunes Push. The zero value is valid.
type PushOptions struct {
	// BatchFrom is the number of waiting RETs from which they go in asynchronous batches of up to
	// MaxAddBatch (results polled later) rather than one request each; 0 means 50.
	BatchFrom int
	// ResultAfter is how long after a batch was sent its result is first asked for (İYS: at least five
	// minutes); 0 means 5 minutes.
	ResultAfter time.Duration
	// Wait, when positive, keeps Push asking for the results of the batches it sent, every PollEvery,
	// until they are all in or Wait has passed. 0: it returns once everything due was sent.
	Wait, PollEvery time.Duration
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// PushReport is what Push did.
type PushReport struct {
	// Sent is the number of RETs İYS took in this run: answered one by one (accepted, already there or
	// refused), or in a batch it accepted for processing. A request İYS did not take (a 429, a 5xx, no
	// answer at all) is not counted: its RETs are in Retrying. Accepted, Already and Refused are the
	// results that came back in this run (of earlier batches too).
	Sent     int `json:"sent"`
	Accepted int `json:"accepted"`
	Already  int `json:"already"`
	Refused  int `json:"refused"`
	// RefusedCodes counts this run's refusals by İYS's code.
	RefusedCodes map[string]int `json:"refused_codes"`
	// Retrying is the number that failed with a transient error (429, 5xx, the network) and wait for
	// their back-off; Awaiting those whose batch result is not in yet.
	Retrying int `json:"retrying"`
	Awaiting int `json:"awaiting"`
	// OtherBrand is the number waiting for a brand other than the client's (pushed with that brand's
	// IYS_BRAND_CODE).
	OtherBrand int `json:"other_brand"`
	// Overdue is the number still not registered two business days after the refusal.
	Overdue int `json:"overdue"`
	// Waiting is the number left waiting after the run (their back-off not over, or for another brand).
	Waiting int `json:"waiting"`
}

// outboxRow is one RET to register.
type outboxRow struct {
	id       int64
	change   ConsentChange
	attempts int
	request  string
	index    int
}

// Push drains the İYS outbox once: it asks for the results of the batches sent at least ResultAfter ago,
// then sends every RET due (the brand's, and those recorded without a brand) — in single requests, or in
// batches when there are many — and records each answer: accepted, already RET (H174), or refused with
// İYS's code (not tried again). A transient failure (429, 5xx, the network) puts the RET back with an
// exponential back-off; a 429 ends the run's sending (the rest waits for the next run). An authentication
// or subscription error is returned. The requests are İYS's V2 ones, which are idempotent: a RET sent again
// after a crash before its answer was recorded is not registered twice. Pushes of one brand take turns: a
// push started while another runs waits for it, and then sends what is still due.
func Push(ctx context.Context, pool *pgxpool.Pool, c *Client, opts PushOptions) (PushReport, error) {
	if opts.BatchFrom <= 0 {
		opts.BatchFrom = 50
	}
	if opts.ResultAfter <= 0 {
		opts.ResultAfter = 5 * time.Minute
	}
	if opts.PollEvery <= 0 {
		opts.PollEvery = 10 * time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	rep := PushReport{RefusedCodes: map[string]int{}}
	release, err := runAlone(ctx, pool, c, "push")
	if err != nil {
		return rep, err
	}
	defer release()
	if err := pollResults(ctx, pool, c, opts.Now().Add(-opts.ResultAfter), &rep); err != nil {
		return rep, err
	}
	sentBatches, err := sendDue(ctx, pool, c, opts, &rep)
	if err != nil {
		return rep, err
	}
	if sentBatches && opts.Wait > 0 {
		deadline := opts.Now().Add(opts.Wait)
		for {
			n, err := countState(ctx, pool, OutboxSent)
			if err != nil || n == 0 || !opts.Now().Before(deadline) {
				break
			}
			select {
			case <-ctx.Done():
				return rep, ctx.Err()
			case <-time.After(min(opts.PollEvery, deadline.Sub(opts.Now()))):
			}
			if err := pollResults(ctx, pool, c, opts.Now().Add(-opts.ResultAfter), &rep); err != nil {
				return rep, err
			}
		}
	}
	sum, err := Outbox(ctx, pool, opts.Now())
	if err != nil {
		return rep, err
	}
	rep.Awaiting, rep.Overdue, rep.Waiting = sum.States[OutboxSent], sum.Overdue, sum.States[OutboxWaiting]
	rep.OtherBrand = 0
	for brand, n := range sum.WaitingByBrand {
		if brand != "" && brand != c.BrandCode() {
			rep.OtherBrand += n
		}
	}
	return rep, nil
}

func countState(ctx context.Context, pool *pgxpool.Pool, state string) (int, error) {
	var n int
	err := pool.QueryRow(ctx, `SELECT count(*) FROM iys_outbox WHERE state = $1`, state).Scan(&n)
	return n, err
}

// backoff is the wait before a RET that failed transiently is sent again: 30 s doubling to an hour, with
// a fifth of jitter.
func backoff(attempts int) time.Duration {
	d := 30 * time.Second << min(attempts, 7)
	d = min(d, time.Hour)
	return d - time.Duration(rand.Int64N(int64(d/5)+1))
}

// sendDue sends the RETs due, and reports whether any went in a batch.
func sendDue(ctx context.Context, pool *pgxpool.Pool, c *Client, opts PushOptions, rep *PushReport) (bool, error) {
	rows, err := pool.Query(ctx, `
		SELECT id, recipient, type, recipient_type, status, source, consent_date, attempts FROM iys_outbox
		WHERE state = 'waiting' AND next_at <= $1 AND brand_code IN ('', $2)
		ORDER BY id`, opts.Now(), c.BrandCode())
	if err != nil {
		return false, fmt.Errorf("iys push: read the outbox: %w", err)
	}
	due, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (outboxRow, error) {
		var o outboxRow
		err := row.Scan(&o.id, &o.change.Recipient, &o.change.Type, &o.change.RecipientType, &o.change.Status, &o.change.Source, &o.change.ConsentDate, &o.attempts)
		o.change.ConsentDate = o.change.ConsentDate.In(istanbul)
		return o, err
	})
	if err != nil {
		return false, fmt.Errorf("iys push: read the outbox: %w", err)
	}
	due, twins := foldTwins(due)
	withTwins := func(ids ...int64) []int64 {
		for _, id := range slices.Clone(ids) {
			for _, t := range twins[id] {
				ids = append(ids, t.id)
			}
		}
		return ids
	}
	if len(due) < opts.BatchFrom {
		for _, o := range due {
			res, err := c.AddConsent(ctx, o.change)
			switch code := apiCode(err); {
			case err == nil:
				rep.Sent++
				rep.Accepted++
				err = finish(ctx, pool, o, withTwins(o.id), OutboxAccepted, res.TransactionID, "", "")
			case code == codeAlready:
				rep.Sent++
				rep.Already++
				err = finish(ctx, pool, o, withTwins(o.id), OutboxAlready, "", code, err.Error())
			case IsAuth(err) || IsAccount(err):
				return false, fmt.Errorf("iys push: %w", err)
			case IsRetryable(err) || !isAPIError(err): // a 429, a 5xx, or no answer
				rep.Retrying++
				if err := retryLater(ctx, pool, withTwins(o.id), o.attempts, err); err != nil {
					return false, err
				}
				if IsRateLimited(err) {
					return false, nil // the rest waits for the next run
				}
				continue
			default:
				rep.Sent++
				rep.Refused++
				rep.RefusedCodes[code]++
				err = finish(ctx, pool, o, withTwins(o.id), OutboxRefused, "", code, err.Error())
			}
			if err != nil {
				return false, err
			}
		}
		return false, nil
	}
	batched := false
	for len(due) > 0 {
		// A batch may not hold a key twice (H194): a key waiting both without a brand and under the
		// client's goes in the next batch.
		var batch, rest []outboxRow
		seen := map[[3]string]bool{}
		for _, o := range due {
			k := [3]string{o.change.RecipientType, o.change.Type, o.change.Recipient}
			if seen[k] || len(batch) == MaxAddBatch {
				rest = append(rest, o)
				continue
			}
			seen[k] = true
			batch = append(batch, o)
		}
		due = rest
		changes := make([]ConsentChange, len(batch))
		var ids []int64
		var dates []time.Time
		var items []int32
		for i, o := range batch {
			changes[i] = o.change
			// A row's twins take its place in the batch: the result of its item is theirs.
			for _, r := range append([]outboxRow{o}, twins[o.id]...) {
				ids, dates, items = append(ids, r.id), append(dates, r.change.ConsentDate), append(items, int32(i))
			}
		}
		id, err := c.AddConsents(ctx, changes)
		if err != nil {
			if IsAuth(err) || IsAccount(err) {
				return batched, fmt.Errorf("iys push: %w", err)
			}
			rep.Retrying += len(batch)
			if err := retryLater(ctx, pool, ids, batch[0].attempts, err); err != nil {
				return batched, err
			}
			if IsRateLimited(err) || ctx.Err() != nil {
				return batched, nil
			}
			continue
		}
		rep.Sent += len(batch)
		batched = true
		// A row a newer refusal moved to its date while the batch was sent stays waiting: the batch
		// carried the older date, and the row goes again with its own (see finish).
		if _, err := pool.Exec(ctx, `
			UPDATE iys_outbox o SET state = 'sent', request_id = $2, item_index = b.item, sent_at = now(), attempts = attempts + 1
			FROM unnest($1::bigint[], $3::timestamptz[], $4::int[]) AS b(id, date, item)
			WHERE o.id = b.id AND o.state = 'waiting' AND o.consent_date = b.date`, ids, id, dates, items); err != nil {
			return batched, fmt.Errorf("iys push: record batch %s: %w", id, err)
		}
	}
	return batched, nil
}

// pollResults asks for the results of the batches sent before sentBefore and records those that are in.
func pollResults(ctx context.Context, pool *pgxpool.Pool, c *Client, sentBefore time.Time, rep *PushReport) error {
	rows, err := pool.Query(ctx, `SELECT DISTINCT request_id FROM iys_outbox WHERE state = 'sent' AND sent_at <= $1 AND brand_code IN ('', $2)`, sentBefore, c.BrandCode())
	if err != nil {
		return fmt.Errorf("iys push: read the batches sent: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("iys push: read the batches sent: %w", err)
	}
	for _, id := range ids {
		items, _, err := c.AddResults(ctx, id)
		if err != nil {
			if IsAuth(err) || IsAccount(err) {
				return fmt.Errorf("iys push: %w", err)
			}
			if IsRateLimited(err) {
				return nil
			}
			continue // asked again at the next run
		}
		for _, it := range items {
			var err error
			code := ""
			if it.Err != nil {
				code = it.Err.Code
			}
			switch {
			case it.Status == "success":
				rep.Accepted++
				err = finishItem(ctx, pool, id, it.Index, OutboxAccepted, it.TransactionID, "", "")
			case it.Status == "failure" && code == codeAlready:
				rep.Already++
				err = finishItem(ctx, pool, id, it.Index, OutboxAlready, "", code, it.Err.Error())
			case it.Status == "failure":
				rep.Refused++
				rep.RefusedCodes[code]++
				msg := "refused"
				if it.Err != nil {
					msg = it.Err.Error()
				}
				err = finishItem(ctx, pool, id, it.Index, OutboxRefused, "", code, msg)
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

func isAPIError(err error) bool {
	var ae *APIError
	return errors.As(err, &ae)
}

func apiCode(err error) string {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae.Code
	}
	return ""
}

// foldTwins keeps, of the rows due that carry the same change (a refusal of an address with consents both
// without a brand and under the client's waits in a row for each, and both go under the client's brand),
// the first, and returns the others by the id of the row they follow: the change goes to İYS once, and
// its twins take its answer. Before, İYS got each such refusal twice.
func foldTwins(due []outboxRow) ([]outboxRow, map[int64][]outboxRow) {
	type key struct {
		recipient, typ, rtype, status, source string
		date                                  int64
	}
	first := map[key]int64{}
	var twins map[int64][]outboxRow
	kept := due[:0:0]
	for _, o := range due {
		k := key{o.change.Recipient, o.change.Type, o.change.RecipientType, o.change.Status, o.change.Source, o.change.ConsentDate.UnixNano()}
		if id, ok := first[k]; ok {
			if twins == nil {
				twins = map[int64][]outboxRow{}
			}
			twins[id] = append(twins[id], o)
			continue
		}
		first[k] = o.id
		kept = append(kept, o)
	}
	return kept, twins
}

// finish records İYS's answer to o's RET in the rows of ids (o's and its twins', foldTwins). Only in a
// row that still waits with the date that was sent: a newer refusal may have moved it to its own date
// meanwhile (outboxOneWaitingSQL), and the answer is not that refusal's; the row then waits for the next
// run.
func finish(ctx context.Context, pool *pgxpool.Pool, o outboxRow, ids []int64, state, txn, code, msg string) error {
	_, err := pool.Exec(ctx, `UPDATE iys_outbox SET state = $2, transaction_id = NULLIF($3, ''), error_code = NULLIF($4, ''), error = NULLIF($5, ''),
		attempts = attempts + 1, sent_at = coalesce(sent_at, now()), done_at = now()
		WHERE id = ANY($1) AND state = 'waiting' AND consent_date = $6`, ids, state, txn, code, msg, o.change.ConsentDate)
	if err != nil {
		return fmt.Errorf("iys push: record the answer: %w", err)
	}
	return nil
}

func finishItem(ctx context.Context, pool *pgxpool.Pool, request string, index int, state, txn, code, msg string) error {
	_, err := pool.Exec(ctx, `UPDATE iys_outbox SET state = $3, transaction_id = NULLIF($4, ''), error_code = NULLIF($5, ''), error = NULLIF($6, ''), done_at = now()
		WHERE request_id = $1 AND item_index = $2 AND state = 'sent'`, request, index, state, txn, code, msg)
	if err != nil {
		return fmt.Errorf("iys push: record the result of batch %s: %w", request, err)
	}
	return nil
}

func retryLater(ctx context.Context, pool *pgxpool.Pool, ids []int64, attempts int, cause error) error {
	wait := backoff(attempts)
	var ae *APIError
	if errors.As(cause, &ae) && ae.RetryAfter > wait {
		wait = ae.RetryAfter
	}
	_, err := pool.Exec(context.WithoutCancel(ctx), `UPDATE iys_outbox SET attempts = attempts + 1, next_at = now() + $2::interval, error = $3, error_code = NULLIF($4, '')
		WHERE id = ANY($1)`, ids, fmt.Sprintf("%d milliseconds", wait.Milliseconds()), cause.Error(), apiCode(cause))
	if err != nil {
		return fmt.Errorf("iys push: put back for a retry: %w", err)
	}
	return nil
}

// OutboxSummary is where the outbox stands.
type OutboxSummary struct {
	// States counts the RETs by state (every state present, 0 included).
	States map[string]int `json:"states"`
	// WaitingByBrand counts the RETs waiting or sent by brand code ("" for those recorded without one).
	WaitingByBrand map[string]int `json:"waiting_by_brand"`
	// Overdue is the number not registered two business days after the refusal; Oldest the refusal time
	// of the oldest not registered (nil when none is).
	Overdue int        `json:"overdue"`
	Oldest  *time.Time `json:"oldest_waiting,omitempty"`
}

// Outbox summarises the İYS outbox as of now.
func Outbox(ctx context.Context, pool *pgxpool.Pool, now time.Time) (OutboxSummary, error) {
	s := OutboxSummary{States: map[string]int{}, WaitingByBrand: map[string]int{}}
	for _, st := range []string{OutboxWaiting, OutboxSent, OutboxAccepted, OutboxAlready, OutboxRefused} {
		s.States[st] = 0
	}
	rows, err := pool.Query(ctx, `SELECT state, brand_code, count(*), count(*) FILTER (WHERE due_at < $1), min(consent_date)
		FROM iys_outbox GROUP BY state, brand_code`, now)
	if err != nil {
		return s, fmt.Errorf("iys outbox: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var state, brand string
		var n, late int
		var oldest time.Time
		if err := rows.Scan(&state, &brand, &n, &late, &oldest); err != nil {
			return s, fmt.Errorf("iys outbox: %w", err)
		}
		s.States[state] += n
		if state == OutboxWaiting || state == OutboxSent {
			s.WaitingByBrand[brand] += n
			s.Overdue += late
			if s.Oldest == nil || oldest.Before(*s.Oldest) {
				o := oldest
				s.Oldest = &o
			}
		}
	}
	return s, rows.Err()
}

// OutboxItem is one RET of the outbox, for `iys outbox`.
type OutboxItem struct {
	ID            int64      `json:"id"`
	State         string     `json:"state"`
	Brand         string     `json:"brand_code"`
	Recipient     string     `json:"recipient"`
	Type          string     `json:"type"`
	RecipientType string     `json:"recipient_type"`
	Source        string     `json:"source"`
	RefusedAt     time.Time  `json:"refused_at"`
	Via           string     `json:"via"`
	Evidence      string     `json:"evidence"`
	Attempts      int        `json:"attempts"`
	NextAt        *time.Time `json:"next_at,omitempty"`
	RequestID     string     `json:"request_id,omitempty"`
	TransactionID string     `json:"transaction_id,omitempty"`
	ErrorCode     string     `json:"error_code,omitempty"`
	Error         string     `json:"error,omitempty"`
	DueAt         time.Time  `json:"due_at"`
	Overdue       bool       `json:"overdue"`
}

// OutboxItems lists the outbox, newest first, at most limit rows (0: all), of the given states (none:
// every state).
func OutboxItems(ctx context.Context, pool *pgxpool.Pool, now time.Time, limit int, states ...string) ([]OutboxItem, error) {
	if limit <= 0 {
		limit = 1 << 30
	}
	rows, err := pool.Query(ctx, `
		SELECT o.id, o.state, o.brand_code, o.recipient, o.type, o.recipient_type, o.source, o.consent_date, r.via, r.evidence,
		       o.attempts, CASE WHEN o.state = 'waiting' THEN o.next_at END, coalesce(o.request_id, ''), coalesce(o.transaction_id, ''),
		       coalesce(o.error_code, ''), coalesce(o.error, ''), o.due_at, o.state IN ('waiting', 'sent') AND o.due_at < $1
		FROM iys_outbox o JOIN refusals r ON r.id = o.refusal_id
		WHERE coalesce(cardinality($2::text[]), 0) = 0 OR o.state = ANY($2)
		ORDER BY o.id DESC LIMIT $3`, now, states, limit)
	if err != nil {
		return nil, fmt.Errorf("iys outbox: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (OutboxItem, error) {
		var it OutboxItem
		err := row.Scan(&it.ID, &it.State, &it.Brand, &it.Recipient, &it.Type, &it.RecipientType, &it.Source, &it.RefusedAt, &it.Via, &it.Evidence,
			&it.Attempts, &it.NextAt, &it.RequestID, &it.TransactionID, &it.ErrorCode, &it.Error, &it.DueAt, &it.Overdue)
		return it, err
	})
}
