package providers

import (
	"strings"
	"testing"
)

func TestSMSSegments(t *testing.T) {
	r := strings.Repeat
	tests := []struct {
		name     string
		body     string
		encoding string
		segments int
	}{
		{"empty", "", EncodingGSM7, 0},
		{"short ascii", "Hello", EncodingGSM7, 1},
		{"160 gsm", r("a", 160), EncodingGSM7, 1},
		{"161 gsm", r("a", 161), EncodingGSM7, 2},
		{"306 gsm", r("a", 306), EncodingGSM7, 2},
		{"307 gsm", r("a", 307), EncodingGSM7, 3},
		{"newline and cr are basic", "a\nb\r", EncodingGSM7, 1},
		{"gsm latin and greek", "£¥èéùìòÇØøÅåΔΦΓΛΩΠΨΣΘΞÆæßÉ¤¡ÄÖÑÜ§¿äöñüà@$_", EncodingGSM7, 1},

		// Escape characters take two septets.
		{"80 euro signs fill one segment", r("€", 80), EncodingGSM7, 1},
		{"81 euro signs", r("€", 81), EncodingGSM7, 2},
		{"escapes", r("[]{}|~^\\", 20), EncodingGSM7, 3}, // 160 characters, 320 septets, 76 escapes a part
		{"form feed is an escape", r("\f", 81), EncodingGSM7, 2},
		// 306 septets would be two parts, but the escape cannot straddle parts 1 and 2.
		{"escape not split across parts", r("a", 152) + "{" + r("a", 152), EncodingGSM7, 3},

		// Characters without a GSM-7 form switch the whole message to UCS-2.
		{"grave accent", "a`b", EncodingUCS2, 1},
		{"tab", "a\tb", EncodingUCS2, 1},
		{"70 ucs2", r("ş", 70), EncodingUCS2, 1},
		{"71 ucs2", r("ş", 71), EncodingUCS2, 2},
		{"134 ucs2", r("ş", 134), EncodingUCS2, 2},
		{"135 ucs2", r("ş", 135), EncodingUCS2, 3},
		{"one turkish letter turns 160 gsm into 3 ucs2 parts", r("a", 159) + "ı", EncodingUCS2, 3},

		// Emoji are surrogate pairs: two UTF-16 units.
		{"one emoji", "🎉", EncodingUCS2, 1},
		{"35 emoji fill one segment", r("🎉", 35), EncodingUCS2, 1},
		{"36 emoji", r("🎉", 36), EncodingUCS2, 2},
		{"surrogate pair not split across parts", r("ş", 66) + "🎉" + r("ş", 66), EncodingUCS2, 3},

		{"turkish campaign text", "Kampanya kodunuz: ABC123. İyi alışverişler!", EncodingUCS2, 1},
		{"turkish letters that are gsm", "ÇÖÜöü Çok güzel ödül", EncodingGSM7, 1},
		{"invalid utf-8", "a\xffb", EncodingUCS2, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			enc, n := SMSSegments(tt.body)
			if enc != tt.encoding || n != tt.segments {
				t.Errorf("SMSSegments(%q) = %s, %d; want %s, %d", tt.body, enc, n, tt.encoding, tt.segments)
			}
		})
	}
}

// Each Turkish letter outside GSM-7 must force UCS-2 on its own; the others must not.
func TestSMSSegmentsTurkishLetters(t *testing.T) {
	for _, c := range []string{"ç", "ğ", "Ğ", "ı", "İ", "ş", "Ş"} {
		if enc, _ := SMSSegments("Merhaba " + c); enc != EncodingUCS2 {
			t.Errorf("SMSSegments with %q: encoding %s, want %s", c, enc, EncodingUCS2)
		}
	}
	for _, c := range []string{"Ç", "Ö", "Ü", "ö", "ü"} {
		if enc, _ := SMSSegments("Merhaba " + c); enc != EncodingGSM7 {
			t.Errorf("SMSSegments with %q: encoding %s, want %s", c, enc, EncodingGSM7)
		}
	}
}
