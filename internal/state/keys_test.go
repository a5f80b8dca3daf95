package state

import (
	"fmt"
	"hash/fnv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/campaignctl/campaignctl/campaign"
)

// Keys already in Redis are read by the next version: a claim's and a frequency mark's keys are spelled
// as they always were, and an address's shard is its FNV-1a hash.
func TestKeysAreSpelledAsBefore(t *testing.T) {
	t.Parallel()
	if got := ClaimKey(4217, "c00000100"); got != "sent:4217:c00000100" {
		t.Errorf("ClaimKey = %q", got)
	}
	if got := ClaimKey(-1, "çok uzun bir kullanıcı kimliği, tamponun sığdığından uzun: 0123456789"); got != "sent:-1:çok uzun bir kullanıcı kimliği, tamponun sığdığından uzun: 0123456789" {
		t.Errorf("ClaimKey = %q", got)
	}
	for i := range 2000 {
		a := fmt.Sprintf("musteri%d@example.com", i*7919)
		h := fnv.New32a()
		h.Write([]byte(a))
		if got, want := markShard(a), h.Sum32()%markShards; got != want {
			t.Fatalf("shard of %s = %d, want %d", a, got, want)
		}
	}
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	day := now.UnixMilli() / markDay.Milliseconds()
	shard := markShard("a@example.com")
	want := []string{
		fmt.Sprintf("freq:email:%d:%d", day, shard), fmt.Sprintf("freq:email:%d:%d", day-1, shard),
		fmt.Sprintf("freq:email:%d:%d", day-2, shard), fmt.Sprintf("freq:email:%d:%d", day-3, shard),
	}
	if diff := cmp.Diff(want, markKeys(campaign.ChannelEmail, "a@example.com", now, 72*time.Hour)); diff != "" {
		t.Errorf("mark keys (-want +got):\n%s", diff)
	}
	if got := FrequencyKey(campaign.ChannelSMS, "+905320000001", now); got != fmt.Sprintf("freq:sms:%d:%d", day, markShard("+905320000001")) {
		t.Errorf("FrequencyKey = %q", got)
	}
	if diff := cmp.Diff(append([]string{"k"}, want...), markDays(campaign.ChannelEmail, now, 72*time.Hour).appendKeys([]string{"k"}, "a@example.com")); diff != "" {
		t.Errorf("appended mark keys (-want +got):\n%s", diff)
	}
}
