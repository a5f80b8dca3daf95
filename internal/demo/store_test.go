package demo_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/campaignctl/campaignctl/codes"
	"github.com/campaignctl/campaignctl/internal/demo"
	"github.com/campaignctl/campaignctl/internal/testdb"
	"github.com/campaignctl/campaignctl/iys"
)

type customer struct {
	UserID, FirstName, LastName, Phone, Email, City, PushToken string
	LastNameNull, PushTokenNull                                bool
	OptedInPush                                                bool
}

func customers(t *testing.T, db *pgxpool.Pool) []customer {
	t.Helper()
	rows, err := db.Query(context.Background(), `
		SELECT user_id, first_name, coalesce(last_name, ''), last_name IS NULL, phone, email, city,
		       coalesce(push_token, ''), push_token IS NULL, opted_in_push
		FROM customers ORDER BY user_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []customer
	for rows.Next() {
		var c customer
		if err := rows.Scan(&c.UserID, &c.FirstName, &c.LastName, &c.LastNameNull, &c.Phone, &c.Email, &c.City,
			&c.PushToken, &c.PushTokenNull, &c.OptedInPush); err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// consents returns the BIREYSEL consents as "recipient type" → status.
func consents(t *testing.T, db *pgxpool.Pool) map[string]string {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT recipient, type, status FROM iys_consents WHERE recipient_type = 'BIREYSEL'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var r, typ, st string
		if err := rows.Scan(&r, &typ, &st); err != nil {
			t.Fatal(err)
		}
		out[r+" "+typ] = st
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// expected is the consent status the package comment promises user k for a bucket value b.
func expected(b int) string {
	switch {
	case b < 85:
		return iys.StatusApproved
	case b < 90:
		return iys.StatusRejected
	}
	return ""
}

func TestSeed(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	const users = 2000

	var mu sync.Mutex
	var calls, lastDone, lastTotal int
	rep, err := demo.Seed(ctx, db, demo.SeedOptions{Users: users, Progress: func(done, total int) {
		mu.Lock()
		defer mu.Unlock()
		if done < lastDone || done > total {
			t.Errorf("progress went from %d to %d of %d", lastDone, done, total)
		}
		calls, lastDone, lastTotal = calls+1, done, total
	}})
	if err != nil {
		t.Fatal(err)
	}
	want := demo.SeedReport{Customers: 2000, InvalidPhones: 20, SharedPhones: 4,
		SMSApproved: 1698, SMSRejected: 100, EmailApproved: 1700, EmailRejected: 100,
		Pool: "demo", CodesGenerated: 2000, CodesFree: 2000}
	if diff := cmp.Diff(want, rep); diff != "" {
		t.Errorf("report (-want +got):\n%s", diff)
	}
	if calls < 3 || lastDone != lastTotal || lastTotal != 2*users+2000 {
		t.Errorf("progress: %d calls, last %d of %d", calls, lastDone, lastTotal)
	}

	cs := customers(t, db)
	stored := consents(t, db)
	if len(cs) != users {
		t.Fatalf("%d customers, want %d", len(cs), users)
	}
	owner := map[string]string{} // canonical phone → first user with it
	var invalid, shared, nonASCII, smsOnay, smsRet, mailOnay, mailRet int
	spellings := map[int]bool{}
	for k, c := range cs {
		if want := "u" + strings.Repeat("0", 7-len(strconv.Itoa(k+1))) + strconv.Itoa(k+1); c.UserID != want {
			t.Fatalf("customer %d is %s, want %s", k, c.UserID, want)
		}
		if utf8.RuneCountInString(c.FirstName) != len(c.FirstName) {
			nonASCII++
		}
		if c.LastNameNull != (k%50 == 49) || c.PushTokenNull != (k%10 == 9) || c.OptedInPush != (k%10 < 6) {
			t.Errorf("user %d: %+v", k, c)
		}
		if got, err := iys.CanonicalEmail(c.Email); err != nil || got != c.Email || !strings.HasSuffix(c.Email, "."+strconv.Itoa(k+1)+"@example.com") {
			t.Errorf("user %d: e-mail %q is not canonical (%v)", k, c.Email, err)
		}
		if st := stored[c.Email+" EPOSTA"]; st != expected((k+50)%100) {
			t.Errorf("user %d: EPOSTA consent %q, want %q", k, st, expected((k+50)%100))
		}
		switch stored[c.Email+" EPOSTA"] {
		case iys.StatusApproved:
			mailOnay++
		case iys.StatusRejected:
			mailRet++
		}

		phone, err := iys.CanonicalPhone(c.Phone)
		if (err != nil) != (k%100 == 99) {
			t.Errorf("user %d: phone %q canonicalises to %q, %v", k, c.Phone, phone, err)
		}
		if err != nil {
			invalid++
			if st, ok := stored[c.Phone+" MESAJ"]; ok {
				t.Errorf("user %d: invalid phone %q has consent %s", k, c.Phone, st)
			}
			continue
		}
		if !strings.HasPrefix(phone, "+905") || phone[4] < '3' || phone[4] > '5' {
			t.Errorf("user %d: phone %s is not in 530–559", k, phone)
		}
		spellings[len(c.Phone)] = true
		if first, ok := owner[phone]; ok {
			shared++
			if k%1000 != 501 {
				t.Errorf("user %d shares %s with %s", k, phone, first)
			}
		} else {
			owner[phone] = c.UserID
		}
		st := stored[phone+" MESAJ"]
		if st != expected(k%100) {
			t.Errorf("user %d: MESAJ consent %q, want %q", k, st, expected(k%100))
		}
		switch st {
		case iys.StatusApproved:
			smsOnay++
		case iys.StatusRejected:
			smsRet++
		}
	}
	if invalid != 20 || shared != 2 || nonASCII == 0 || len(spellings) != 4 {
		t.Errorf("%d invalid phones (want 20), %d shared (want 2), %d non-ASCII first names, %d phone spellings (want 4)",
			invalid, shared, nonASCII, len(spellings))
	}
	// Per user, exactly the documented fractions.
	if smsOnay != 1700 || smsRet != 100 || mailOnay != 1700 || mailRet != 100 {
		t.Errorf("users with MESAJ ONAY/RET %d/%d (want 1700/100), EPOSTA %d/%d (want 1700/100)", smsOnay, smsRet, mailOnay, mailRet)
	}
	// Every stored consent belongs to a seeded user.
	if len(stored) != 1698+100+1700+100 {
		t.Errorf("%d consents stored, want %d", len(stored), 1698+100+1700+100)
	}

	// The pool covers every user, and its codes are real generated codes.
	if free, err := codes.Free(ctx, db, "demo"); err != nil || free < users {
		t.Errorf("demo pool: %d free, %v", free, err)
	}
}

func TestSeedTwiceIsTheSame(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	if _, err := demo.Seed(ctx, db, demo.SeedOptions{Users: 1500, Pool: "p1"}); err != nil {
		t.Fatal(err)
	}
	firstCustomers, firstConsents := customers(t, db), consents(t, db)

	// Meanwhile a consent changes and a customer is edited; the second Seed puts both back.
	if _, err := db.Exec(ctx, `UPDATE iys_consents SET status = 'RET' WHERE type = 'MESAJ' AND status = 'ONAY'
		AND recipient = (SELECT min(recipient) FROM iys_consents WHERE type = 'MESAJ' AND status = 'ONAY')`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `UPDATE customers SET first_name = 'X' WHERE user_id = 'u0000001'`); err != nil {
		t.Fatal(err)
	}
	rep, err := demo.Seed(ctx, db, demo.SeedOptions{Users: 1500, Pool: "p1"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.CodesGenerated != 0 || rep.CodesFree != 1500 || rep.Customers != 1500 {
		t.Errorf("second Seed: %+v; want no new codes, 1500 free, 1500 customers", rep)
	}
	if diff := cmp.Diff(firstCustomers, customers(t, db)); diff != "" {
		t.Errorf("customers differ (-first +second):\n%s", diff)
	}
	if diff := cmp.Diff(firstConsents, consents(t, db)); diff != "" {
		t.Errorf("consents differ (-first +second):\n%s", diff)
	}

	// A smaller seed keeps the first users identical, and a larger pool request is topped up, not refilled.
	if _, err := demo.Seed(ctx, db, demo.SeedOptions{Users: 1000, Pool: "p1"}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(firstCustomers[:1000], customers(t, db)); diff != "" {
		t.Errorf("first 1000 customers differ (-1500 +1000):\n%s", diff)
	}
	rep, err = demo.Seed(ctx, db, demo.SeedOptions{Users: 1600, Pool: "p1"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.CodesGenerated != 100 || rep.CodesFree != 1600 {
		t.Errorf("seed of 1600 over a pool of 1500: %+v; want 100 generated, 1600 free", rep)
	}
}

func TestSeedInvalid(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	for _, o := range []demo.SeedOptions{{Users: 0}, {Users: demo.MaxUsers + 1}, {Users: 10, Pool: "Demo Pool"}} {
		if _, err := demo.Seed(context.Background(), db, o); !errors.Is(err, demo.ErrInvalidOptions) {
			t.Errorf("Seed(%+v) = %v, want ErrInvalidOptions", o, err)
		}
	}
}
