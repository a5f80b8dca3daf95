package campaign

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/campaignctl/campaignctl/internal/pgtext"
	"github.com/campaignctl/campaignctl/iys"
)

// Delivery statuses, from the providers' receipts.
const (
	DeliveryProcessed   = "processed"
	DeliverySent        = "sent"
	DeliveryDeferred    = "deferred"
	DeliveryDelivered   = "delivered"
	DeliveryUndelivered = "undelivered"
	DeliveryFailed      = "failed"
	DeliveryBounced     = "bounced"
	DeliveryDropped     = "dropped"
)

// deliveryRank is the SQL expression of how far the receipt status in col went: accepted (processed,
// sent), held back for now (deferred), or final (delivered, bounced, ...). Receipts arrive out of order, and
// a recipient's delivery never moves back to a lower rank.
func deliveryRank(col string) string {
	return "CASE " + col + " WHEN " + quoteLiteral(DeliveryProcessed) + " THEN 1 WHEN " + quoteLiteral(DeliverySent) +
		" THEN 1 WHEN " + quoteLiteral(DeliveryDeferred) + " THEN 2 ELSE 3 END"
}

// sqlUndelivered lists, as SQL literals, the final receipt statuses of a message that did not arrive.
var sqlUndelivered = strings.Join([]string{quoteLiteral(DeliveryUndelivered), quoteLiteral(DeliveryFailed),
	quoteLiteral(DeliveryBounced), quoteLiteral(DeliveryDropped)}, ", ")

// Delivery is one receipt: what happened to a message after the provider accepted it.
type Delivery struct {
	Provider string
	// MessageID is the provider's message ID (Twilio SID, SendGrid message ID); CampaignID and UserID name
	// the recipient directly when the receipt carries them (0 and "" when not).
	MessageID  string
	CampaignID int64
	UserID     string
	// CampaignNonce is the nonce of the campaign the send was for, when the receipt carries it (see
	// CampaignNonce): a receipt of a campaign that had the same ID (the engine database re-created, another
	// engine on the same provider account) names no recipient of this one. "" when absent (a send of an
	// earlier version): the address still has to match.
	CampaignNonce string
	// Address is the recipient the receipt says the message was for ("" when it names none): a receipt
	// that names its recipient by campaign and user applies only to a recipient with this address, so a
	// stray one (a campaign ID of a database since re-created, a forged callback) cannot make a recipient
	// who was never sent look sent.
	Address string
	Status  string
	Error   string
	// EventID is the provider's ID of the receipt itself, to apply each once ("" when none).
	EventID string
	At      time.Time
}

// DeliveriesApplied is what RecordDeliveries did with a list of receipts.
type DeliveriesApplied struct {
	// Changed is how many recipients the receipts changed.
	Changed int64
	// Unmatched holds the positions (in the list given) of the receipts that name no recipient: no
	// campaign and user of this engine's (or not at the receipt's address), or, for a receipt keyed by
	// message ID without an event ID, no message it sent; whether delivered for the first time or again.
	Unmatched []int
	// Early holds the positions of the receipts keyed by message ID that no recorded send carries yet:
	// kept, and applied once the worker records the send (RetryEarlyReceipts), or dropped as strays after
	// EarlyReceiptsKept.
	Early []int
	// SecondSends counts the messages the receipts proved a second time to recipients already sent
	// (SecondSendByReceipt), audited now.
	SecondSends int64
}

// SecondSendByReceipt is the audit reason of a message a receipt proves the provider accepted for a
// recipient sent again by `resume --resend-unknown`, under another message ID: its first message, whose
// answer was lost, went too.
const SecondSendByReceipt = "a second message: a receipt shows the provider accepted it for a recipient sent again under another message ID (resume --resend-unknown, the first message's receipt late)"

// RecordDeliveries applies receipts in one statement and returns how many recipients they changed
// (DeliveriesApplied.Changed). A
// receipt is applied once (by its event ID), never moves a recipient back from a final status (delivered,
// bounced, ...) to an intermediate one, and changes nothing when it names another message ID than the one
// recorded for the recipient. Any receipt proves that the provider accepted the message: a recipient
// recorded unknown becomes sent. A receipt may also arrive before the worker has written the send's
// outcome (the recipient is still pending): its delivery and message ID are kept, and whatever outcome
// the worker writes later (an unknown after a held answer, say), the recipient is recorded sent (see
// Record), is never resent by `resume --resend-unknown`, and keeps its code. It also says which receipts
// named no recipient (DeliveriesApplied.Unmatched).
func (s *Store) RecordDeliveries(ctx context.Context, ds []Delivery) (DeliveriesApplied, error) {
	var res DeliveriesApplied
	if len(ds) == 0 {
		return res, nil
	}
	n := len(ds)
	prov, msg, user, st, errs, ev, addr := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	camp, created := make([]int64, n), make([]int64, n)
	at := make([]time.Time, n)
	for i, d := range ds {
		prov[i], msg[i], camp[i], user[i], st[i], errs[i], ev[i], at[i], addr[i] = d.Provider, d.MessageID, d.CampaignID, d.UserID, d.Status, d.Error, d.EventID, d.At, d.Address
		created[i] = NonceMicros(d.CampaignNonce)
		if at[i].IsZero() {
			at[i] = time.Now()
		}
	}
	// Provider text: a NUL or invalid UTF-8 in one receipt would fail the statement, and every receipt
	// written with it, on every repeat.
	for _, ss := range [][]string{prov, msg, user, st, errs, ev, addr} {
		pgtext.CleanAll(ss)
	}
	var unmatched, early []int32
	err := s.pool.QueryRow(ctx, recordDeliveriesSQL, prov, msg, camp, user, st, errs, ev, at, addr, created).Scan(&res.Changed, &unmatched, &early, &res.SecondSends)
	if err != nil {
		return DeliveriesApplied{}, fmt.Errorf("record delivery receipts: %w", err)
	}
	for _, i := range unmatched {
		res.Unmatched = append(res.Unmatched, int(i)-1)
	}
	for _, i := range early {
		res.Early = append(res.Early, int(i)-1)
	}
	return res, nil
}

// closedAfterUnknown is the SQL condition that recipient r was closed without a send (skipped by a cancel
// or the cap, failed) after it had been unknown: a resend of it did not go (`resume --resend-unknown`),
// and its first message, whose answer was lost, may have. It kept its code (everUnknown). A receipt of
// that first message proves it went: the recipient was sent.
const closedAfterUnknown = `(r.status IN (` + sqlSkipped + `, ` + sqlFailed + `) AND r.ever_unknown)`

// acceptedBecause is the SQL text of the reason of a recipient that evidence proves the provider accepted:
// the delivery status status (SQL) of a receipt from via (SQL: a provider's name, or one_click for the
// message's unsubscribe link used).
func acceptedBecause(via, status string) string {
	return `'accepted by the provider (' || CASE WHEN ` + via + ` = ` + quoteLiteral(iys.ViaOneClick) +
		` THEN 'the recipient used its unsubscribe link' ELSE 'its receipt says ' || ` + status + ` END || ')'`
}

// provedSent is the SQL condition that a receipt proves recipient r sent where its row does not say so.
const provedSent = `(r.status = ` + sqlUnknown + ` OR ` + closedAfterUnknown + `)`

// recordDeliveriesSQL is RecordDeliveries' statement.
var recordDeliveriesSQL = `
		WITH d AS (
			SELECT *, ` + deliveryRank("status") + ` AS rank
			FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::text[], $8::timestamptz[], $9::text[], $10::bigint[])
				WITH ORDINALITY AS d(provider, msgid, campaign_id, user_id, status, error, event_id, at, address, created_us, ord)
		), todo AS (
			SELECT d.* FROM d
		), keyed0 AS (
			-- Two joins rather than one with OR, so that each uses its index: the primary key, or the audit
			-- entry that recorded the message ID (the recipient rows keep no index on it, see migration 0012)
			-- of a send whose receipts do not name their recipient (the others name it, and only theirs
			-- are indexed: migration 0014), then the primary key.
			-- Each a lookup per receipt (OFFSET 0 keeps the subquery a lookup): keyed is read twice, so it is
			-- planned on its own, where a join could hash the whole recipients table.
			SELECT d.ord, r.campaign_id, r.user_id, r.was, r.ever_unknown, r.rid, d.msgid, d.status, d.error, d.at, d.rank
			FROM todo d JOIN LATERAL (
				SELECT r.campaign_id, r.user_id, r.status AS was, r.ever_unknown, r.provider_message_id AS rid FROM campaign_recipients r
				WHERE r.campaign_id = d.campaign_id AND r.user_id = d.user_id
				  -- Named by campaign and user: only for that recipient's address (the message ID branch
				  -- below matches the message ID the send recorded instead).
				  AND (d.address = '' OR lower(d.address) = lower(r.address))
				  -- Named with its campaign's nonce (its creation time): only that campaign's, not another
				  -- that had the same ID (a database re-created, another engine on the provider account).
				  AND (d.created_us = 0 OR d.created_us = (SELECT ` + createdMicros("c") + `
					FROM campaigns c WHERE c.id = r.campaign_id))
				OFFSET 0) r ON true
			WHERE d.campaign_id > 0
			UNION ALL
			SELECT d.ord, r.campaign_id, r.user_id, r.status AS was, r.ever_unknown, r.provider_message_id AS rid, d.msgid, d.status, d.error, d.at, d.rank
			FROM todo d
			JOIN LATERAL (SELECT DISTINCT l.campaign_id, l.user_id FROM send_log l
				WHERE hashtext(l.provider_message_id) = hashtext(d.msgid) AND l.provider_message_id IS NOT NULL
				  AND NOT l.receipt_keyed AND l.provider_message_id = d.msgid) l ON true
			JOIN campaign_recipients r ON r.campaign_id = l.campaign_id AND r.user_id = l.user_id AND r.provider_message_id = d.msgid
			WHERE d.campaign_id = 0 AND d.msgid <> ''
		), fresh AS (
			-- Every receipt is matched (so that a stray one is told apart even when delivered again); only
			-- the fresh ones (an event not seen before) are applied. Only a receipt that names a recipient
			-- counts as seen: one that came before its send was recorded is applied when it comes again
			-- (early below, or the provider's repeat).
			INSERT INTO receipt_events (provider, event_id)
			SELECT DISTINCT d.provider, d.event_id FROM d
			WHERE d.event_id <> '' AND d.ord IN (SELECT ord FROM keyed0)
			ON CONFLICT DO NOTHING
			RETURNING provider, event_id
		), keyed AS (
			-- A join, not EXISTS in the select list: that would scan fresh once per receipt.
			SELECT k.*, d.event_id = '' OR f.event_id IS NOT NULL AS new, d.provider AS via
			FROM keyed0 k JOIN d ON d.ord = k.ord
			LEFT JOIN fresh f ON f.provider = d.provider AND f.event_id = d.event_id
		), unkeyed AS (
			-- The receipts that named no recipient: kept when they name only a message ID (with an event ID),
			-- which no recorded send carries yet, to be applied again once the worker has recorded its send
			-- (RetryEarlyReceipts); the others are strays.
			SELECT d.*, (d.campaign_id = 0 AND d.msgid <> '' AND d.event_id <> '') AS kept
			FROM d WHERE d.ord NOT IN (SELECT ord FROM keyed0)
		), early AS (
			INSERT INTO early_receipts (provider, event_id, message_id, status, error, at)
			SELECT DISTINCT ON (u.provider, u.event_id) u.provider, u.event_id, u.msgid, u.status, coalesce(u.error, ''), u.at
			FROM unkeyed u WHERE u.kept
			ON CONFLICT DO NOTHING
		), best AS (
			SELECT DISTINCT ON (campaign_id, user_id) * FROM keyed WHERE new ORDER BY campaign_id, user_id, rank DESC, at DESC
		), locked AS (
			-- The recipients' rows as they are now, locked for the update: keyed0 read them as the statement
			-- began, and the worker's outcome may have committed since (sent, with its audit entry). Taken
			-- from that reading, a recipient was still pending, and the send was audited a second time (log).
			SELECT r.campaign_id, r.user_id, r.status AS was
			FROM campaign_recipients r JOIN best b ON r.campaign_id = b.campaign_id AND r.user_id = b.user_id
			FOR UPDATE OF r
		), upd AS (
			UPDATE campaign_recipients r SET
				delivery = b.status, delivery_error = NULLIF(b.error, ''), delivery_at = b.at, delivery_via = NULLIF(b.via, ''),
				status = CASE WHEN ` + provedSent + ` THEN ` + sqlSent + ` ELSE r.status END,
				provider_message_id = coalesce(r.provider_message_id, NULLIF(b.msgid, '')),
				sent_at = coalesce(r.sent_at, CASE WHEN ` + provedSent + ` THEN b.at END),
				-- An unknown proved sent says so, as one recorded after its receipt does (Record); what the
				-- worker saw stays in last_error.
				reason = CASE WHEN ` + provedSent + ` THEN ` + acceptedBecause("b.via", "b.status") + ` ELSE r.reason END,
				last_error = CASE WHEN ` + provedSent + ` THEN coalesce(r.last_error, r.reason) ELSE r.last_error END,
				updated_at = now()
			FROM best b JOIN locked l ON l.campaign_id = b.campaign_id AND l.user_id = b.user_id
			WHERE r.campaign_id = b.campaign_id AND r.user_id = b.user_id
			  AND (r.status IN (` + sqlPending + `, ` + sqlSent + `, ` + sqlUnknown + `) OR ` + closedAfterUnknown + `)
			  -- A receipt for another message than the one recorded is not about this send.
			  AND (r.provider_message_id IS NULL OR b.msgid = '' OR r.provider_message_id = b.msgid)
			  AND (r.delivery IS NULL
			       OR b.rank > ` + deliveryRank("r.delivery") + `
			       OR (b.rank = ` + deliveryRank("r.delivery") + `
			           AND b.at >= r.delivery_at))
			RETURNING r.campaign_id, r.user_id, l.was, r.status, r.provider_message_id, b.status AS delivery, r.address, b.error, b.via
		), invalid AS (
			-- An e-mail address the receiving server refused (a bounce; a "blocked" one is about the sender,
			-- and its error says so) is condemned, as an unregistered push token is: later launches exclude
			-- it rather than spend a code on a message the provider will drop.
			INSERT INTO invalid_addresses (channel, address, reason)
			SELECT DISTINCT ON (upd.address) c.channel, upd.address, 'bounced: ' || coalesce(upd.error, '')
			FROM upd JOIN campaigns c ON c.id = upd.campaign_id
			WHERE upd.delivery = ` + quoteLiteral(DeliveryBounced) + ` AND c.channel = ` + quoteLiteral(string(ChannelEmail)) + `
			  AND coalesce(upd.error, '') NOT LIKE 'blocked:%'
			ON CONFLICT (channel, address) DO UPDATE SET reason = EXCLUDED.reason, at = now()
		), log AS (
			-- A recipient recorded unknown that a receipt proves sent: the transition is audited like the
			-- others (and a later launch's frequency cap finds the send there).
			INSERT INTO send_log (campaign_id, user_id, status, reason, provider_message_id, channel, template_hash)
			SELECT upd.campaign_id, upd.user_id, upd.status, ` + acceptedBecause("upd.via", "upd.delivery") + `,
				upd.provider_message_id, c.channel, c.template_hash
			FROM upd JOIN campaigns c ON c.id = upd.campaign_id
			WHERE upd.was <> ` + sqlSent + ` AND upd.status = ` + sqlSent + `
		), second AS (
			-- A receipt for another message than the one a recipient sent again records (the resend's, under
			-- its own message ID): the provider accepted the first message too, whose answer was lost, and the
			-- recipient got two. Audited once a message (the message-ID index finds an entry made already:
			-- these are not receipt_keyed).
			INSERT INTO send_log (campaign_id, user_id, status, reason, provider_message_id, channel, template_hash)
			SELECT DISTINCT ON (k.campaign_id, k.user_id, k.msgid) k.campaign_id, k.user_id, ` + sqlSent + `, ` + quoteLiteral(SecondSendByReceipt) + `,
				k.msgid, c.channel, c.template_hash
			FROM keyed k JOIN campaigns c ON c.id = k.campaign_id
			WHERE k.new AND k.msgid <> '' AND k.was = ` + sqlSent + ` AND k.ever_unknown
			  AND k.rid IS NOT NULL AND k.rid <> k.msgid
			  AND NOT EXISTS (SELECT 1 FROM send_log l
				WHERE hashtext(l.provider_message_id) = hashtext(k.msgid) AND l.provider_message_id IS NOT NULL
				  AND NOT l.receipt_keyed AND l.provider_message_id = k.msgid
				  AND l.campaign_id = k.campaign_id AND l.user_id = k.user_id)
			RETURNING 1
		)
		SELECT (SELECT count(*) FROM upd),
			-- The strays (a callback that names nobody of ours), delivered again or not, and those kept.
			array(SELECT ord::int FROM unkeyed WHERE NOT kept ORDER BY ord),
			array(SELECT ord::int FROM unkeyed WHERE kept ORDER BY ord),
			(SELECT count(*) FROM second)`

// EarlyReceiptsKept is how long RetryEarlyReceipts keeps a receipt that came before its send was
// recorded: longer than a worker holds its chunk's outcomes while Postgres is away (worker --record-wait,
// 2 minutes by default) and a lease with them.
const EarlyReceiptsKept = 15 * time.Minute

// EarlyReceipts is what RetryEarlyReceipts did.
type EarlyReceipts struct {
	// Applied counts the receipts that now named a recorded send (and were applied, unless seen already).
	Applied int
	// Waiting counts those tried again that still named no recipient (their send's row not written yet).
	Waiting int
	// Dropped counts those older than the age given, which no recorded send ever carried: strays.
	Dropped int
}

// RetryEarlyReceipts applies again, with RecordDeliveries, up to limit of the receipts that named only a
// message ID no recorded send carried when they came (early_receipts, oldest first): the worker may have
// recorded the send since. Those applied are forgotten, and so are those older than maxAge.
func (s *Store) RetryEarlyReceipts(ctx context.Context, limit int, maxAge time.Duration) (EarlyReceipts, error) {
	var res EarlyReceipts
	tag, err := s.pool.Exec(ctx, `DELETE FROM early_receipts WHERE received_at < now() - $1 * interval '1 millisecond'`, maxAge.Milliseconds())
	if err != nil {
		return res, fmt.Errorf("early receipts: %w", err)
	}
	res.Dropped = int(tag.RowsAffected())
	// Only those whose message ID a recorded send now carries (through the audit's message-ID index, as
	// RecordDeliveries finds them): receipts of messages some other sender on the provider account sent
	// wait here too, and are not tried again every time.
	rows, err := s.pool.Query(ctx, `SELECT e.provider, e.event_id, e.message_id, e.status, e.error, e.at FROM early_receipts e
		WHERE EXISTS (SELECT 1 FROM send_log l WHERE hashtext(l.provider_message_id) = hashtext(e.message_id)
			AND l.provider_message_id IS NOT NULL AND NOT l.receipt_keyed AND l.provider_message_id = e.message_id)
		ORDER BY e.received_at LIMIT $1`, limit)
	if err != nil {
		return res, fmt.Errorf("early receipts: %w", err)
	}
	ds, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Delivery, error) {
		var d Delivery
		return d, row.Scan(&d.Provider, &d.EventID, &d.MessageID, &d.Status, &d.Error, &d.At)
	})
	if err != nil || len(ds) == 0 {
		return res, err
	}
	applied, err := s.RecordDeliveries(ctx, ds)
	if err != nil {
		return res, err
	}
	res.Waiting = len(applied.Unmatched) + len(applied.Early)
	res.Applied = len(ds) - res.Waiting
	unmatched := map[int]bool{}
	for _, i := range slices.Concat(applied.Unmatched, applied.Early) {
		unmatched[i] = true
	}
	var provs, events []string
	for i, d := range ds {
		if !unmatched[i] {
			provs, events = append(provs, d.Provider), append(events, d.EventID)
		}
	}
	if len(provs) > 0 {
		if _, err := s.pool.Exec(ctx, `DELETE FROM early_receipts e USING unnest($1::text[], $2::text[]) AS x(provider, event_id)
			WHERE e.provider = x.provider AND e.event_id = x.event_id`, provs, events); err != nil {
			return res, fmt.Errorf("early receipts: %w", err)
		}
	}
	return res, nil
}

// DeliveryCounts returns how many of the campaign's sent recipients the receipts say were delivered, and
// how many were not (undelivered, failed, bounced, dropped). A receipt that came before its send was
// recorded (the row still pending, or unknown) counts once it is: delivered never exceeds sent.
func (s *Store) DeliveryCounts(ctx context.Context, id int64) (delivered, undelivered int64, err error) {
	err = s.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE delivery = `+quoteLiteral(DeliveryDelivered)+`),
			count(*) FILTER (WHERE delivery IN (`+sqlUndelivered+`))
		FROM campaign_recipients WHERE campaign_id = $1 AND delivery IS NOT NULL AND status = 'sent'`, id).Scan(&delivered, &undelivered)
	if err != nil {
		return 0, 0, fmt.Errorf("delivery counts: %w", err)
	}
	return delivered, undelivered, nil
}
