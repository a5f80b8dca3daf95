package campaign_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testdb"
)

// dupRow is a row of a test audience with duplicates: a user, a number (NULL when ""), a name (NULL when
// ""), in the query's order.
type dupRow struct{ user, phone, name string }

// planDup plans rows (ONAY for the numbers of onay, RET for those of ret, nothing for the others) and
// returns the launch's report and each excluded row's reason as "user number reason", sorted.
func planDup(t *testing.T, db *pgxpool.Pool, name string, rows []dupRow, onay, ret []string) (campaign.Report, []string) {
	t.Helper()
	table := "aud_" + strings.ReplaceAll(name, "-", "_")
	mustExec(t, db, `CREATE TABLE `+table+` (ord int, user_id text, phone text, first_name text)`)
	mustExec(t, db, `GRANT SELECT ON `+table+` TO campaignctl_audience`)
	for i, r := range rows {
		mustExec(t, db, `INSERT INTO `+table+` VALUES ($1, $2, NULLIF($3, ''), NULLIF($4, ''))`, i, r.user, r.phone, r.name)
	}
	for _, list := range []struct {
		status  string
		numbers []string
	}{{"ONAY", onay}, {"RET", ret}} {
		for _, n := range list.numbers {
			mustExec(t, db, `INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date)
				VALUES ($1, 'MESAJ', 'BIREYSEL', $2, 'HS_WEB', now()) ON CONFLICT DO NOTHING`, n, list.status)
		}
	}
	s := spec(name)
	s.AudienceSQL = `SELECT user_id, phone, first_name FROM ` + table + ` ORDER BY ord`
	rep, err := (&campaign.Planner{Engine: db, Audience: db}).Plan(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	return rep, texts(t, db, `SELECT user_id || ' ' || coalesce(address, '-') || ' ' || reason FROM campaign_exclusions
		WHERE campaign_id = $1 ORDER BY 1`, rep.ID)
}

func withCodes(t *testing.T, db *pgxpool.Pool, n int) {
	t.Helper()
	mustExec(t, db, `INSERT INTO code_pools (name) VALUES ('p')`)
	mustExec(t, db, `INSERT INTO promo_codes (pool, code) SELECT 'p', 'K' || g FROM generate_series(1, $1::int) g`, n)
}

// The rows are taken one by one in the query's order: a row that can be sent is planned when neither its
// customer nor its number is planned yet. U's first number goes to A and its second to V (each came
// first there), and U keeps its third, which nobody takes: before, U was lost (its second row gave way to a
// number V took only by giving way itself). And a row not planned says why: duplicate_user only when its
// customer is planned on another row, duplicate_address only when another customer is planned on its
// number, else its own reason (two customers on one refused number both refused it).
func TestRowsAreTakenOneByOneInTheQueryOrder(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	withCodes(t, db, 20)
	const n1, n2, n3, n4, n5, n6 = "+905321000001", "+905321000002", "+905321000003", "+905321000004", "+905321000005", "+905321000006"
	rep, excluded := planDup(t, db, "in-order", []dupRow{
		{"A", n1, "Ali"}, {"V", n1, "Veli"}, {"U", n1, "Ulaş"}, {"V", n2, "Veli"}, {"U", n2, "Ulaş"}, {"U", n3, "Ulaş"},
		// R1 and R2 on one refused number; Z's first number is A's, its second refused, its third has no
		// name: Z is planned nowhere, and each of its rows says why.
		{"R1", n4, "Rana"}, {"R2", n4, "Rıza"},
		{"Z", n1, "Zeki"}, {"Z", n5, "Zeki"}, {"Z", n6, ""},
	}, []string{n1, n2, n3, n6}, []string{n4, n5})
	got := texts(t, db, `SELECT user_id || ' ' || address FROM campaign_recipients WHERE campaign_id = $1 ORDER BY 1`, rep.ID)
	if diff := cmp.Diff([]string{"A " + n1, "U " + n3, "V " + n2}, got); diff != "" {
		t.Errorf("planned (-want +got):\n%s", diff)
	}
	want := []string{
		"R1 " + n4 + " consent_ret", "R2 " + n4 + " consent_ret",
		"U " + n1 + " duplicate_user", "U " + n2 + " duplicate_user", "V " + n1 + " duplicate_user",
		"Z " + n1 + " duplicate_address", "Z " + n5 + " consent_ret", "Z " + n6 + " missing_value",
	}
	if diff := cmp.Diff(want, excluded); diff != "" {
		t.Errorf("excluded rows (-want +got):\n%s", diff)
	}
}

// Random audiences with many duplicates (40 customers on 30 numbers, with refused, unconsented and missing
// numbers and names) are planned exactly as taking their rows one by one in the query's order plans them,
// and every row excluded gives the reason that walk gives it.
func TestClassificationIsTakingTheRowsInOrder(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	withCodes(t, db, 400)
	number := func(i int) string { return fmt.Sprintf("+90532200%04d", i) }
	var onay, ret []string
	for i := range 30 {
		switch i % 6 {
		case 0:
			ret = append(ret, number(i))
		case 1: // no consent at all
		default:
			onay = append(onay, number(i))
		}
	}
	for seed := range 6 {
		rng := rand.New(rand.NewPCG(uint64(seed), 18))
		var rows []dupRow
		for range 120 {
			r := dupRow{user: fmt.Sprintf("c%d", rng.IntN(40)), phone: number(rng.IntN(30)), name: "Ada"}
			switch rng.IntN(12) {
			case 0:
				r.phone = ""
			case 1:
				r.name = ""
			}
			rows = append(rows, r)
		}
		// The walk: each row's own reason first (as the launch orders them), then who is taken.
		own := func(r dupRow) string {
			switch {
			case r.phone == "":
				return "invalid_address"
			case r.name == "":
				return "missing_value"
			case slices.Contains(ret, r.phone):
				return "consent_ret"
			case !slices.Contains(onay, r.phone):
				return "no_consent"
			}
			return ""
		}
		users, numbers := map[string]bool{}, map[string]bool{}
		taken := make([]bool, len(rows))
		for i, r := range rows {
			if own(r) == "" && !users[r.user] && !numbers[r.phone] {
				users[r.user], numbers[r.phone], taken[i] = true, true, true
			}
		}
		var wantPlanned, wantExcluded []string
		for i, r := range rows {
			switch {
			case taken[i]:
				wantPlanned = append(wantPlanned, r.user+" "+r.phone)
				continue
			case users[r.user]:
				wantExcluded = append(wantExcluded, r.user+" "+dash(r.phone)+" duplicate_user")
			case own(r) != "":
				wantExcluded = append(wantExcluded, r.user+" "+dash(r.phone)+" "+own(r))
			default:
				wantExcluded = append(wantExcluded, r.user+" "+r.phone+" duplicate_address")
			}
		}
		name := fmt.Sprintf("random-%d", seed)
		rep, excluded := planDup(t, db, name, rows, onay, ret)
		planned := texts(t, db, `SELECT user_id || ' ' || address FROM campaign_recipients WHERE campaign_id = $1 ORDER BY 1`, rep.ID)
		if diff := cmp.Diff(slices.Sorted(slices.Values(wantPlanned)), planned); diff != "" {
			t.Errorf("%s: planned (-walk +launch):\n%s", name, diff)
		}
		if diff := cmp.Diff(slices.Sorted(slices.Values(wantExcluded)), excluded); diff != "" {
			t.Errorf("%s: excluded rows (-walk +launch):\n%s", name, diff)
		}
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
