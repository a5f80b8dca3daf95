package worker

import (
	"context"
	"strings"
	"testing"

	"github.com/campaignctl/campaignctl/internal/testredis"
)

func TestRedisVersionCheck(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		info string
		want string // "" when the version is accepted
	}{
		{"# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n", ""},
		{"# Server\r\nredis_version:7.2.4\r\n", ""},
		{"# Server\r\nredis_version:8.0.2\r\n", ""},
		{"# Server\r\nredis_version:6.2.14\r\n", "Redis 6.2.14 is too old"},
		{"# Server\r\nredis_mode:standalone\r\n", "of unknown version"},
	} {
		err := checkVersionInfo(tc.info)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q refused: %v", tc.info, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "7.0 or later")):
			t.Errorf("%q: %v, want an error naming %q and the fix", tc.info, err, tc.want)
		}
	}
	// The local server (Redis 7) passes.
	rdb, _ := testredis.New(t)
	if err := CheckRedisVersion(context.Background(), rdb); err != nil {
		t.Fatal(err)
	}
}
