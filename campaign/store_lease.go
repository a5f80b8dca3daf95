package campaign

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Lease identifies one run of one batch: the batch row carries its token, and the users of the chunk it
// is sending, until their outcomes are recorded or the run ends (see migrations/0005_batch_leases.sql).
type Lease struct {
	Batch int
	// Token is random per batch run.
	Token string
	// Epoch is the Redis epoch the run's claims are taken under.
	Epoch string
	// TTL is how long a lease lasts without renewal; it must exceed the provider's timeout.
	TTL time.Duration
	// AnyState leases whatever the campaign's state (the sweeper, which settles and sends nothing).
	AnyState bool
	// Holder is the key of the advisory lock the run's worker process holds while it lives (GoneHolders);
	// 0 for none.
	Holder int64
	// Gone are holders whose processes died: a lease of theirs is free however long it still runs.
	Gone []int64
	// Fenced is the token of another run's lease that the caller has fenced in Redis (Chunk.Fence): only
	// such a lease is taken over. A lease is never taken from a run that may still claim.
	Fenced string
	// HolderGrace keeps a lease that ran out from being taken while its holder's lock is held by a
	// session younger than this: the holder's process lives and has just taken its lock again (Postgres
	// restarted or failed over, or its connection broke), so the lease ran out while nobody could renew
	// it, and its run renews it or records its chunk within seconds (worker.Handler's LivenessGrace).
	HolderGrace time.Duration
}

// Chunk is what LeaseChunk found and took.
type Chunk struct {
	// State is the campaign's state now.
	State State
	// Leased holds the users of the chunk that are still pending, now held by the run, and, when the run
	// took the batch over from a run that died, that run's chunk in hand. The value is true for a user of
	// a chunk taken over from a run that died under another Redis epoch: a missing claim proves nothing for
	// it.
	Leased map[string]bool
	// Inherited lists the leased users that were the chunk in hand of a run that died, or of this run's
	// own lease (a crash of Postgres may have taken back outcomes it recorded): until the run reads their
	// claims, it does not know whether they were sent, and they stay in its chunk in hand.
	Inherited []string
	// TookOver says the batch was leased from another run's lease (expired, or its holder gone): a run
	// that died. False when the batch was free or this run's own, or was not leased.
	TookOver bool
	// PrevToken is the token of the lease taken over (when TookOver), fenced by the caller before.
	PrevToken string
	// Fence is set when the batch is held by another run's lease that may be taken over (run out, or its
	// holder gone), but that lease's token is not Lease.Fenced: nothing was leased. The caller fences the
	// token in Redis (its run may be paused, not dead, and claim again later) and leases again with
	// Lease.Fenced set to it. Were the token fenced after the takeover, a failure in between would leave it
	// unfenced and forgotten.
	Fence string
	// Accepted holds the leased users whose delivery receipt arrived while they were pending (a receipt
	// for a send whose answer was lost, before `resume --resend-unknown` made them pending again): the
	// provider accepted their message, so they are recorded sent, never sent again.
	Accepted map[string]bool
	// Busy counts pending users of the chunk held by another run's live lease.
	Busy int
	// Consent holds the addresses whose recipients the campaign's consent rule lets be sent right now
	// (consent.go): İYS ONAY for the channel's type, the campaign's recipient type and brand, or the
	// planned opt-in on a channel without an İYS type, or any recipient of a transactional message.
	Consent map[string]bool
	// ConsentOf maps the users whose addresses are in Consent to those addresses, for a campaign whose
	// opt-ins are read again from the audience at send time (Campaign.ReadsOptIns); nil otherwise.
	ConsentOf map[string]string
	// Snapshots holds, per leased user with a consent record, that record as read now, for the audit of
	// its outcome.
	Snapshots map[string]ConsentRecord
}

// LeaseChunk reads the campaign's state and the consents of the users' addresses, leases the batch for the run (unless
// another run holds it under a live lease), and makes users (those still pending) its chunk in hand. It
// runs in one round trip: the batch row is locked first, so what the lease reads is what a concurrent
// cancel left. The batch is leased only while the campaign is running or cancelled (a cancelled campaign's
// batches are closed under leases too); in any other state nothing is leased and the caller waits.
func (s *Store) LeaseChunk(ctx context.Context, c *Campaign, users []string, l Lease) (Chunk, error) {
	ch := Chunk{Leased: make(map[string]bool, len(users)), Consent: make(map[string]bool, len(users)), Accepted: map[string]bool{}}
	var (
		leased, takeover, otherEpoch bool
		fence                        bool
		prevToken                    string
		oldUsers, pend, ok, okUsers  []string
		accepted                     []string
		suspects                     []string
		cStatus, cSource, cTxn       []string
		cDate, cSynced               []pgtype.Timestamptz
	)
	args := params{c.ID, l.Batch, l.Token, l.Epoch, users, l.TTL.Milliseconds(), l.AnyState, l.Holder, l.Gone, l.Fenced, l.HolderGrace.Milliseconds()}
	rule := c.consentRule()
	// The addresses the rule lets be sent, and, where the opt-ins are read again from the audience
	// (Campaign.ReadsOptIns), their users, in the same order.
	okSQL := `array(SELECT address FROM pend WHERE ok), '{}'::text[]`
	if rule.readsOptIn() {
		okSQL = `array(SELECT address FROM pend WHERE ok ORDER BY user_id), array(SELECT user_id FROM pend WHERE ok ORDER BY user_id)`
	}
	// The statement is built first: the consent rule's values become parameters as it is.
	sql := `
		WITH st AS (
			SELECT coalesce((SELECT state FROM campaigns WHERE id = $1), ` + sqlStateCancelled + `) AS state
		), b AS (
			SELECT lease_token, lease_until, lease_epoch, lease_users, lease_holder, suspect_users FROM campaign_batches WHERE campaign_id = $1 AND batch = $2
		), may0 AS (
			SELECT $7 OR (SELECT state FROM st) IN (` + sqlStateRunning + `, ` + sqlStateCancelled + `) AS state_ok,
				b.lease_token IS NULL OR b.lease_token = $3
					-- Run out, unless its holder lives and took its lock back a moment ago: the run could
					-- not renew it while Postgres was away, and does so now.
					OR b.lease_until < now() AND NOT ` + holderBack("b.lease_holder", "$11::bigint") + `
					-- A holder judged gone, whose lock is still missing now, under the batch row's lock: a
					-- holder that took its lock back meanwhile keeps its lease.
					OR b.lease_holder = ANY($9::bigint[]) AND NOT ` + holderLocked("b.lease_holder") + ` AS free,
				b.lease_token IS NOT NULL AND b.lease_token <> $3 AS takeover,
				coalesce(b.lease_epoch, '') <> $4 AS other_epoch,
				b.lease_users, b.lease_token, b.suspect_users
			FROM b
		), may AS (
			-- A free lease is taken only when it is this run's, nobody's, or another run's that the caller
			-- fenced in Redis: the other run claims nobody any more.
			SELECT *, free AND (lease_token IS NULL OR lease_token = $3 OR lease_token = $10) AS take FROM may0
		), cand AS (
			SELECT u FROM unnest($5::text[]) AS u
			UNION
			-- The chunk in hand stays in hand: a dead run's (taken over), or the users this run itself kept
			-- there because it has not read their claims yet (see Record's inHand).
			SELECT u FROM may CROSS JOIN unnest(may.lease_users) AS u WHERE may.take
			UNION
			-- So do the recipients a run took over from a dead run under another Redis epoch and has
			-- not settled yet (suspect_users): their messages may have gone out.
			SELECT u FROM may CROSS JOIN unnest(may.suspect_users) AS u WHERE may.take
		), planned AS (
			-- No consent changed since the launch read them (migration 0007): the consents it planned on
			-- are the consents now, and no recipient's is read again.
			SELECT coalesce((SELECT consent_version FROM campaigns WHERE id = $1) = (SELECT version FROM iys_consents_version), false) AS same
		), pend0 AS (
			-- The batch's pending rows through the (campaign, batch) index, whatever the planner
			-- believes about the campaign's size: at most a batch of rows, never the campaign's.
			SELECT r.user_id, r.address, r.vars, r.delivery, r.consent_status, r.consent_source, r.consent_date, r.consent_txn, r.consent_synced_at,
				c.status, c.source, c.cdate, c.txn, c.synced
			FROM campaign_recipients r
			LEFT JOIN LATERAL (
				SELECT c.status, c.source, c.consent_date AS cdate, c.transaction_id AS txn, coalesce(c.synced_at, c.updated_at) AS synced
				FROM iys_consents c
				WHERE ` + rule.sendJoinSQL("c", "r.address", args.bind) + `
				  AND NOT (SELECT same FROM planned)` + refusalFirstSQL("c") + `
			) c ON true
			WHERE r.campaign_id = $1 AND r.batch = $2 AND r.status = ` + sqlPending + ` AND r.user_id IN (SELECT u FROM cand)
		), pend AS (
			SELECT user_id, address, delivery, (` + rule.refusalSQL("c_status", "vars") + `) IS NULL AS ok,
				c_status, c_source, c_date, c_txn, c_synced
			FROM (SELECT user_id, address, vars, delivery,
					CASE WHEN (SELECT same FROM planned) THEN consent_status ELSE status END AS c_status,
					CASE WHEN (SELECT same FROM planned) THEN consent_source ELSE source END AS c_source,
					CASE WHEN (SELECT same FROM planned) THEN consent_date ELSE cdate END AS c_date,
					CASE WHEN (SELECT same FROM planned) THEN consent_txn ELSE txn END AS c_txn,
					CASE WHEN (SELECT same FROM planned) THEN consent_synced_at ELSE synced END AS c_synced
				FROM pend0) p
		), sus AS (
			-- The suspects once the lease is taken: those not settled yet, and, when the chunk in hand of
			-- another run is taken over under another Redis epoch, its pending users.
			SELECT array(SELECT user_id FROM pend
				WHERE user_id = ANY(((SELECT suspect_users FROM may))::text[])
				   OR coalesce((SELECT takeover AND other_epoch FROM may), false) AND user_id = ANY(((SELECT lease_users FROM may))::text[])) AS users
		), upd AS (
			UPDATE campaign_batches SET lease_token = $3, lease_epoch = $4, lease_holder = NULLIF($8::bigint, 0),
				suspect_users = (SELECT users FROM sus),
				lease_until = now() + $6 * interval '1 millisecond',
				lease_users = array(SELECT user_id FROM pend ORDER BY user_id)
			WHERE campaign_id = $1 AND batch = $2 AND (SELECT state_ok AND take FROM may)
			RETURNING 1
		)
		SELECT (SELECT state FROM st),
			EXISTS (SELECT 1 FROM upd),
			coalesce((SELECT takeover FROM may), false),
			coalesce((SELECT other_epoch FROM may), false),
			coalesce((SELECT lease_users FROM may), '{}'),
			coalesce((SELECT lease_token FROM may), ''),
			coalesce((SELECT state_ok AND free AND NOT take FROM may), false),
			array(SELECT user_id FROM pend WHERE (SELECT state_ok FROM may)),
			array(SELECT coalesce(c_status, '') FROM pend WHERE (SELECT state_ok FROM may)),
			array(SELECT coalesce(c_source, '') FROM pend WHERE (SELECT state_ok FROM may)),
			array(SELECT c_date FROM pend WHERE (SELECT state_ok FROM may)),
			array(SELECT coalesce(c_txn, '') FROM pend WHERE (SELECT state_ok FROM may)),
			array(SELECT c_synced FROM pend WHERE (SELECT state_ok FROM may)),
			` + okSQL + `,
			array(SELECT user_id FROM pend WHERE delivery IS NOT NULL AND (SELECT state_ok FROM may)),
			coalesce((SELECT users FROM sus), '{}')`
	b := &pgx.Batch{}
	b.Queue(`SELECT 1 FROM campaign_batches WHERE campaign_id = $1 AND batch = $2 FOR UPDATE`, c.ID, l.Batch)
	b.Queue(sql, args...)
	br := s.pool.SendBatch(ctx, b)
	var one int
	err := br.QueryRow().Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		br.Close()
		return ch, fmt.Errorf("lease chunk of batch %d: campaign %d has no such batch", l.Batch, c.ID)
	}
	if err == nil {
		err = br.QueryRow().Scan(&ch.State, &leased, &takeover, &otherEpoch, &oldUsers, &prevToken, &fence, &pend,
			&cStatus, &cSource, &cDate, &cTxn, &cSynced, &ok, &okUsers, &accepted, &suspects)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return ch, fmt.Errorf("lease chunk of batch %d: %w", l.Batch, err)
	}
	ch.Snapshots = make(map[string]ConsentRecord, len(cStatus))
	if leased {
		ch.TookOver = takeover
		if takeover {
			ch.PrevToken = prevToken
		}
		inherited := map[string]bool{}
		if takeover || prevToken == l.Token {
			// The run's own chunk in hand too: it may hold users whose outcomes the run recorded and a
			// Postgres crash took back (they were committed without waiting for the disk), pending again
			// with their messages gone out. The run must keep them in hand until it reads their claims.
			for _, u := range oldUsers {
				inherited[u] = true
			}
		}
		suspect := make(map[string]bool, len(suspects))
		for _, u := range suspects {
			suspect[u] = true
		}
		for i, u := range pend {
			ch.Leased[u] = suspect[u]
			if inherited[u] {
				ch.Inherited = append(ch.Inherited, u)
			}
			if cStatus[i] != "" {
				ch.Snapshots[u] = ConsentRecord{Status: cStatus[i], Source: cSource[i], TransactionID: cTxn[i],
					Date: cDate[i].Time, SyncedAt: cSynced[i].Time}
			}
		}
	} else if fence {
		ch.Fence = prevToken
		accepted = nil
	} else {
		inChunk := make(map[string]bool, len(users))
		for _, u := range users {
			inChunk[u] = true
		}
		for _, u := range pend {
			if inChunk[u] {
				ch.Busy++
			}
		}
		accepted = nil
	}
	for _, u := range accepted {
		ch.Accepted[u] = true
	}
	for _, a := range ok {
		ch.Consent[a] = true
	}
	if len(okUsers) == len(ok) && len(ok) > 0 {
		ch.ConsentOf = make(map[string]string, len(ok))
		for i, u := range okUsers {
			ch.ConsentOf[u] = ok[i]
		}
	}
	return ch, nil
}

// IYSRecipientType is the İYS recipient type the campaign's consents are checked for: BIREYSEL unless
// it says TACIR.
func (c *Campaign) IYSRecipientType() string { return iysRecipientType(c.RecipientType) }

// ChecksIYS says whether İYS decides who the campaign may send to: a commercial message on a channel with
// an İYS type.
func (c *Campaign) ChecksIYS() bool { return c.consentRule().checksIYS() }

// OneClickUnsubscribe says the campaign's messages carry a one-click unsubscribe link per recipient (see
// Spec.OneClickUnsubscribe).
func (c *Campaign) OneClickUnsubscribe() bool {
	return c.Channel.Spec().Unsubscribe && !c.Transactional
}

// RenewLease extends the run's lease on its batch. It reports false when another run took the batch over
// (the lease had expired): this run must stop sending.
func (s *Store) RenewLease(ctx context.Context, campaignID int64, l Lease) (bool, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE campaign_batches SET lease_until = now() + $4 * interval '1 millisecond'
		WHERE campaign_id = $1 AND batch = $2 AND lease_token = $3`,
		campaignID, l.Batch, l.Token, l.TTL.Milliseconds())
	if err != nil {
		return false, fmt.Errorf("renew lease of batch %d: %w", l.Batch, err)
	}
	return tag.RowsAffected() == 1, nil
}

// ReleaseBatch lets the run's lease on its batch go, unless a chunk is still in hand (its outcomes were
// not recorded): that one the sweeper settles once the lease has expired.
func (s *Store) ReleaseBatch(ctx context.Context, campaignID int64, l Lease) error {
	_, err := s.pool.Exec(ctx, `UPDATE campaign_batches SET lease_token = NULL, lease_until = NULL, lease_epoch = NULL
		WHERE campaign_id = $1 AND batch = $2 AND lease_token = $3 AND lease_users = '{}'`, campaignID, l.Batch, l.Token)
	if err != nil {
		return fmt.Errorf("release lease of batch %d: %w", l.Batch, err)
	}
	return nil
}

// CancelUnleased marks the pending recipients of a cancelled campaign that no run ever leased (or whose
// run let them go unsent) as skipped (cancelled), and returns their codes to the pool. Such a row has
// never been claimed for a send, or its claim was released because nothing was accepted; only a
// recipient once recorded unknown (pending again for `resume --resend-unknown`) may have got its code
// already, and keeps it. Rows under a lease, or suspect (a dead run may have sent them before Redis lost
// its data), are left to the batch runs, which read the claims.
func (s *Store) CancelUnleased(ctx context.Context, id int64) (int64, error) {
	var n int64
	// The campaign's batch rows are locked first (as LeaseChunk locks its one), so no chunk is leased
	// between what this statement reads and what it writes.
	b := &pgx.Batch{}
	b.Queue(`SELECT count(*) FROM (SELECT 1 FROM campaign_batches WHERE campaign_id = $1 ORDER BY batch FOR UPDATE) x`, id)
	b.Queue(`
		WITH held AS (
			SELECT DISTINCT u AS user_id FROM campaign_batches CROSS JOIN unnest(lease_users || suspect_users) AS u WHERE campaign_id = $1
		), upd AS (
			-- A recipient once unknown (pending again for a resend) stays unknown, with its code: its
			-- first message may have gone out.
			UPDATE campaign_recipients r SET
				status = CASE WHEN `+everUnknown+` THEN `+sqlUnknown+` ELSE `+sqlSkipped+` END,
				reason = CASE WHEN `+everUnknown+` THEN `+sqlCancelledUnsure+` ELSE `+sqlReasonCancelled+` END,
				code = CASE WHEN `+everUnknown+` THEN r.code END, code_id = CASE WHEN `+everUnknown+` THEN r.code_id END,
				updated_at = now()
			FROM campaign_recipients old
			WHERE r.campaign_id = $1 AND r.status = `+sqlPending+` AND NOT EXISTS (SELECT 1 FROM held WHERE held.user_id = r.user_id)
			  -- A receipt came in while the row was pending: the message went out, with its code. The
			  -- batch's run closes it as sent (LeaseChunk's Accepted), a cancelled campaign's too.
			  AND r.delivery IS NULL
			  AND old.campaign_id = r.campaign_id AND old.user_id = r.user_id
			  AND EXISTS (SELECT 1 FROM campaigns WHERE id = $1 AND state = `+sqlStateCancelled+`)
			RETURNING r.user_id, old.code_id, r.code_id AS kept, r.status, r.reason
		), log AS (
			INSERT INTO send_log (campaign_id, user_id, status, reason)
			SELECT $1, user_id, status, reason FROM upd
		), released AS (
			INSERT INTO released_codes (code_id, pool)
			SELECT upd.code_id, p.pool FROM upd JOIN promo_codes p ON p.id = upd.code_id
			WHERE upd.kept IS NULL
			ON CONFLICT (code_id) DO NOTHING
		)
		SELECT count(*) FROM upd`, id)
	br := s.pool.SendBatch(ctx, b)
	var batches int64
	err := br.QueryRow().Scan(&batches)
	if err == nil {
		err = br.QueryRow().Scan(&n)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("cancel recipients of campaign %d: %w", id, err)
	}
	return n, nil
}

// Unknown returns the users of campaign id whose outcome is unknown and whom no receipt proves sent.
//
// What it returns is on disk before it returns. Its caller acts on the list outside Postgres (`resume
// --resend-unknown` forgets the recipients' claims before Resend), and an unknown outcome may be a chunk's
// outcome committed a moment ago without waiting for the WAL flush (Record): a crash that took it back
// after the claims were forgotten would leave the recipient pending, still in its batch's chunk in hand,
// with nothing left to say that its message may have gone out, and the next run would send it again. So
// the read takes a lock that is written to the WAL (FOR KEY SHARE on the campaign's row, which holds back
// only its deletion): the transaction's commit then waits for the WAL to be flushed up to the lock, past
// every outcome the read saw.
func (s *Store) Unknown(ctx context.Context, id int64) ([]string, error) {
	h, err := s.UnknownToResend(ctx, id, 0, 0, nil)
	return h.Resend, err
}

// UnknownHeld is what UnknownToResend found: the unknown users to resend, and those held back.
type UnknownHeld struct {
	// Resend are the users to send again.
	Resend []string
	// Held were recorded unknown less than the grace ago: their calls may still be answered.
	Held []string
	// AwaitingReceipts were recorded unknown less than the receipt grace ago, through a provider whose
	// receipts name the recipient (or through none known): a receipt may still show their first message
	// was accepted. Wait is how long until the last of them is out of it.
	AwaitingReceipts []string
	Wait             time.Duration
}

// UnknownToResend is Unknown for `resume --resend-unknown`, in one read: it holds back (held) the users
// recorded unknown less than grace ago (by Postgres's clock). A live worker that gave up waiting for the
// provider's answer records its recipients unknown at once, but the provider may still take the request
// it holds and say so in a receipt seconds later; a takeover that found the claims gone with Redis's data
// (Unverifiable) records them while the run that held the chunk may only have been stopped or cut off,
// its call still waiting for the answer. Either way the call began before the recipient was recorded, and
// that time is the one age every unknown recipient has, whatever its claim says.
//
// It also holds back (AwaitingReceipts) those recorded unknown less than receiptGrace ago through a
// provider that is not one of noReceipts, or through none known (the claim naming it was lost): the
// provider's receipts name the recipient (Twilio's status callbacks, SendGrid's events), and they can come
// minutes after the message (SendGrid posts its events in batches); one that comes meanwhile proves the
// first message, which a resend would have doubled.
func (s *Store) UnknownToResend(ctx context.Context, id int64, grace, receiptGrace time.Duration, noReceipts []string) (UnknownHeld, error) {
	var h UnknownHeld
	if noReceipts == nil {
		noReceipts = []string{}
	}
	b := &pgx.Batch{}
	b.Queue(`SELECT count(*) FROM (SELECT 1 FROM campaigns WHERE id = $1 FOR KEY SHARE) x`, id)
	b.Queue(`SELECT user_id, updated_at > now() - $2 * interval '1 millisecond',
			NOT (coalesce(provider, '') <> '' AND provider = ANY($4::text[])) AND updated_at > now() - $3::bigint * interval '1 millisecond',
			greatest(0, (extract(epoch FROM updated_at - now()) * 1000)::bigint + $3::bigint)
		FROM campaign_recipients WHERE campaign_id = $1 AND status = `+sqlUnknown+` AND delivery IS NULL`,
		id, grace.Milliseconds(), receiptGrace.Milliseconds(), noReceipts)
	br := s.pool.SendBatch(ctx, b)
	var one int
	err := br.QueryRow().Scan(&one)
	if err == nil {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			var user string
			var hold, await bool
			var left int64
			_, err = pgx.ForEachRow(rows, []any{&user, &hold, &await, &left}, func() error {
				switch {
				case hold:
					h.Held = append(h.Held, user)
				case await:
					h.AwaitingReceipts = append(h.AwaitingReceipts, user)
					h.Wait = max(h.Wait, time.Duration(left)*time.Millisecond)
				default:
					h.Resend = append(h.Resend, user)
				}
				return nil
			})
		}
	}
	// The commit, and its wait for the WAL, is the batch's end.
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return UnknownHeld{}, fmt.Errorf("unknown recipients: %w", err)
	}
	return h, nil
}

// UnknownProof is what a campaign's rows say of the evidence that can still come for its unknown
// recipients (Store.UnknownProof), by the provider they were sent or left unknown through ("": none
// known, the claim that named it was lost).
type UnknownProof map[string]ProviderProof

// ProviderProof is UnknownProof for one provider.
type ProviderProof struct {
	// Via counts the recipients sent or left unknown through the provider.
	Via int64
	// Receipts counts its recipients with a delivery receipt: none at all says its receipts do not reach
	// this engine (not set up, or the endpoint down), so none will clear an unknown recipient either.
	Receipts int64
	// NoMessageID counts its unknown recipients with no provider message ID and no receipt: their answers
	// were lost, and only a receipt that names the recipient itself could still show that their messages
	// were accepted.
	NoMessageID int64
}

// UnknownProof reads, for campaign id, UnknownProof (one scan of the campaign's rows).
func (s *Store) UnknownProof(ctx context.Context, id int64) (UnknownProof, error) {
	p := UnknownProof{}
	rows, err := s.pool.Query(ctx, `
		SELECT coalesce(provider, ''),
			count(*) FILTER (WHERE status IN (`+sqlSent+`, `+sqlUnknown+`)),
			count(*) FILTER (WHERE delivery IS NOT NULL),
			count(*) FILTER (WHERE status = `+sqlUnknown+` AND coalesce(provider_message_id, '') = '' AND delivery IS NULL)
		FROM campaign_recipients WHERE campaign_id = $1 GROUP BY 1`, id)
	if err != nil {
		return p, fmt.Errorf("unknown recipients' evidence: %w", err)
	}
	var name string
	var pp ProviderProof
	_, err = pgx.ForEachRow(rows, []any{&name, &pp.Via, &pp.Receipts, &pp.NoMessageID}, func() error {
		p[name] = pp
		return nil
	})
	if err != nil {
		return p, fmt.Errorf("unknown recipients' evidence: %w", err)
	}
	return p, nil
}

// Resend moves users of campaign id from unknown back to pending, keeping their codes (a person who did
// get the first message gets the same code again, never a second one), and logs the decision. A recipient
// with a delivery receipt is never moved: the receipt proves the provider accepted the message (Record
// and RecordDeliveries make such a recipient sent; the condition here covers rows recorded before they
// did). Their batches are no longer settled (see CompleteIfDone: the trigger of migration 0012 clears the
// marks), in a transaction that first locks the campaign's row as CompleteIfDone does: a completion check
// either sees the recipients pending or ran before they were, and a campaign a check completed before is
// running again (scheduled, if its start is still ahead). Their claims must have been cleared first. It
// returns how many moved.
func (s *Store) Resend(ctx context.Context, id int64, users []string) (int64, error) {
	var n int64
	err := s.underCampaignLock(ctx, id, `
		WITH upd AS (
			-- Not once the campaign is cancelled (a cancel that committed after the resume read it): its
			-- recipients would wait, pending, for batch runs that close them.
			UPDATE campaign_recipients SET status = `+sqlPending+`, reason = NULL, updated_at = now()
			WHERE campaign_id = $1 AND user_id = ANY($2) AND status = `+sqlUnknown+` AND delivery IS NULL
				AND EXISTS (SELECT 1 FROM campaigns WHERE id = $1 AND state <> `+sqlStateCancelled+`)
			RETURNING user_id
		), log AS (
			INSERT INTO send_log (campaign_id, user_id, status, reason)
			SELECT $1, user_id, `+sqlPending+`, 'resend of an unknown outcome (resume --resend-unknown)' FROM upd
		), reopened AS (
			-- A completion that committed before this transaction took the lock (a batch run ending, another
			-- resume) does not strand the recipients: the campaign runs again, or waits for its start.
			UPDATE campaigns SET state = CASE WHEN start_at > now() THEN `+sqlStateScheduled+` ELSE `+sqlStateRunning+` END,
				finished_at = NULL
			WHERE id = $1 AND state = `+sqlStateCompleted+` AND EXISTS (SELECT 1 FROM upd)
		)
		SELECT count(*) FROM upd`, []any{id, users}, &n)
	if err != nil {
		return 0, fmt.Errorf("resend unknown recipients of campaign %d: %w", id, err)
	}
	return n, nil
}

// CountReason counts campaign id's recipients in status with reason.
func (s *Store) CountReason(ctx context.Context, id int64, status, reason string) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM campaign_recipients WHERE campaign_id = $1 AND status = $2 AND reason = $3`,
		id, status, reason).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count %s (%s) recipients: %w", status, reason, err)
	}
	return n, nil
}

// Expired is a batch with rows under leases that expired: the run that held them died.
type Expired struct {
	CampaignID int64
	Batch      int
	Users      []string
}

// ExpiredLeases returns the chunks in hand of up to limit batches whose leases expired, or whose holders
// are gone: the runs that held them died. A batch leased by a holder that is gone with no chunk in hand (the
// run died between two chunks) is returned too, with no users: its batch is to be queued again.
//
// A lease that ran out is left out while its holder's lock is held by a session younger than holderGrace
// (Lease.HolderGrace): its process lives and has just taken its lock back.
func (s *Store) ExpiredLeases(ctx context.Context, limit int, gone []int64, holderGrace time.Duration) ([]Expired, error) {
	if gone == nil {
		gone = []int64{}
	}
	rows, err := s.pool.Query(ctx, `
		SELECT campaign_id, batch, lease_users FROM campaign_batches b
		WHERE lease_users <> '{}' AND (lease_until < now() AND NOT `+holderBack("b.lease_holder", "$3::bigint")+` OR lease_holder = ANY($2::bigint[]))
		   OR lease_users = '{}' AND lease_token IS NOT NULL AND lease_holder = ANY($2::bigint[])
		ORDER BY lease_until LIMIT $1`, limit, gone, holderGrace.Milliseconds())
	if err != nil {
		return nil, fmt.Errorf("expired leases: %w", err)
	}
	var out []Expired
	for rows.Next() {
		var e Expired
		if err := rows.Scan(&e.CampaignID, &e.Batch, &e.Users); err != nil {
			return nil, fmt.Errorf("expired leases: %w", err)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// GoneHolders returns the holders (Lease.Holder) of leases whose advisory locks no session holds: their
// worker processes died, or lost their Postgres session. A restart, crash recovery or failover of Postgres
// lets every lock go at once: the caller judges only while its own lock has been held for a while
// (worker.Liveness), and LeaseChunk takes a gone holder's batch only while its lock is still missing.
func (s *Store) GoneHolders(ctx context.Context) ([]int64, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT DISTINCT b.lease_holder FROM campaign_batches b
		WHERE b.lease_token IS NOT NULL AND b.lease_holder IS NOT NULL
		  AND NOT `+holderLocked("b.lease_holder"))
	if err != nil {
		return nil, fmt.Errorf("gone lease holders: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// LiveHolders returns which of the holder keys (Lease.Holder, worker.Liveness) a session holds the
// advisory lock of now: the worker processes behind them live.
func (s *Store) LiveHolders(ctx context.Context, keys []int64) (map[int64]bool, error) {
	live := make(map[int64]bool, len(keys))
	if len(keys) == 0 {
		return live, nil
	}
	rows, err := s.pool.Query(ctx, `SELECT k FROM unnest($1::bigint[]) AS k WHERE `+holderLocked("k"), keys)
	if err != nil {
		return nil, fmt.Errorf("live workers: %w", err)
	}
	held, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("live workers: %w", err)
	}
	for _, k := range held {
		live[k] = true
	}
	return live, nil
}

// holderLocked is the SQL condition that a session holds the advisory lock of the holder key in col.
func holderLocked(col string) string {
	return `EXISTS (SELECT 1 FROM pg_locks l
		WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
		  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND l.classid::bigint = (` + col + ` >> 32) & 4294967295 AND l.objid::bigint = ` + col + ` & 4294967295)`
}

// holderBack is the SQL condition that a lease of the holder key in col that ran out may still belong to
// a run that lives, for graceMs milliseconds after Postgres came back: the Postgres server started less
// than that ago (a restart, crash recovery: no run could renew its lease while it was down, and every
// holder takes its lock back within about a second, before which its lock is simply missing), or the
// holder's lock is held by a session that began less than that ago (its connection broke, a failover).
// A session of another role whose start Postgres does not show counts as old.
func holderBack(col, graceMs string) string {
	return `(pg_postmaster_start_time() > now() - ` + graceMs + ` * interval '1 millisecond'
		OR EXISTS (SELECT 1 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
		  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND l.classid::bigint = (` + col + ` >> 32) & 4294967295 AND l.objid::bigint = ` + col + ` & 4294967295
		  AND a.backend_start > now() - ` + graceMs + ` * interval '1 millisecond'))`
}

// HoldLiveness takes, on conn, the session advisory lock of key (Lease.Holder) that tells the sweep of
// every worker that this process lives, unless a session holds it already (conn's, or, behind a pooler,
// the server connection that took it). Postgres lets it go when that session ends: the process died, or
// its connection was lost. It never waits for the lock.
func HoldLiveness(ctx context.Context, conn *pgx.Conn, key int64) error {
	var held bool
	// CASE, not OR: the lock is tried only when no session holds it (a session holding it twice would
	// count up on every call).
	err := conn.QueryRow(ctx, `SELECT CASE WHEN `+holderLocked("$1::bigint")+` THEN true ELSE pg_try_advisory_lock($1) END`, key).Scan(&held)
	if err == nil && !held {
		err = errors.New("another session holds it")
	}
	if err != nil {
		return fmt.Errorf("liveness lock: %w", err)
	}
	return nil
}
