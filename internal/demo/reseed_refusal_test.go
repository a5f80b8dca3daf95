package demo_test

import (
	"context"
	"testing"
	"time"

	"github.com/campaignctl/campaignctl/internal/demo"
	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/iys"
)

// A demo user replies STOP (a local refusal: RET, acknowledged to the provider); then the demo is seeded
// again (to top the code pool up, say). The refusal must survive: the seed must not turn the RET back
// into the demo's 2024 ONAY.
func TestASeedRunAgainKeepsARefusal(t *testing.T) {
	pool, _ := testdb.New(t)
	ctx := context.Background()
	if _, err := demo.Seed(ctx, pool, demo.SeedOptions{Users: 10, Pool: "demo"}); err != nil {
		t.Fatal(err)
	}
	var phone string
	if err := pool.QueryRow(ctx, `SELECT phone FROM customers WHERE user_id = 'u0000001'`).Scan(&phone); err != nil {
		t.Fatal(err)
	}
	phone, err := iys.CanonicalPhone(phone)
	if err != nil {
		t.Fatal(err)
	}
	status := func() string {
		var st string
		pool.QueryRow(ctx, `SELECT status FROM iys_consents WHERE recipient = $1 AND type = 'MESAJ'`, phone).Scan(&st) //nolint:errcheck
		return st
	}
	t.Logf("user u0000001 phone %s: %s after the first seed", phone, status())
	if _, err := iys.RecordRefusals(ctx, pool, "", []iys.Refusal{{Via: iys.ViaTwilioInbound, EventID: "SM1",
		Kind: "inbound", Recipient: phone, Type: "MESAJ", Evidence: "STOP", At: time.Now()}}); err != nil {
		t.Fatal(err)
	}
	t.Logf("after the STOP: %s", status())
	if _, err := demo.Seed(ctx, pool, demo.SeedOptions{Users: 10, Pool: "demo"}); err != nil {
		t.Fatal(err)
	}
	if st := status(); st != "RET" {
		t.Errorf("after a second demo seed the refused %s is %s again, want RET: the acknowledged refusal is lost", phone, st)
	}
}
