package campaign_test

import (
	"context"
	"regexp"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/iys"
)

// The statuses and states the code writes into its statements are the ones the schema allows, all of
// them: a name changed on one side only fails here, not in a statement at run time.
func TestStatusesAndStatesAreTheSchemas(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	allowed := func(table, column string) []string {
		t.Helper()
		var def string
		if err := db.QueryRow(context.Background(), `SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c
			WHERE c.conrelid = $1::regclass AND c.contype = 'c' AND pg_get_constraintdef(c.oid) LIKE '%(' || $2 || ' %'`,
			table, column).Scan(&def); err != nil {
			t.Fatalf("the check on %s.%s: %v", table, column, err)
		}
		var out []string
		for _, m := range regexp.MustCompile(`'([^']*)'`).FindAllStringSubmatch(def, -1) {
			out = append(out, m[1])
		}
		slices.Sort(out)
		return out
	}
	sorted := func(s ...string) []string { slices.Sort(s); return s }
	for _, tc := range []struct {
		table, column string
		code          []string
	}{
		{"campaign_recipients", "status", sorted(campaign.StatusPending, campaign.StatusSent, campaign.StatusFailed, campaign.StatusSkipped, campaign.StatusUnknown)},
		{"campaigns", "state", sorted(string(campaign.StatePlanning), string(campaign.StateScheduled), string(campaign.StateRunning),
			string(campaign.StatePaused), string(campaign.StateCompleted), string(campaign.StateCancelled), string(campaign.StateFailed))},
		{"iys_consents", "status", sorted(iys.StatusApproved, iys.StatusRejected)},
	} {
		if diff := cmp.Diff(allowed(tc.table, tc.column), tc.code); diff != "" {
			t.Errorf("%s.%s (-schema +code):\n%s", tc.table, tc.column, diff)
		}
	}
}
