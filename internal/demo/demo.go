// Package demo seeds a database with a synthetic Turkish audience, İYS consents and a code pool, so that
// campaignctl can be tried (and tested) end to end without real customer data.
//
// Everything is a function of the user's 0-based index k, so Seed is deterministic: the same k always gets
// the same customer, whatever Users is, and seeding twice gives the same data. For user k (user_id "u"
// followed by k+1, zero-padded to 7 digits):
//
//   - first_name is one of 30 Turkish first names, many with ç ğ ı İ ö ş ü (so messages need UCS-2);
//     last_name one of 23 surnames, or NULL when k%50 == 49 (2%); city one of 17 cities.
//   - The phone is a Turkish mobile in the 530–559 ranges, unique per user, written in one of four
//     spellings by k%4: "0532 123 45 67", "+905321234567", "5321234567", "+90 532 123 45 67", so that a
//     launch has to normalise it (iys.CanonicalPhone gives +905321234567 for all four).
//   - 1% of phones are invalid, exactly the users with k%100 == 99, spelled by (k/100)%3 as "12345",
//     "+900532…" (a trunk 0 after +90, which İYS rejects) or a 9-digit number.
//   - 0.1% of users share their phone with the user before them: the users with k%1000 == 501 have the
//     number of user k-1 (in their own spelling).
//   - email is "first.last.<k+1>@example.com" in lower-case ASCII (first.<k+1>@… without a last name),
//     unique per user; push_token is NULL when k%10 == 9 (10%) and opted_in_push is true when k%10 < 6.
//
// İYS consents, all BIREYSEL with source HS_WEB and a fixed consent_date in 2024:
//
//   - MESAJ, on the canonical phone: ONAY when k%100 < 85 (85% of users), RET when 85 <= k%100 < 90 (5%),
//     none otherwise (10%, which includes the 1% with invalid phones). A shared phone carries the
//     consent of its first user, which is ONAY like that of the user sharing it, so the rule holds for every
//     user.
//   - EPOSTA, on the e-mail: ONAY when (k+50)%100 < 85 (85%), RET when 85 <= (k+50)%100 < 90 (5%), none
//     otherwise (10%).
package demo

import (
	"errors"
	"fmt"

	"github.com/campaignctl/campaignctl/codes"
)

// MaxUsers is the largest SeedOptions.Users accepted.
const MaxUsers = 10_000_000

// DefaultPool is the code pool Seed fills when SeedOptions.Pool is empty.
const DefaultPool = "demo"

// ErrInvalidOptions is returned, wrapped with the reason, for SeedOptions that cannot work.
var ErrInvalidOptions = errors.New("invalid seed options")

// SeedOptions says what Seed makes.
type SeedOptions struct {
	Users int    // number of customers, 1 to MaxUsers
	Pool  string // code pool to top up to at least Users free codes; DefaultPool when empty

	// Progress, if not nil, is called as the work advances with done out of total units: one per customer
	// written, one per user whose consents are written, and one per code generated. It may be called from
	// another goroutine, never concurrently.
	Progress func(done, total int)
}

// SeedReport counts what Seed wrote. The consent counts are those of the seeded users' keys as stored
// after Seed (shared phones count once).
type SeedReport struct {
	Customers      int64 // rows now in customers
	InvalidPhones  int64 // customers whose phone is not a valid number
	SharedPhones   int64 // customers whose phone is also another customer's
	SMSApproved    int64 // MESAJ consents with status ONAY
	SMSRejected    int64 // MESAJ consents with status RET
	EmailApproved  int64 // EPOSTA consents with status ONAY
	EmailRejected  int64 // EPOSTA consents with status RET
	Pool           string
	CodesGenerated int   // codes added to the pool to cover Users
	CodesFree      int64 // free codes in the pool afterwards, at least Users
}

func (o *SeedOptions) validate() error {
	if o.Users < 1 || o.Users > MaxUsers {
		return fmt.Errorf("%w: users must be between 1 and %d, got %d", ErrInvalidOptions, MaxUsers, o.Users)
	}
	if o.Pool == "" {
		o.Pool = DefaultPool
	}
	if !codes.ValidPoolName(o.Pool) {
		return fmt.Errorf("%w: pool name %q must be 1 to %d characters of a-z, 0-9, '_' and '-'", ErrInvalidOptions, o.Pool, codes.MaxPoolNameLen)
	}
	return nil
}

// Names are given with the ASCII spelling the e-mail addresses use.
type name struct{ display, ascii string }

var firstNames = []name{
	{"Ayşe", "ayse"}, {"Fatma", "fatma"}, {"Emine", "emine"}, {"Hatice", "hatice"}, {"Zeynep", "zeynep"},
	{"Elif", "elif"}, {"Şeyma", "seyma"}, {"Gülşen", "gulsen"}, {"Öznur", "oznur"}, {"Çiğdem", "cigdem"},
	{"Irmak", "irmak"}, {"Işıl", "isil"}, {"Mehmet", "mehmet"}, {"Mustafa", "mustafa"}, {"Ahmet", "ahmet"},
	{"Ali", "ali"}, {"Hüseyin", "huseyin"}, {"Hasan", "hasan"}, {"İbrahim", "ibrahim"}, {"İsmail", "ismail"},
	{"Ömer", "omer"}, {"Yusuf", "yusuf"}, {"Murat", "murat"}, {"Emre", "emre"}, {"Çağrı", "cagri"},
	{"Barış", "baris"}, {"Gökhan", "gokhan"}, {"Ümit", "umit"}, {"Doğan", "dogan"}, {"Şükrü", "sukru"},
}

var lastNames = []name{
	{"Yılmaz", "yilmaz"}, {"Kaya", "kaya"}, {"Demir", "demir"}, {"Şahin", "sahin"}, {"Çelik", "celik"},
	{"Yıldız", "yildiz"}, {"Yıldırım", "yildirim"}, {"Öztürk", "ozturk"}, {"Aydın", "aydin"},
	{"Özdemir", "ozdemir"}, {"Arslan", "arslan"}, {"Doğan", "dogan"}, {"Kılıç", "kilic"}, {"Aslan", "aslan"},
	{"Çetin", "cetin"}, {"Kara", "kara"}, {"Koç", "koc"}, {"Kurt", "kurt"}, {"Özkan", "ozkan"},
	{"Şimşek", "simsek"}, {"Polat", "polat"}, {"Erdoğan", "erdogan"}, {"Güneş", "gunes"},
}

var cities = []string{
	"İstanbul", "Ankara", "İzmir", "Bursa", "Antalya", "Konya", "Adana", "Gaziantep", "Şanlıurfa", "Kocaeli",
	"Mersin", "Diyarbakır", "Kayseri", "Eskişehir", "Muğla", "Trabzon", "Samsun",
}

func displays(ns []name) []string {
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i] = n.display
	}
	return out
}

func asciis(ns []name) []string {
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i] = n.ascii
	}
	return out
}
