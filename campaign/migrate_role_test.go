package campaign_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testdb"
)

// An engine role that is not a superuser migrates its own database once an administrator made it a member
// of campaignctl_audience, as the migration's own error asks: the migration granted the membership again,
// which needs the role's ADMIN OPTION, and failed. Without the membership, the error names the GRANT.
func TestAnEngineRoleThatIsNotASuperuserMigrates(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	testdb.New(t) // the cluster has campaignctl_audience, as after any other database's migration
	admin, err := pgx.Connect(ctx, testdb.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	b := make([]byte, 4)
	rand.Read(b) //nolint:errcheck // crypto/rand does not fail
	suffix := hex.EncodeToString(b)
	role, db := "campaignctl_t_eng_"+suffix, "campaignctl_t_eng_"+suffix
	for _, sql := range []string{`CREATE ROLE ` + role + ` LOGIN`, `CREATE DATABASE ` + db + ` OWNER ` + role} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, testdb.AdminURL()); err == nil {
			c.Exec(ctx, `DROP DATABASE IF EXISTS `+db+` WITH (FORCE)`) //nolint:errcheck
			c.Exec(ctx, `DROP ROLE IF EXISTS `+role)                   //nolint:errcheck
			c.Close(ctx)
		}
	})
	u, err := url.Parse(testdb.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	u.User, u.Path = url.User(role), "/"+db
	migrate := func() error {
		pool, err := pgxpool.New(ctx, u.String())
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		_, err = campaign.Migrate(ctx, pool)
		return err
	}
	if err := migrate(); err == nil || !strings.Contains(err.Error(), "GRANT campaignctl_audience TO "+role) {
		t.Fatalf("migrate as a role outside campaignctl_audience: %v; want the GRANT to ask for", err)
	}
	if _, err := admin.Exec(ctx, `GRANT campaignctl_audience TO `+role); err != nil {
		t.Fatal(err)
	}
	if err := migrate(); err != nil {
		t.Fatalf("migrate as a member of campaignctl_audience: %v", err)
	}
}
