package main

import (
	"strings"
	"testing"
)

// The ConfigMap ships IYS_CODE and IYS_BRAND_CODE as REPLACE_ME, and `iys sync`/`iys push` refuse that
// (exit 2: "digits only"). `iys import` took IYS_BRAND_CODE as it was: the consents went in under brand
// "REPLACE_ME" (or "654321 " with a pasted space), exit 0, where no sync, push or correctly configured
// launch would ever find them. A malformed brand code is bad input: exit 2, nothing imported; launch,
// iys check and webhooks read it the same way.
func TestIYSImportRefusesAMalformedBrandCode(t *testing.T) {
	t.Parallel()
	env, count := badInputDB(t)
	csv := writeFile(t, "c.csv", "recipient,type,recipient_type,status,source,consent_date\n+905321234599,MESAJ,BIREYSEL,ONAY,HS_WEB,2026-01-15 10:30:00\n")
	for _, brand := range []string{"REPLACE_ME", "654321 "} {
		env["IYS_BRAND_CODE"] = brand
		out, stderr, code := cli(t, env, "iys", "import", csv)
		n := count(`SELECT count(*) FROM iys_consents WHERE recipient = '+905321234599'`)
		if code != 2 || n != 0 || !strings.Contains(stderr, "IYS_BRAND_CODE") {
			t.Errorf("iys import with IYS_BRAND_CODE=%q: exit %d, %d consents stored under it\n%s%s\nwant exit 2 naming IYS_BRAND_CODE, nothing imported (iys sync and iys push refuse this brand code)",
				brand, code, n, out, stderr)
		}
	}
}
