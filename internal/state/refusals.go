package state

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// RefusalsHeldKey is a sorted set of the webhooks processes whose spool holds refusals Postgres could not
// take yet (a provider's unsubscribes, one-click refusals, RET replies received while it was away), each
// scored with the time, by Redis's clock in milliseconds, until which its note holds. While one holds,
// workers lease nothing to send: the consents they would read are missing those refusals.
const RefusalsHeldKey = "campaignctl:refusals:held"

// RefusalsHeldGenKey counts the notes written to RefusalsHeldKey (each new one and each renewal): a worker
// that reads it before and after a consent read knows whether a refusal was spooled meanwhile, even if its
// note was gone again by the second look (RefusalsHeldNow).
const RefusalsHeldGenKey = "campaignctl:refusals:held:gen"

// noteHeld adds or renews holder's note until ttl from now by Redis's clock, drops the notes that ran out,
// and counts the note.
var noteHeld = redis.NewScript(`
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", now)
redis.call("ZADD", KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call("INCR", KEYS[2])
return 1`)

// RefusalsSpooledKey is a hash of who the refusals held in some webhooks process's spool refuse
// (SpooledAddress, SpooledUser), each with how many held requests name it. Unlike a note of RefusalsHeldKey, it does not run
// out when its process dies with its spool full: until that spool is recorded (the process back, or its
// directory replayed by another), the workers send nobody it names.
const RefusalsSpooledKey = "campaignctl:refusals:spooled"

// SpooledAddress names a refusal of address on channel ("sms", "email").
func SpooledAddress(channel, address string) string { return "a|" + channel + "|" + address }

// SpooledUser names a one-click unsubscribe of user (an e-mail's link).
func SpooledUser(user string) string { return "u|" + user }

// RefusalsAnnouncedKey is a sorted set of who the refusals being recorded right now refuse
// (SpooledAddress, SpooledUser), each scored with the time, by Redis's clock in milliseconds, until which
// it holds. A webhooks process names them before it writes them to Postgres, where the write may wait
// for the consents' turn behind an import's merge (seconds to minutes): the workers send nobody named
// from their next chunk, as they do once the RET is in Postgres. The name is taken back once the refusal
// is recorded or held in a spool (which names it in RefusalsSpooledKey); one whose process died mid-write
// runs out by itself.
const RefusalsAnnouncedKey = "campaignctl:refusals:announced"

// countHeld counts the notes that still hold by Redis's clock, and returns the count of notes written and
// how many refusals are named as spooled or being recorded.
var countHeld = redis.NewScript(`
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {redis.call("ZCOUNT", KEYS[1], "(" .. now, "+inf"), tonumber(redis.call("GET", KEYS[2]) or "0"),
  redis.call("HLEN", KEYS[3]) + redis.call("ZCOUNT", KEYS[4], "(" .. now, "+inf")}`)

// announceScript names ARGV[2..] in KEYS[1] until ARGV[1] ms from now by Redis's clock (a later end
// stands), and drops the names that ran out.
var announceScript = redis.NewScript(`
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", now)
for i = 2, #ARGV do redis.call("ZADD", KEYS[1], "GT", now + tonumber(ARGV[1]), ARGV[i]) end
return 1`)

// AnnounceRefusals names ids (SpooledAddress, SpooledUser) as refused by a request being recorded now,
// for ttl at most (RefusalsAnnouncedKey).
func AnnounceRefusals(ctx context.Context, rdb redis.UniversalClient, ids []string, ttl time.Duration) error {
	if len(ids) == 0 {
		return nil
	}
	args := make([]any, 0, 1+len(ids))
	args = append(args, ttl.Milliseconds())
	for _, id := range ids {
		args = append(args, id)
	}
	return announceScript.Run(ctx, rdb, []string{RefusalsAnnouncedKey}, args...).Err()
}

// WithdrawRefusals takes AnnounceRefusals's names back: their request is recorded, or held in a spool.
func WithdrawRefusals(ctx context.Context, rdb redis.UniversalClient, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	members := make([]any, len(ids))
	for i, id := range ids {
		members[i] = id
	}
	return rdb.ZRem(ctx, RefusalsAnnouncedKey, members...).Err()
}

// spooledScript adds ARGV[1] (1 or -1) to the count of each of ARGV[2..], and drops a count that falls to 0.
var spooledScript = redis.NewScript(`
for i = 2, #ARGV do
  if redis.call("HINCRBY", KEYS[1], ARGV[i], ARGV[1]) <= 0 then redis.call("HDEL", KEYS[1], ARGV[i]) end
end
return 1`)

// NoteSpooled names ids (SpooledAddress, SpooledUser) as refused by a request just held in a spool.
func NoteSpooled(ctx context.Context, rdb redis.UniversalClient, ids []string) error {
	return runSpooled(ctx, rdb, 1, ids)
}

// ForgetSpooled takes back NoteSpooled's ids once their request is recorded in Postgres.
func ForgetSpooled(ctx context.Context, rdb redis.UniversalClient, ids []string) error {
	return runSpooled(ctx, rdb, -1, ids)
}

func runSpooled(ctx context.Context, rdb redis.UniversalClient, by int, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	args := make([]any, 0, 1+len(ids))
	args = append(args, by)
	for _, id := range ids {
		args = append(args, id)
	}
	return spooledScript.Run(ctx, rdb, []string{RefusalsSpooledKey}, args...).Err()
}

// SpooledRefusals reads who the spools' refusals, and those being recorded now, name (SpooledAddress,
// SpooledUser).
func SpooledRefusals(ctx context.Context, rdb redis.UniversalClient) (map[string]bool, error) {
	var spooled *redis.StringSliceCmd
	var announced *redis.ZSliceCmd
	var now *redis.TimeCmd
	if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		spooled = p.HKeys(ctx, RefusalsSpooledKey)
		announced = p.ZRangeWithScores(ctx, RefusalsAnnouncedKey, 0, -1)
		now = p.Time(ctx)
		return nil
	}); err != nil {
		return nil, err
	}
	m := make(map[string]bool, len(spooled.Val()))
	for _, id := range spooled.Val() {
		m[id] = true
	}
	// By Redis's clock, as the names were given their end: one that ran out belonged to a process that
	// died while it wrote the refusal.
	ms := float64(now.Val().UnixMilli())
	for _, z := range announced.Val() {
		if id, ok := z.Member.(string); ok && z.Score > ms {
			m[id] = true
		}
	}
	return m, nil
}

// NoteRefusalsHeld notes that holder's spool holds refusals, for ttl unless renewed (a process that
// died with its spool full does not hold the workers for longer).
func NoteRefusalsHeld(ctx context.Context, rdb redis.UniversalClient, holder string, ttl time.Duration) error {
	return noteHeld.Run(ctx, rdb, []string{RefusalsHeldKey, RefusalsHeldGenKey}, holder, ttl.Milliseconds()).Err()
}

// HeldRefusals is what RefusalsHeldNow read: whether a note holds, and how many notes were written so far
// (0 after Redis lost its data).
type HeldRefusals struct {
	Held bool
	Gen  int64
	// Spooled is how many refusals are named as held in a spool (RefusalsSpooledKey) or being recorded
	// (RefusalsAnnouncedKey).
	Spooled int64
}

// RefusalsHeldNow reads whether some webhooks process's spool holds refusals that Postgres has not taken
// yet, and the count of notes written.
func RefusalsHeldNow(ctx context.Context, rdb redis.UniversalClient) (HeldRefusals, error) {
	vs, err := countHeld.Run(ctx, rdb, []string{RefusalsHeldKey, RefusalsHeldGenKey, RefusalsSpooledKey, RefusalsAnnouncedKey}).Int64Slice()
	if err != nil {
		return HeldRefusals{}, err
	}
	if len(vs) != 3 {
		return HeldRefusals{}, fmt.Errorf("refusals held: unexpected answer %v", vs)
	}
	return HeldRefusals{Held: vs[0] > 0, Gen: vs[1], Spooled: vs[2]}, nil
}

// ClearRefusalsHeld removes holder's note: its spool is empty.
func ClearRefusalsHeld(ctx context.Context, rdb redis.UniversalClient, holder string) error {
	return rdb.ZRem(ctx, RefusalsHeldKey, holder).Err()
}
