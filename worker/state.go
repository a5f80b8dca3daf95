package worker

import (
	"context"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/state"
)

// State is what the send path keeps in Redis (internal/state): the recipients' claims and the
// provider's answers in them, the epoch, halts, frequency marks and progress counters. *state.Store
// implements it on a real Redis; tests put faults in front of it (internal/faults).
type State interface {
	// Epoch returns the Redis epoch, renewed when the master is not the one that issued it.
	Epoch(ctx context.Context) (string, error)
	// MarksBack returns once the frequency marks of the recent sends are in Redis for epoch (written back
	// from src by the worker that gets the lock after a data loss), or ErrMarksPending meanwhile.
	MarksBack(ctx context.Context, epoch string, src state.MarkSource, busy func(ctx context.Context, epoch string) (int, error)) error
	// ClaimSend claims one recipient just before its provider call (and writes prev, the answer to the
	// run's previous send).
	ClaimSend(ctx context.Context, c *campaign.Campaign, nonce string, sc state.SendClaim, g state.Guard, prev *state.Answer, pauseKey string, now time.Time) (state.Claimed, error)
	// ClaimWindow claims a window of sends, or the recipients of one request, about to go out together,
	// all or none, after writing the answers of the window before and checking the provider's pause.
	ClaimWindow(ctx context.Context, c *campaign.Campaign, nonce string, scs []state.SendClaim, g state.Guard, prev []state.Answer, pauseKey string, now time.Time) ([]state.Claimed, time.Duration, error)
	// StillGuarded checks, a while after claims were taken under g, that their sends may still leave:
	// ErrEpoch, ErrFenced or ErrHalted when not.
	StillGuarded(ctx context.Context, g state.Guard) error
	// Take sets a claim that is not sent (skipped, unknown) unless one exists, which it returns.
	Take(ctx context.Context, key, nonce, val string, g state.Guard) (old string, ours bool, err error)
	// Settle and SettleMany write answers into claims we hold; Release and ReleaseMany delete claims
	// we hold whose sends were not accepted.
	Settle(ctx context.Context, key, nonce, inflight, answer string) error
	SettleMany(ctx context.Context, keys []string, nonce string, inflight, vals []string) error
	Release(ctx context.Context, key, nonce, inflight string) error
	ReleaseMany(ctx context.Context, keys []string, nonce string, inflight []string) error
	// ReleaseMarks removes this campaign's frequency marks on addresses nobody reached.
	ReleaseMarks(ctx context.Context, c *campaign.Campaign, nonce string, addrs []string, now time.Time) error
	// ReadClaims reads claims while the epoch is still epoch.
	ReadClaims(ctx context.Context, epoch string, keys []string) ([]any, error)
	// Fence refuses every claim under another run's lease token from now on, before its lease is taken.
	Fence(ctx context.Context, epoch, token string) error
	// AddProgress advances a campaign's progress counters.
	AddProgress(ctx context.Context, campaignID int64, moved map[string]int64) error
}

var _ State = (*state.Store)(nil)

// Names and operations of the state other packages use.

// EpochKey holds the Redis epoch (see state.Epoch).
const EpochKey = state.EpochKey

// EpochServerKey holds the master the epoch was issued on.
const EpochServerKey = state.EpochServerKey

// ErrNotMaster: the Redis a client reached is a replica.
var ErrNotMaster = state.ErrNotMaster

// ClaimKey is the claim of one recipient of a campaign, sent:<campaign>:<user>.
func ClaimKey(campaignID int64, userID string) string { return state.ClaimKey(campaignID, userID) }

// HaltKey is set while a campaign is paused or cancelled.
func HaltKey(campaignID int64) string { return state.HaltKey(campaignID) }

// ProgressKey is the hash of a campaign's progress counters.
func ProgressKey(campaignID int64) string { return state.ProgressKey(campaignID) }

// FrequencyKey is the hash that holds address's frequency mark on ch for the UTC day of t.
func FrequencyKey(ch campaign.Channel, address string, t time.Time) string {
	return state.FrequencyKey(ch, address, t)
}

// Nonce tells one campaign from another that had the same ID (see state.Nonce).
func Nonce(c *campaign.Campaign) string { return state.Nonce(c) }

// Epoch returns the current Redis epoch (see state.Epoch).
func Epoch(ctx context.Context, rdb redis.Scripter) (string, error) { return state.Epoch(ctx, rdb) }

// Halt stops every new send of a campaign on every worker, for ttl (see state.Halt).
func Halt(ctx context.Context, rdb redis.UniversalClient, campaignID int64, why string, ttl time.Duration) error {
	return state.Halt(ctx, rdb, campaignID, why, ttl)
}

// Unhalt lets a campaign's sends go on.
func Unhalt(ctx context.Context, rdb redis.UniversalClient, campaignID int64) error {
	return state.Unhalt(ctx, rdb, campaignID)
}

// ForgetUnanswered deletes the claims of users that hold no provider answer, for `resume --resend-unknown`,
// except those in flight taken less than grace ago, which it returns (see state.Store.ForgetUnanswered).
func ForgetUnanswered(ctx context.Context, rdb redis.UniversalClient, c *campaign.Campaign, users []string, grace time.Duration) ([]string, error) {
	return state.New(rdb, DefaultClaimTTL).ForgetUnanswered(ctx, c, users, grace)
}

// CheckEpochOnConnect returns a go-redis OnConnect hook that checks the epoch on every new connection.
func CheckEpochOnConnect(next func(context.Context, *redis.Conn) error, log *slog.Logger) func(context.Context, *redis.Conn) error {
	return state.CheckEpochOnConnect(next, log)
}

// CheckMasterOnConnect returns a go-redis OnConnect hook that checks every new connection reached the
// master, creating and renewing no epoch: for a client that takes no claims (see state.CheckMasterOnConnect).
func CheckMasterOnConnect(next func(context.Context, *redis.Conn) error) func(context.Context, *redis.Conn) error {
	return state.CheckMasterOnConnect(next)
}
