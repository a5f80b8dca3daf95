package state

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
)

// The Redis epoch (EpochKey) is a random value that changes whenever Redis may have lost data
// (restarted, flushed, failed over to a replica, even one that had everything), and only then. A chunk
// lease in Postgres records the epoch its claims were taken under, and a claim is only taken while the
// epoch is still the one its lease recorded. So when a run dies holding a lease, the next run knows
// whether the claims it finds (or does not find) are complete: same epoch, a missing claim means never
// sent; another epoch, a missing claim proves nothing and the recipient becomes unknown.
//
// A failover to a replica that lagged loses the claims written in its last moments but keeps the epoch,
// which was replicated long before. So the epoch is tied to the server that issued it (EpochServerKey:
// "<run_id>/<master_replid>" from INFO: a restart gives Redis a new run_id, a promotion a new
// master_replid),
// and a new one is issued as soon as a client sees another server, or the same server with another
// replication history, holding the master role.

// Epoch returns the current Redis epoch, after checking that it was issued on the master it reads
// (epochScript): Redis's identity is read in the same script that compares it, so no claim can come
// between them. It creates the epoch when Redis has none, and renews it when the master changed. It fails
// on a replica: claims are only taken on the master.
func Epoch(ctx context.Context, rdb redis.Scripter) (string, error) {
	e, _, err := checkEpoch(ctx, rdb)
	return e, err
}

// epochChange says what checkEpoch did.
type epochChange int

const (
	epochKept    epochChange = iota // the epoch was issued on this master: unchanged
	epochCreated                    // Redis had none (first use, or its data is gone)
	epochRenewed                    // issued on another master, or before the server was recorded
)

func checkEpoch(ctx context.Context, rdb redis.Scripter) (string, epochChange, error) {
	res, err := epochScript.Run(ctx, rdb, []string{EpochKey, EpochServerKey, EpochSinceKey}, Token()).Slice()
	if err != nil {
		if strings.Contains(err.Error(), "CAMPAIGNCTL_NOT_MASTER") {
			return "", 0, fmt.Errorf("redis epoch: %w (%s)", ErrNotMaster, strings.TrimSpace(strings.TrimPrefix(err.Error(), "CAMPAIGNCTL_NOT_MASTER")))
		}
		if strings.Contains(err.Error(), "CAMPAIGNCTL_NO_IDENTITY") {
			return "", 0, fmt.Errorf("redis epoch: %w", errNoIdentity)
		}
		return "", 0, fmt.Errorf("redis epoch: %w", err)
	}
	if len(res) != 2 {
		return "", 0, fmt.Errorf("redis epoch: the script answered %v", res)
	}
	e, _ := res[0].(string)
	n, _ := res[1].(int64)
	return e, epochChange(n), nil
}

// ErrNotMaster: the Redis a client reached is a replica. Claims, buckets and queues are written on the
// master only, and an epoch read on a replica would be checked against another server's identity.
var ErrNotMaster = errors.New("this Redis is not the master (INFO replication says role is not master); point REDIS_URL at the master, or at the Sentinels with redis+sentinel://")

var errNoIdentity = errors.New("this Redis does not report run_id and master_replid in INFO, so a failover or restart could not be told from a lost claim; every Redis since 4.0 does")

// epochScript returns the epoch, creating it, or renewing it when it was issued on another master.
//
// KEYS[1] -> campaignctl:epoch
// KEYS[2] -> campaignctl:epoch:server
// KEYS[3] -> campaignctl:epoch:since, written with the epoch (Redis's time, ms)
// ARGV[1] -> a fresh random value, used when a new epoch is needed
//
// Returns {epoch, 0 kept | 1 created | 2 renewed}. Two clients that check at once after a failover get the
// same new epoch: the first renews it and records the server, the second finds it recorded. An epoch
// without a recorded server (written by an earlier version) is renewed: nothing proves it was issued on
// this master.
var epochScript = redis.NewScript(`
local repl = redis.call("INFO", "replication")
local role = string.match(repl, "role:(%a+)")
if role ~= "master" then return redis.error_reply("CAMPAIGNCTL_NOT_MASTER role:" .. tostring(role)) end
local runid = string.match(redis.call("INFO", "server"), "run_id:(%x+)")
local replid = string.match(repl, "master_replid:(%x+)")
if not runid or not replid then return redis.error_reply("CAMPAIGNCTL_NO_IDENTITY") end
local server = runid .. "/" .. replid
local v = redis.call("GET", KEYS[1])
if v and redis.call("GET", KEYS[2]) == server then return {v, 0} end
redis.call("SET", KEYS[1], ARGV[1])
redis.call("SET", KEYS[2], server)
local t = redis.call("TIME")
redis.call("SET", KEYS[3], string.format("%.0f", tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)))
if v then return {ARGV[1], 2} end
return {ARGV[1], 1}`)

// EpochState is what Redis says of its epoch: the epoch (empty: none yet), the epoch the frequency marks
// were last written back for (MarksKey), and when the epoch was created or renewed (EpochSinceKey; nil:
// not recorded).
type EpochState struct {
	Epoch, Marks string
	Since        *time.Time
}

// MarksPending says that Redis lost its data and the recent sends' frequency marks are not back yet for
// its epoch (MarksBack): nothing is claimed until they are.
func (e EpochState) MarksPending() bool { return e.Epoch != "" && e.Marks != e.Epoch }

// ReadEpoch reads the epoch, its marks' epoch and its time in one round trip, creating nothing.
func ReadEpoch(ctx context.Context, rdb redis.Cmdable) (EpochState, error) {
	vals, err := rdb.MGet(ctx, EpochKey, MarksKey, EpochSinceKey).Result()
	if err != nil {
		return EpochState{}, fmt.Errorf("redis epoch: %w", err)
	}
	var e EpochState
	e.Epoch, _ = vals[0].(string)
	e.Marks, _ = vals[1].(string)
	if v, ok := vals[2].(string); ok {
		if ms, err := strconv.ParseInt(v, 10, 64); err == nil {
			t := time.UnixMilli(ms)
			e.Since = &t
		}
	}
	return e, nil
}

// randomToken returns a short random identifier (epochs, lease tokens).
func Token() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		// crypto/rand does not fail on supported platforms; the clock keeps the token unique enough.
		return strconv.FormatInt(time.Now().UnixNano(), 36)
	}
	return hex.EncodeToString(b[:])
}

// Halt sets the campaign's halt key to why ("paused", "cancelled") for ttl (0: until Unhalt): no claim for
// a send is taken while it is set, on any worker. In the same call it gives the halt a token of its own
// (HaltsKey), which UnhaltIf compares.
func Halt(ctx context.Context, rdb redis.UniversalClient, campaignID int64, why string, ttl time.Duration) error {
	if err := haltScript.Run(ctx, rdb, []string{HaltKey(campaignID), HaltsKey(campaignID)}, why, ttl.Milliseconds(), Token()).Err(); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("halt campaign %d in Redis: %w", campaignID, err)
	}
	return nil
}

// KEYS[1] -> campaign:<id>:halt, KEYS[2] -> campaign:<id>:halts
// ARGV[1] -> why, ARGV[2] -> TTL in ms (0: none), ARGV[3] -> the halt's token (random)
var haltScript = redis.NewScript(`
if tonumber(ARGV[2]) > 0 then
  redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
else
  redis.call("SET", KEYS[1], ARGV[1])
end
redis.call("SET", KEYS[2], ARGV[3])
return 0`)

// Halts is the token of the last halt written for the campaign (Halt), as UnhaltIf compares it ("" when
// none, or Redis lost it). A token, not a count: a count that Redis lost would start again at a value a
// resume may have read before the loss, and a halt written since would look like none.
func Halts(ctx context.Context, rdb redis.UniversalClient, campaignID int64) (string, error) {
	n, err := rdb.Get(ctx, HaltsKey(campaignID)).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read the halts of campaign %d in Redis: %w", campaignID, err)
	}
	return n, nil
}

// UnhaltIf removes the campaign's halt key unless a halt was written since Halts said halts (its token
// differs): a pause or cancel that landed meanwhile keeps its halt, even after Redis lost its data. It reports whether the key is gone (or was not there).
func UnhaltIf(ctx context.Context, rdb redis.UniversalClient, campaignID int64, halts string) (bool, error) {
	n, err := unhaltScript.Run(ctx, rdb, []string{HaltKey(campaignID), HaltsKey(campaignID)}, halts).Int()
	if err != nil {
		return false, fmt.Errorf("unhalt campaign %d in Redis: %w", campaignID, err)
	}
	return n == 1, nil
}

// KEYS[1] -> campaign:<id>:halt, KEYS[2] -> campaign:<id>:halts; ARGV[1] -> the halts read before
var unhaltScript = redis.NewScript(`
if (redis.call("GET", KEYS[2]) or "") ~= ARGV[1] then
  return redis.call("EXISTS", KEYS[1]) == 0 and 1 or 0
end
redis.call("DEL", KEYS[1])
return 1`)

// Unhalt removes the campaign's halt key, whatever halted it.
func Unhalt(ctx context.Context, rdb redis.UniversalClient, campaignID int64) error {
	if err := rdb.Del(ctx, HaltKey(campaignID)).Err(); err != nil {
		return fmt.Errorf("unhalt campaign %d in Redis: %w", campaignID, err)
	}
	return nil
}

// Errors of the claim script: nothing was written.
var (
	// ErrEpoch: Redis lost its data, or its master changed, since the run leased its chunk: nothing was
	// written.
	ErrEpoch = errors.New("Redis lost its data or changed master (its epoch changed: emptied, restarted or failed over) since this chunk was leased")
	// ErrHalted: the campaign was paused or cancelled: nothing was written.
	ErrHalted = errors.New("campaign halted")
	// ErrFenced: another run took the chunk over (the lease ran out, or the worker process was judged
	// gone) and read its claims: nothing was written, and the run must send nothing more.
	ErrFenced = errors.New("this run's chunk was taken over by another run (its lease ran out, or its worker was judged gone)")
)

// scriptError maps the claim script's error replies to ErrEpoch and ErrHalted.
func scriptError(err error) error {
	switch {
	case err == nil:
		return nil
	case strings.Contains(err.Error(), "CAMPAIGNCTL_EPOCH"):
		return ErrEpoch
	case strings.Contains(err.Error(), "CAMPAIGNCTL_HALT"):
		return ErrHalted
	case strings.Contains(err.Error(), "CAMPAIGNCTL_FENCED"):
		return ErrFenced
	}
	return err
}

// ReadClaims reads the claims keys hold (nil for none), as MGET does, but only while the epoch is still
// epoch: a read that reaches a new master after a failover finds the epoch renewed (its connection was
// checked) and is refused with ErrEpoch, instead of answering "no claim" for claims that were lost.
func (s *Store) ReadClaims(ctx context.Context, epoch string, keys []string) ([]any, error) {
	vals, err := readClaimsScript.Run(ctx, s.rdb, append([]string{EpochKey}, keys...), epoch).Slice()
	if err != nil {
		if se := scriptError(err); se != err {
			return nil, se
		}
		return nil, fmt.Errorf("read claims: %w", err)
	}
	if len(vals) != len(keys) {
		return nil, fmt.Errorf("read claims: %d values for %d keys", len(vals), len(keys))
	}
	return vals, nil
}

// KEYS[1] -> campaignctl:epoch
// KEYS[2..] -> the claims
// ARGV[1] -> the epoch the reader's lease recorded
var readClaimsScript = redis.NewScript(`
if redis.call("GET", KEYS[1]) ~= ARGV[1] then return redis.error_reply("CAMPAIGNCTL_EPOCH changed") end
local out = {}
for i = 2, #KEYS do out[i - 1] = redis.call("GET", KEYS[i]) or false end
return out`)

// Fence fences the lease token of another run before the caller takes its lease over: every claim under
// that lease is refused from then on (Guard.Fence), for as long as claims live, while the epoch is still
// epoch (a Redis that lost its data refuses that run's claims by their epoch anyway).
func (s *Store) Fence(ctx context.Context, epoch, token string) error {
	err := fenceScript.Run(ctx, s.rdb, []string{EpochKey, FenceKey(token)}, epoch, s.ttl.Milliseconds()).Err()
	if err != nil && !errors.Is(err, redis.Nil) {
		if se := scriptError(err); se != err {
			return se
		}
		return fmt.Errorf("fence lease %s: %w", token, err)
	}
	return nil
}

// KEYS[1] -> campaignctl:epoch
// KEYS[2] -> fence:<lease token>
// ARGV[1] -> the epoch the caller's lease records
// ARGV[2] -> the fence's TTL in ms (the claims')
var fenceScript = redis.NewScript(`
if redis.call("GET", KEYS[1]) ~= ARGV[1] then return redis.error_reply("CAMPAIGNCTL_EPOCH changed") end
redis.call("SET", KEYS[2], "1", "PX", ARGV[2])
return 0`)

// Epoch is the package's Epoch on the store's client.
func (s *Store) Epoch(ctx context.Context) (string, error) { return Epoch(ctx, s.rdb) }

// The frequency marks are only as complete as the Redis that holds them: a Redis that lost its data lost
// them too, and a campaign planned side by side with another would reach again the people the other one
// reached before the loss. So the marks of the recent sends are written back from Postgres (the audit log)
// once for every epoch, before any claim is taken under it: MarksKey records the epoch they were last
// written back for, and a batch run checks it when it starts (MarksBack). Runs that started under the
// epoch before are refused at their next claim (ErrEpoch) and start again, so no claim under a new epoch
// comes before its marks.
const (
	MarksKey     = "campaignctl:epoch:marks"
	marksLockKey = "campaignctl:epoch:marks:lock"
	// marksLockTTL bounds how long a worker that died while writing the marks holds the others up; the
	// writer extends it with every thousand marks.
	marksLockTTL = 30 * time.Second
)

// extendLockScript extends a lock held with token.
//
// KEYS[1] -> the lock
// ARGV[1] -> the token
// ARGV[2] -> the TTL in ms
var extendLockScript = redis.NewScript(`
if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("PEXPIRE", KEYS[1], ARGV[2]) end
return 0`)

// ErrMarksPending: Redis lost its data (or changed master) and a worker is writing the frequency marks of
// the recent sends back from Postgres; nothing is claimed meanwhile.
var ErrMarksPending = errors.New("Redis lost its data (or changed master): a worker is writing the frequency marks of the recent sends back from Postgres; sends wait until it is done")

// MarkSource calls yield with the latest send to each address on each channel within the longest cap a
// campaign may still apply, and returns that cap (campaign.Store.RecentSends).
type MarkSource func(ctx context.Context, yield func(campaign.RecentSend) error) (time.Duration, error)

// MarksBack returns nil once the frequency marks have been written back for epoch (see MarksKey): at once
// when they have, after writing them from src when this call gets the lock, after waiting when another
// worker writes them, or ErrMarksPending when that takes more than a few seconds. They are written only
// once no chunk is in hand under an earlier epoch (busy): a run that leased before the loss records its
// answered sends in the audit log when its chunk ends, and the marks must include them.
func (s *Store) MarksBack(ctx context.Context, epoch string, src MarkSource, busy func(ctx context.Context, epoch string) (int, error)) error {
	done, err := s.rdb.Get(ctx, MarksKey).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("frequency marks: %w", err)
	}
	if done == epoch {
		return nil
	}
	if n, err := busy(ctx, epoch); err != nil {
		return err
	} else if n > 0 {
		return fmt.Errorf("%w (%d chunks leased before the loss are still being recorded)", ErrMarksPending, n)
	}
	token := Token()
	ok, err := s.rdb.SetNX(ctx, marksLockKey, token, marksLockTTL).Result()
	if err != nil {
		return fmt.Errorf("frequency marks: %w", err)
	}
	if !ok {
		return s.awaitMarks(ctx, epoch)
	}
	if err := s.writeMarks(ctx, src, token); err != nil {
		s.rdb.Del(context.WithoutCancel(ctx), marksLockKey) //nolint:errcheck // the lock expires by itself
		return fmt.Errorf("write the frequency marks back after Redis lost its data: %w", err)
	}
	n, err := marksDoneScript.Run(ctx, s.rdb, []string{EpochKey, MarksKey, marksLockKey}, epoch, token).Int()
	if err != nil {
		return fmt.Errorf("frequency marks: %w", err)
	}
	if n == 0 {
		return ErrMarksPending // Redis lost its data again meanwhile: the next run starts over
	}
	return nil
}

// awaitMarks waits a few seconds for another worker to finish writing the marks back for epoch (a
// handful of milliseconds for a day's sends of a small fleet), then gives up with ErrMarksPending.
func (s *Store) awaitMarks(ctx context.Context, epoch string) error {
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); {
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		done, err := s.rdb.Get(ctx, MarksKey).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return fmt.Errorf("frequency marks: %w", err)
		}
		if done == epoch {
			return nil
		}
	}
	return ErrMarksPending
}

// writeMarks writes the marks of the recent sends (src) where Redis has none, a thousand a round trip,
// and gives each day's hash the TTL a claim would.
func (s *Store) writeMarks(ctx context.Context, src MarkSource, token string) error {
	pipe := s.rdb.Pipeline()
	keys := map[string]bool{}
	flush := func() error {
		if pipe.Len() == 0 {
			return nil
		}
		// The lock lives while the writing goes on, and not much longer once its worker is gone.
		extendLockScript.Eval(ctx, pipe, []string{marksLockKey}, token, marksLockTTL.Milliseconds()) //nolint:errcheck // read from Exec (Eval: a pipeline cannot fall back from EVALSHA)
		_, err := pipe.Exec(ctx)
		return err
	}
	longest, err := src(ctx, func(rs campaign.RecentSend) error {
		c := &campaign.Campaign{ID: rs.CampaignID, CreatedAt: rs.CampaignCreated}
		mark := markOwner(c, Nonce(c)) + "|" + strconv.FormatInt(rs.At.UnixMilli(), 10)
		if rs.Beside {
			// Another campaign's send before the latest: kept beside the latest's mark, in its hash, where
			// a claim of the latest's campaign reads it (take_mark).
			key := FrequencyKey(rs.Channel, rs.Address, rs.Latest)
			pipe.HSetNX(ctx, key, rs.Address+"\x00", mark)
			keys[key] = true
		} else {
			key := FrequencyKey(rs.Channel, rs.Address, rs.At)
			// A mark Redis kept (a failover that lost nothing) is as recent or more: it stays.
			pipe.HSetNX(ctx, key, rs.Address, mark)
			keys[key] = true
		}
		if pipe.Len() >= 1000 {
			return flush()
		}
		return nil
	})
	if err != nil {
		return err
	}
	ttl := max(campaign.DefaultFrequencyCap, longest) + markDay
	for k := range keys {
		pipe.PExpire(ctx, k, ttl)
		if pipe.Len() >= 1000 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush()
}

// marksDoneScript records that the marks were written back for the epoch, if it is still the epoch and
// the lock still ours, and releases the lock.
//
// KEYS[1] -> campaignctl:epoch
// KEYS[2] -> MarksKey
// KEYS[3] -> the lock
// ARGV[1] -> the epoch
// ARGV[2] -> the lock's token
var marksDoneScript = redis.NewScript(`
if redis.call("GET", KEYS[3]) ~= ARGV[2] then return 0 end
redis.call("DEL", KEYS[3])
if redis.call("GET", KEYS[1]) ~= ARGV[1] then return 0 end
redis.call("SET", KEYS[2], ARGV[1])
return 1`)
