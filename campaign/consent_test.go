package campaign_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/internal/testdb"
)

// consentVariant is one recipient's consents, relative to the campaign: of the channel's İYS type or
// another one, for the campaign's recipient type (BIREYSEL) or TACIR, for the campaign's brand or another.
type consentVariant struct {
	name string
	rows []consentRow
}

type consentRow struct {
	otherType, tacir, otherBrand bool
	status                       string
}

var consentVariants = []consentVariant{
	{"none", nil},
	{"onay", []consentRow{{status: "ONAY"}}},
	{"ret", []consentRow{{status: "RET"}}},
	{"onay of another type", []consentRow{{otherType: true, status: "ONAY"}}},
	{"onay as tacir", []consentRow{{tacir: true, status: "ONAY"}}},
	{"onay for another brand", []consentRow{{otherBrand: true, status: "ONAY"}}},
	{"ret, onay for another brand", []consentRow{{status: "RET"}, {otherBrand: true, status: "ONAY"}}},
}

// The consent rule decides the same at plan time and at send time, for every channel, consent, opt-in,
// brand and transactional flag: the recipients a launch plans under some consents are exactly the ones a
// lease lets be sent under those consents, whether the lease reads them again (they changed since the
// campaign was planned) or takes the planned ones (nothing changed). And the launch excludes each one for
// the reason the rule gives.
func TestConsentIsDecidedAlikeAtPlanAndSendTime(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	mustExec(t, db, `CREATE TABLE aud (combo int, n int, user_id text, phone text, email text, push_token text,
		push_opt_in boolean, webhook_opt_in boolean, first_name text)`)
	mustExec(t, db, `GRANT SELECT ON aud TO campaignctl_audience`)
	store := campaign.NewStore(db)

	combo := 0
	for _, ch := range campaign.Channels() {
		for _, brand := range []string{"", "ACME"} {
			for _, transactional := range []bool{false, true} {
				combo++
				label := fmt.Sprintf("%s, brand %q, transactional %v", ch.Name, brand, transactional)
				type user struct {
					id, address string
					v           consentVariant
					optIn       bool
				}
				var users []user
				for i, v := range consentVariants {
					for _, optIn := range []bool{false, true} {
						n := 2*i + btoi(optIn)
						id := fmt.Sprintf("c%02d-u%02d", combo, n)
						phone := fmt.Sprintf("+90532%02d%05d", combo, n)
						addr := map[string]string{"phone": phone, "email": fmt.Sprintf("c%du%d@example.com", combo, n),
							"push_token": fmt.Sprintf("tok-%d-%d", combo, n), "user_id": id}[ch.AddressColumn]
						if addr == "" {
							t.Fatalf("%s: the test has no address for column %s", label, ch.AddressColumn)
						}
						users = append(users, user{id, addr, v, optIn})
						mustExec(t, db, `INSERT INTO aud VALUES ($1, $2, $3, $4, $5, $6, true, true, 'Ada')`,
							combo, n, id, phone, fmt.Sprintf("c%du%d@example.com", combo, n), fmt.Sprintf("tok-%d-%d", combo, n))
					}
				}
				ownType, otherType := ch.IYSType, "MESAJ"
				if ownType == "" {
					ownType = "MESAJ" // no İYS type: consents of any type must change nothing
				}
				if ownType == "MESAJ" {
					otherType = "EPOSTA"
				}
				setConsents := func(rows func(u user) []consentRow) {
					t.Helper()
					for _, u := range users {
						mustExec(t, db, `DELETE FROM iys_consents WHERE recipient = $1`, u.address)
						for _, r := range rows(u) {
							typ, rt, b := ownType, "BIREYSEL", brand
							if r.otherType {
								typ = otherType
							}
							if r.tacir {
								rt = "TACIR"
							}
							if r.otherBrand {
								b = "OTHER"
							}
							mustExec(t, db, `INSERT INTO iys_consents (recipient, type, recipient_type, status, source, consent_date, brand_code)
								VALUES ($1, $2, $3, $4, 'HS_WEB', now(), $5)`, u.address, typ, rt, r.status, b)
						}
					}
				}
				sp := func(name string) campaign.Spec {
					return campaign.Spec{Name: name, Channel: ch.Name, BrandCode: brand, Transactional: transactional,
						AudienceSQL: fmt.Sprintf(`SELECT user_id, phone, email, push_token, push_opt_in, webhook_opt_in, first_name
							FROM aud WHERE combo = %d ORDER BY n`, combo),
						Message: `Merhaba {{.first_name}}`, Subject: "Merhaba", BatchSize: 1000}
				}

				// Campaign A is planned while everybody may be sent, so that the lease sees every recipient.
				setConsents(func(user) []consentRow { return []consentRow{{status: "ONAY"}} })
				repA, err := (&campaign.Planner{Engine: db, Audience: db}).Plan(ctx, sp(fmt.Sprintf("a%d", combo)))
				if err != nil || repA.Eligible != int64(len(users)) {
					t.Fatalf("%s: campaign A plans %d of %d (%v)", label, repA.Eligible, len(users), err)
				}

				// Then the consents and opt-ins become the variants', and campaign B is planned on them.
				setConsents(func(u user) []consentRow { return u.v.rows })
				for _, u := range users {
					mustExec(t, db, `UPDATE aud SET push_opt_in = $2, webhook_opt_in = $2 WHERE user_id = $1`, u.id, u.optIn)
				}
				// A's recipients carry the values the plan read from the audience: an opt-in is what a
				// launch on today's audience would read.
				mustExec(t, db, `UPDATE campaign_recipients r SET vars = r.vars || jsonb_build_object('push_opt_in', a.push_opt_in, 'webhook_opt_in', a.webhook_opt_in)
					FROM aud a WHERE r.campaign_id = $1 AND a.user_id = r.user_id`, repA.ID)
				repB, err := (&campaign.Planner{Engine: db, Audience: db}).Plan(ctx, sp(fmt.Sprintf("b%d", combo)))
				if err != nil {
					t.Fatalf("%s: campaign B: %v", label, err)
				}

				var wantPlanned []string
				wantExcluded := map[string]int64{}
				for _, u := range users {
					if reason := expectedRefusal(ch, transactional, u.v, u.optIn); reason != "" {
						wantExcluded[reason]++
					} else {
						wantPlanned = append(wantPlanned, u.id)
					}
				}
				if diff := cmp.Diff(wantExcluded, repB.Excluded); diff != "" {
					t.Errorf("%s: the launch excludes (-want +got):\n%s", label, diff)
				}
				planned := recipientsOf(t, db, repB.ID, 0)
				if diff := cmp.Diff(wantPlanned, planned); diff != "" {
					t.Errorf("%s: the launch plans (-want +got):\n%s", label, diff)
				}

				// A's lease reads the consents again (they changed after A was planned); B's takes the
				// consents B was planned on (nothing changed since). Both decide as the launch did.
				for _, run := range []struct {
					name string
					id   int64
				}{{"a lease reading the consents again", repA.ID}, {"a lease taking the planned consents", repB.ID}} {
					c, err := store.Get(ctx, run.id)
					if err != nil {
						t.Fatal(err)
					}
					ids := recipientsOf(t, db, run.id, 0)
					chunk, err := store.LeaseChunk(ctx, c, ids, campaign.Lease{Batch: 0, Token: fmt.Sprintf("run-%d", run.id), Epoch: "e", TTL: time.Minute})
					if err != nil {
						t.Fatalf("%s: %s: %v", label, run.name, err)
					}
					if len(chunk.Leased) != len(ids) {
						t.Fatalf("%s: %s leased %d of %d", label, run.name, len(chunk.Leased), len(ids))
					}
					var sendable []string
					for _, u := range users {
						if slices.Contains(ids, u.id) && chunk.Consent[u.address] {
							sendable = append(sendable, u.id)
						}
					}
					if diff := cmp.Diff(planned, sendable); diff != "" {
						t.Errorf("%s: %s lets be sent (-the launch +the lease):\n%s", label, run.name, diff)
					}
				}
			}
		}
	}
}

// expectedRefusal is the rule as law 6563 and the design card state it, written out by hand: why a
// recipient with variant v's consents and this opt-in is excluded ("" when it is not).
func expectedRefusal(ch campaign.ChannelSpec, transactional bool, v consentVariant, optIn bool) string {
	switch {
	case transactional:
		return ""
	case ch.IYSType == "":
		if optIn {
			return ""
		}
		return campaign.ReasonNoOptIn
	}
	for _, r := range v.rows {
		if !r.otherType && !r.tacir && !r.otherBrand {
			if r.status == "ONAY" {
				return ""
			}
			return campaign.ReasonConsentRET
		}
	}
	return campaign.ReasonNoConsent
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
