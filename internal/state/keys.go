// Package state holds the send path's state in Redis: recipients' claims and the provider's answers in
// them, the epoch that tells when Redis lost data, campaigns' halts, frequency marks and progress
// counters. Every key the engine writes is named in this file; every script sits beside the method that
// runs it. Postgres stays the source of truth: this is what lets many workers agree, fast, on who is being
// sent right now and what the provider said.
package state

import (
	"strconv"
	"strings"
	"time"

	"github.com/campaignctl/campaignctl/campaign"
)

// The keys, all of them. Asynq keeps its own under "asynq:{campaigns}:" (its queue is named campaigns);
// go-redis/redis_rate keeps the token buckets under "rate:" followed by a bucket's name (CampaignBucket,
// ProviderBucket).
const (
	// EpochKey holds the Redis epoch (see Epoch).
	EpochKey = "campaignctl:epoch"
	// EpochServerKey holds the master the epoch was issued on: "<run_id>/<master_replid>" from INFO.
	EpochServerKey = "campaignctl:epoch:server"
	// EpochSinceKey holds when the epoch was last created or renewed, in Redis's unix milliseconds: the
	// moment a process first saw that Redis may have lost data (see EpochSince).
	EpochSinceKey = "campaignctl:epoch:since"
)

// ClaimKey is the claim of one recipient of one campaign, "sent:<campaign>:<user>" (its value: Value).
func ClaimKey(campaignID int64, userID string) string {
	// Written into one buffer: a key a recipient, one allocation each.
	var buf [64]byte
	b := strconv.AppendInt(append(buf[:0], "sent:"...), campaignID, 10)
	return string(append(append(b, ':'), userID...))
}

// InFlightGraceKey holds, in milliseconds, the longest time any worker lets a claim stay in flight before
// it counts the call as over (3 × its --provider-timeout): `resume --resend-unknown` keeps younger claims.
const InFlightGraceKey = "campaignctl:inflight_grace"

// FenceKey exists once the chunk leased under token was taken over by another run (its lease ran out, or
// its worker process was judged gone): claims made under that lease are refused from then on (see
// Guard.Fence and Store.Fence).
func FenceKey(token string) string { return "fence:" + token }

// RateKey is the Redis key of the token bucket named bucket (CampaignBucket, ProviderBucket), where
// go-redis/redis_rate keeps it.
func RateKey(bucket string) string { return "rate:" + bucket }

// HaltKey is set while a campaign is paused or cancelled; claims for sends read it.
func HaltKey(campaignID int64) string {
	return "campaign:" + strconv.FormatInt(campaignID, 10) + ":halt"
}

// HaltsKey holds the token of the last halt written for a campaign (Halt): a resume clears the halt only
// when no halt was written since it read the token (UnhaltIf).
func HaltsKey(campaignID int64) string {
	return "campaign:" + strconv.FormatInt(campaignID, 10) + ":halts"
}

// ProgressKey is the hash of a campaign's progress counters (sent, failed, skipped, unknown, and
// ProgressSegments).
func ProgressKey(campaignID int64) string {
	return "campaign:" + strconv.FormatInt(campaignID, 10) + ":progress"
}

// ProgressSegments is the field of a campaign's progress counters (ProgressKey) that counts the SMS
// segments of its sent messages: with the sent count, what a message takes of a provider cap that counts
// segments.
const ProgressSegments = "segments"

// ProgressMovedAt is the field of a campaign's progress counters (ProgressKey) that holds when, in unix
// ms, a worker last settled one of its recipients (AddProgress): whether the campaign moves, whatever one
// worker's batches wait on.
const ProgressMovedAt = "moved_at"

// CampaignBucket names a campaign's rate limit (launch --rate).
func CampaignBucket(campaignID int64) string { return "campaign:" + strconv.FormatInt(campaignID, 10) }

// ProviderBucket names a provider's rate limit.
func ProviderBucket(provider string) string { return "provider:" + provider }

// ProviderOf returns the provider whose limit bucket names, if it is a provider's.
func ProviderOf(bucket string) (string, bool) { return strings.CutPrefix(bucket, "provider:") }

// PauseKey exists while the limit named bucket is paused (a 429, a burst of 5xx); its TTL is the pause.
func PauseKey(bucket string) string { return "limiter:pause:" + bucket }

// PauseRunKey outlives each pause of the limit named bucket by PauseRunGrace and holds when the run of
// pauses began (unix ms): a provider that answers 429 to every request is paused a second at a time, and
// between two pauses it is still pushing back.
func PauseRunKey(bucket string) string { return PauseKey(bucket) + ":run" }

// PauseRunGrace is how long PauseRunKey outlives a pause.
const PauseRunGrace = 3 * time.Second

// PaceKey holds the shared pace of the limit named bucket: the rate below its cap (if any) and the counts of
// the current second's answers, by kind (see limiter.Pace).
func PaceKey(bucket string) string { return "pace:" + bucket }

// PaceProbeKey is taken (SET NX, one second) by the one request a second that may go to a provider that is
// down.
func PaceProbeKey(bucket string) string { return "pace:" + bucket + ":probe" }

// StrikesKey counts the 5xx answers of the current second for the limit named bucket.
func StrikesKey(bucket string) string { return "limiter:strikes:" + bucket }

// Frequency marks say that an address was recently messaged on a channel, across campaigns. They live in
// hashes, one per channel, UTC day and shard: field = address, value = "<campaign id>:<nonce>|<unix ms of
// the send>". A hash of a few dozen small fields is stored compactly (listpack), about 45 bytes a mark
// against some 130 for a key of its own, and a day's hashes expire together once no cap can reach them.
const (
	markShards = 8192
	markDay    = 24 * time.Hour
)

// FrequencyKey is the hash that holds address's mark on channel ch for the UTC day of t.
func FrequencyKey(ch campaign.Channel, address string, t time.Time) string {
	return markKey(ch, markShard(address), t.UnixMilli()/markDay.Milliseconds())
}

// markShard is the FNV-1a hash (32 bits) of address modulo markShards, written out: hash/fnv's costs an
// allocation a recipient for the hasher and another for the bytes. It must stay FNV-1a, so that marks
// written before are found in the same hashes (TestKeysAreSpelledAsBefore).
func markShard(address string) uint32 {
	const offset, prime = 2166136261, 16777619
	h := uint32(offset)
	for i := 0; i < len(address); i++ {
		h ^= uint32(address[i])
		h *= prime
	}
	return h % markShards
}

func markKey(ch campaign.Channel, shard uint32, day int64) string {
	var buf [64]byte
	b := append(append(append(buf[:0], "freq:"...), ch...), ':')
	b = strconv.AppendUint(append(strconv.AppendInt(b, day, 10), ':'), uint64(shard), 10)
	return string(b)
}

// markKeys are the hashes a check at now with cap must read, today's first (the one a new mark goes to).
func markKeys(ch campaign.Channel, address string, now time.Time, cap time.Duration) []string {
	return markDays(ch, now, cap).appendKeys(nil, address)
}

// campaignMarkDays returns the prefixes of the days camp's claims at now read and mark (markDays): none
// for a transactional campaign, which the frequency cap neither holds back nor counts (an order notice
// after a promotion goes out, and a promotion after it is not held back by it).
func campaignMarkDays(camp *campaign.Campaign, now time.Time) markDayPrefixes {
	if camp.Transactional {
		return nil
	}
	return markDays(camp.Channel, now, camp.FrequencyCap)
}

// markDayPrefixes are the key prefixes of the day hashes a check at some moment with some cap reads,
// today's first ("freq:<channel>:<day>:"), made once for the recipients of a call.
type markDayPrefixes []string

// markDays returns the prefixes of the days a check at now with cap reads (markKeys).
func markDays(ch campaign.Channel, now time.Time, cap time.Duration) markDayPrefixes {
	today := now.UnixMilli() / markDay.Milliseconds()
	first := (now.UnixMilli() - cap.Milliseconds()) / markDay.Milliseconds()
	days := make(markDayPrefixes, 0, 1+max(0, today-first))
	for d := today; d == today || d >= first; d-- {
		days = append(days, "freq:"+string(ch)+":"+strconv.FormatInt(d, 10)+":")
	}
	return days
}

// appendKeys appends address's hash of each day to keys.
func (days markDayPrefixes) appendKeys(keys []string, address string) []string {
	var buf [10]byte
	shard := strconv.AppendUint(buf[:0], uint64(markShard(address)), 10)
	for _, p := range days {
		keys = append(keys, p+string(shard))
	}
	return keys
}
