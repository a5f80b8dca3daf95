package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// iys check shows the address's consents under other brands too: without IYS_BRAND_CODE it said "no
// consent" for someone brand 222 holds an ONAY of, and with a brand it never named the others. With
// IYS_BASE_URL set but the API's settings incomplete, it shows what is stored here and says İYS was not
// asked, instead of failing.
func TestIYSCheckShowsTheOtherBrands(t *testing.T) {
	t.Parallel()
	env, _ := badInputDB(t)
	db, err := pgxpool.New(context.Background(), env["DATABASE_URL"])
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(context.Background(), `INSERT INTO iys_consents (recipient, type, recipient_type, brand_code, status, source, consent_date)
		VALUES ('+905321000222', 'MESAJ', 'BIREYSEL', '222', 'ONAY', 'HS_WEB', now() - interval '1 day')`); err != nil {
		t.Fatal(err)
	}
	env["IYS_BASE_URL"] = "http://127.0.0.1:1"
	out, stderr, code := cli(t, env, "iys", "check", "+905321000222", "--json")
	if code != 0 {
		t.Fatalf("iys check: exit %d\n%s%s", code, out, stderr)
	}
	var v iysCheckView
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatal(err)
	}
	if v.Local != nil || len(v.OtherBrands) != 1 || v.OtherBrands[0].Brand != "222" || v.OtherBrands[0].Status != "ONAY" || !strings.HasPrefix(v.IYSError, "not asked") {
		t.Fatalf("iys check without a brand: %s; want none here, brand 222's ONAY among the others, İYS not asked", out)
	}
}
