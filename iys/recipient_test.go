package iys

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/nyaruka/phonenumbers"
)

func TestCanonicalPhone(t *testing.T) {
	t.Parallel()
	valid := []struct{ in, want string }{
		{"05321234567", "+905321234567"},
		{"5321234567", "+905321234567"},
		{"905321234567", "+905321234567"},
		{"+905321234567", "+905321234567"},
		{"+90 532 123 45 67", "+905321234567"},
		{"0532 123 45 67", "+905321234567"},
		{"0 (532) 123-45-67", "+905321234567"},
		{"0090 532 123 45 67", "+905321234567"},
		{" +90\u00a0532\u00a0123\u00a045\u00a067 ", "+905321234567"},
		{"+14155552671", "+14155552671"},
		{"+1 (415) 555-2671", "+14155552671"},
		{"0014155552671", "+14155552671"},
		{"0212 123 45 67", "+902121234567"}, // Istanbul landline: valid, if useless for SMS
		{"+905610111234", "+905610111234"},  // 561 is only partly valid: slow path
		{"+905922111234", "+905922111234"},  // 592 likewise (personal numbers)
	}
	for _, tc := range valid {
		got, err := CanonicalPhone(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("CanonicalPhone(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	invalid := []string{
		"", "   ", "12345", "+9005321234567", "9005321234567", "0090 0532 123 45 67",
		"+90532123456", "053212345678", "+905921234567", "+905601234567", "tel:+905321234567",
		"+905321234567 ext. 5", "+90 532 123 45 67x", "05321234567+", "++905321234567",
		"+1 415 555 267", "123456789012345678901", "0532١٢٣٤٥٦٧",
	}
	for _, in := range invalid {
		got, err := CanonicalPhone(in)
		if !errors.Is(err, ErrInvalidPhone) {
			t.Errorf("CanonicalPhone(%q) = %q, %v; want ErrInvalidPhone", in, got, err)
		}
	}
}

// TestFastPathMatchesLibphonenumber checks that the fast path gives libphonenumber's answer for Turkish
// mobiles in every prefix and every input shape it handles.
func TestFastPathMatchesLibphonenumber(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	fast := 0
	for p := 500; p < 600; p++ {
		for i := 0; i < 12; i++ {
			nat := fmt.Sprintf("%d%07d", p, rng.IntN(10_000_000))
			want := ""
			if n, err := phonenumbers.Parse("+90"+nat, "TR"); err == nil && phonenumbers.IsValidNumber(n) {
				want = phonenumbers.Format(n, phonenumbers.E164)
			}
			if fastPrefixes()[p-500] {
				fast++
				if want == "" {
					t.Fatalf("prefix %d takes the fast path but libphonenumber rejects %s", p, nat)
				}
			}
			inputs := []string{"+90" + nat, "0" + nat[:3] + " " + nat[3:6] + " " + nat[6:8] + " " + nat[8:]}
			if fastPrefixes()[p-500] { // the slow path is libphonenumber itself: spot-check it only
				inputs = append(inputs, "0"+nat, nat, "90"+nat, "0090"+nat)
			}
			for _, in := range inputs {
				got, err := CanonicalPhone(in)
				if want == "" {
					if err == nil {
						t.Errorf("CanonicalPhone(%q) = %q; libphonenumber says invalid", in, got)
					}
					continue
				}
				if err != nil || got != want {
					t.Errorf("CanonicalPhone(%q) = %q, %v; want %q", in, got, err, want)
				}
			}
		}
	}
	if fast == 0 {
		t.Fatal("no prefix takes the fast path")
	}
}

func TestCanonicalPhoneAlreadyCanonicalDoesNotAllocate(t *testing.T) {
	fastPrefixes()
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := CanonicalPhone("+905321234567"); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("CanonicalPhone of a canonical number allocates %v times", allocs)
	}
}

func TestCanonicalEmail(t *testing.T) {
	t.Parallel()
	valid := []struct{ in, want string }{
		{"ayse@example.com", "ayse@example.com"},
		{"  Ayse.Yilmaz+promo@Example.COM\t", "ayse.yilmaz+promo@example.com"},
		{"o'brien@mail.example.org", "o'brien@mail.example.org"},
		{"x@xn--p1ai.xn--p1ai", "x@xn--p1ai.xn--p1ai"},
	}
	for _, tc := range valid {
		got, err := CanonicalEmail(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("CanonicalEmail(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	invalid := []string{
		"", "ayse", "@example.com", "ayse@", "ayse@@example.com", "a@b@example.com", "ayse@example",
		"ayşe@example.com", "ayse@exämple.com", ".ayse@example.com", "ayse.@example.com", "ay..se@example.com",
		"ay se@example.com", "ayse@-example.com", "ayse@example..com", "ayse@example.c", "ayse@1.2.3.4",
		"ayse@exa_mple.com",
	}
	for _, in := range invalid {
		got, err := CanonicalEmail(in)
		if !errors.Is(err, ErrInvalidEmail) {
			t.Errorf("CanonicalEmail(%q) = %q, %v; want ErrInvalidEmail", in, got, err)
		}
	}
}

func TestCanonicalRecipient(t *testing.T) {
	t.Parallel()
	if got, err := CanonicalRecipient(TypeCall, "0532 123 45 67"); err != nil || got != "+905321234567" {
		t.Errorf("ARAMA: %q, %v", got, err)
	}
	if got, err := CanonicalRecipient(TypeEmail, "A@Example.com"); err != nil || got != "a@example.com" {
		t.Errorf("EPOSTA: %q, %v", got, err)
	}
	if _, err := CanonicalRecipient(TypeEmail, "05321234567"); !errors.Is(err, ErrInvalidEmail) {
		t.Errorf("EPOSTA with a phone: %v", err)
	}
	if _, err := CanonicalRecipient("SMS", "05321234567"); !errors.Is(err, ErrInvalidType) {
		t.Errorf("type SMS: %v", err)
	}
}

var sink string

func BenchmarkCanonicalPhone(b *testing.B) {
	for _, in := range []string{"+905321234567", "0532 123 45 67", "+14155552671"} {
		b.Run(in, func(b *testing.B) {
			for b.Loop() {
				s, err := CanonicalPhone(in)
				if err != nil {
					b.Fatal(err)
				}
				sink = s
			}
		})
	}
}

func TestParseDateMatchesTimePackage(t *testing.T) {
	t.Parallel()
	for _, s := range []string{
		"2024-05-17 14:30:00", "2024-02-29 23:59:59", "2023-02-29 10:00:00", "2024-02-30 10:00:00",
		"2024-13-01 10:00:00", "2024-00-10 10:00:00", "2024-12-31 24:00:00", "2024-12-31 23:60:00",
		"2024-12-31 23:59:60", "2015-03-29 03:30:00", "2014-10-26 03:30:00", "0001-01-01 00:00:00",
		"1999-12-31 23:59:59", "2024-04-31 12:00:00", "2024-04-30 12:00:00",
	} {
		want, werr := time.ParseInLocation(DateLayout, s, istanbul)
		got, shapeOK, err := parseDate(s)
		if !shapeOK || (err != nil) != (werr != nil) || !got.Equal(want) {
			t.Errorf("parseDate(%q) = %v, %v, %v; time.ParseInLocation = %v, %v", s, got, shapeOK, err, want, werr)
		}
	}
	for _, s := range []string{"", "2024-05-17", "2024-05-17T14:30:00", "2024/05/17 14:30:00", "2024-05-17 14:30:0a",
		"17.05.2024 14:30:00", "+024-05-17 14:30:00", "2024-5-17 14:30:00 "} {
		if _, shapeOK, _ := parseDate(s); shapeOK {
			t.Errorf("parseDate(%q) accepted the shape", s)
		}
	}
}
