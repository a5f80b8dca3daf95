package campaign

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseReportStatuses(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want []string
		bad  bool
	}{
		{"", nil, false},
		{"sent", []string{"sent"}, false},
		{" Failed, excluded ,failed", []string{"failed", "excluded"}, false},
		{"sent,,pending", []string{"sent", "pending"}, false},
		{"delivered", nil, true},
	} {
		got, err := ParseReportStatuses(tt.in)
		if tt.bad {
			if err == nil || !strings.Contains(err.Error(), "excluded") || strings.Contains(err.Error(), "campaign") {
				t.Errorf("%q: error %v, want one naming the valid statuses (and no campaign: the filter is not one)", tt.in, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tt.in, err)
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("%q (-want +got):\n%s", tt.in, diff)
		}
	}
}
