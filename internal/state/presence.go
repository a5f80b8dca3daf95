package state

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// WorkerKey is a worker process's heartbeat, "campaignctl:worker:<owner>" (a WorkerInfo in JSON, expiring
// WorkerTTL after it was last written).
func WorkerKey(owner string) string { return workerPrefix + owner }

// LocalOwner is the owner name of a worker process: "<host name>:<pid>".
func LocalOwner() string {
	host, _ := os.Hostname()
	return host + ":" + strconv.Itoa(os.Getpid())
}

// LocalPID is the process ID of owner when it is a worker of this machine (LocalOwner's form).
func LocalPID(owner string) (int, bool) {
	host, err := os.Hostname()
	i := strings.LastIndexByte(owner, ':')
	if err != nil || i <= 0 || owner[:i] != host {
		return 0, false
	}
	pid, err := strconv.Atoi(owner[i+1:])
	return pid, err == nil
}

const workerPrefix = "campaignctl:worker:"

// WaitingKey is the hash of what a campaign's batches wait on, as workers noted it: a reason each
// (provider_auth, …) with a Waiting in JSON; the hash expires WaitingTTL after its last note.
func WaitingKey(campaignID int64) string {
	return "campaign:" + strconv.FormatInt(campaignID, 10) + ":waiting"
}

// WorkerTTL is how long a worker's heartbeat lasts unrenewed; a worker renews it every WorkerTTL/3.
const WorkerTTL = 30 * time.Second

// WorkerLook is how often a worker looks, between two beats, whether its heartbeat is still in Redis:
// one that Redis lost with its data is written again at once, so that status does not say "no worker is
// running" for up to a beat while the worker sends.
const WorkerLook = 2 * time.Second

// WorkerPublished says whether owner's heartbeat is in Redis; false when Redis does not answer (a write
// of it is tried then, and fails or restores it).
func WorkerPublished(ctx context.Context, rdb redis.UniversalClient, owner string) bool {
	n, err := rdb.Exists(ctx, WorkerKey(owner)).Result()
	return err == nil && n == 1
}

// WaitingTTL is how long a waiting note lasts unrenewed: a batch that waits notes it again at each try.
const WaitingTTL = 2 * time.Minute

// WorkerInfo is what a worker publishes about itself.
type WorkerInfo struct {
	Owner string `json:"owner"`
	// Providers maps each channel the worker sends to its provider ("sms": "twilio").
	Providers map[string]string `json:"providers"`
	// Fallbacks maps a channel to the provider its sends fail over to ("sms": "netgsm"), and FailedOver
	// lists the channels whose sends this worker passes to it as of its last beat (the first is down).
	Fallbacks  map[string]string `json:"fallbacks,omitempty"`
	FailedOver map[string]bool   `json:"failed_over,omitempty"`
	// Commercial lists the channels whose commercial messages it may send (e-mail needs the unsubscribe
	// link settings).
	Commercial map[string]bool `json:"commercial"`
	Started    time.Time       `json:"started"`
	// Holder is the key of the Postgres advisory lock the worker holds while it lives (worker.Liveness),
	// 0 when none: a process killed outright lets it go at once, long before its heartbeat expires.
	Holder int64 `json:"holder,omitempty"`
	// InFlightGrace, when set, is noted in Redis with every heartbeat (NoteInFlightGrace): a Redis that
	// lost its data has it again within a beat, while the worker's provider calls may still be answered.
	InFlightGrace time.Duration `json:"-"`
}

// PublishWorker writes w's heartbeat (WorkerTTL), notes when a worker, and one for each of its channels,
// was last seen (SeenKey), and raises the in-flight grace to w's.
func PublishWorker(ctx context.Context, rdb redis.UniversalClient, w WorkerInfo) error {
	b, _ := json.Marshal(w)
	now := strconv.FormatInt(time.Now().UnixMilli(), 10)
	seen := []any{SeenAny, now}
	for ch := range w.Providers {
		seen = append(seen, ch, now)
		if w.Commercial[ch] {
			seen = append(seen, ch+SeenCommercial, now)
		}
	}
	pipe := rdb.TxPipeline()
	pipe.Set(ctx, WorkerKey(w.Owner), b, WorkerTTL)
	pipe.HSet(ctx, SeenKey, seen...)
	pipe.PExpire(ctx, SeenKey, seenTTL)
	if w.InFlightGrace > 0 {
		raiseScript.Eval(ctx, pipe, []string{InFlightGraceKey}, w.InFlightGrace.Milliseconds())
	}
	_, err := pipe.Exec(ctx)
	return err
}

// SeenKey is the hash of when a worker's heartbeat was last written: SeenAny for any worker, a channel
// for one that sends it, the channel and SeenCommercial for one that may send its commercial messages
// (unix ms). campaignctl status says since when a campaign waits for a worker from it.
const SeenKey = "campaignctl:seen:workers"

// The fields of SeenKey besides the channels.
const (
	SeenAny        = "any"
	SeenCommercial = ":commercial"
)

// seenTTL keeps the last sighting of a worker long after the last one stopped.
const seenTTL = 30 * 24 * time.Hour

// LastSeen returns when a worker was last seen (SeenKey's fields); a field never written is absent.
func LastSeen(ctx context.Context, rdb redis.UniversalClient) (map[string]time.Time, error) {
	m, err := rdb.HGetAll(ctx, SeenKey).Result()
	if err != nil {
		return nil, fmt.Errorf("workers last seen: %w", err)
	}
	out := make(map[string]time.Time, len(m))
	for k, v := range m {
		if ms, err := strconv.ParseInt(v, 10, 64); err == nil {
			out[k] = time.UnixMilli(ms).UTC()
		}
	}
	return out, nil
}

// RemoveWorker deletes w's heartbeat (a worker stopping).
func RemoveWorker(ctx context.Context, rdb redis.UniversalClient, owner string) error {
	return rdb.Del(ctx, WorkerKey(owner)).Err()
}

// Workers returns the workers whose heartbeat is alive.
func Workers(ctx context.Context, rdb redis.UniversalClient) ([]WorkerInfo, error) {
	var keys []string
	iter := rdb.Scan(ctx, 0, workerPrefix+"*", 100).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return nil, fmt.Errorf("workers: %w", err)
	}
	if len(keys) == 0 {
		return nil, nil
	}
	vals, err := rdb.MGet(ctx, keys...).Result()
	if err != nil {
		return nil, fmt.Errorf("workers: %w", err)
	}
	var out []WorkerInfo
	for _, v := range vals {
		s, ok := v.(string)
		if !ok {
			continue
		}
		var w WorkerInfo
		if json.Unmarshal([]byte(s), &w) == nil {
			out = append(out, w)
		}
	}
	return out, nil
}

// Waiting is what a campaign waits on.
type Waiting struct {
	Reason string     `json:"reason"`
	Detail string     `json:"detail"`
	Since  *time.Time `json:"since"`
	Until  *time.Time `json:"until"`
}

// NoteWaiting records that a batch of campaign id waits on w.Reason; the first note of a reason keeps its
// Since.
func NoteWaiting(ctx context.Context, rdb redis.UniversalClient, id int64, w Waiting) error {
	key := WaitingKey(id)
	if old, err := rdb.HGet(ctx, key, w.Reason).Result(); err == nil {
		var prev Waiting
		if json.Unmarshal([]byte(old), &prev) == nil && prev.Since != nil {
			w.Since = prev.Since
		}
	}
	if w.Since == nil {
		now := time.Now().UTC()
		w.Since = &now
	}
	b, _ := json.Marshal(w)
	pipe := rdb.TxPipeline()
	pipe.HSet(ctx, key, w.Reason, b)
	pipe.Expire(ctx, key, WaitingTTL)
	_, err := pipe.Exec(ctx)
	return err
}

// ClearWaiting removes the note of reason for campaign id (the batch got past it).
func ClearWaiting(ctx context.Context, rdb redis.UniversalClient, id int64, reason string) error {
	return rdb.HDel(ctx, WaitingKey(id), reason).Err()
}

// Waits returns the notes of campaign id by reason.
func Waits(ctx context.Context, rdb redis.UniversalClient, id int64) (map[string]Waiting, error) {
	m, err := rdb.HGetAll(ctx, WaitingKey(id)).Result()
	if err != nil {
		return nil, err
	}
	out := map[string]Waiting{}
	for k, v := range m {
		var w Waiting
		if json.Unmarshal([]byte(v), &w) == nil {
			out[k] = w
		}
	}
	return out, nil
}
