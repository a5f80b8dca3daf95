package campaign

import (
	"strconv"
	"strings"

	"github.com/campaignctl/campaignctl/iys"
)

// consentRule is the consent a campaign's recipients must have, from the channel's registration and the
// campaign's İYS recipient type, brand and transactional flag. It is written once, here, and both
// decisions are made with it: the planner's classification (store_classify.go) and the lease's check at
// send time (store_lease.go), so that a recipient the launch would exclude is never sent, and the other
// way round.
//
// A commercial message on a channel with an İYS type needs ONAY of that type for the address, the
// recipient type and the brand; a consent of another type, recipient type or brand is no consent. A
// channel without an İYS type needs the audience's opt-in column to say true. A transactional message
// needs neither (law 6563 asks no consent for it); its consent is still read, for the audit.
//
// The rule is SQL text built in Go rather than a SQL function of a migration: what it reads (the İYS
// type, the opt-in column) comes from the channel's registration, which is Go; a join condition written
// into each statement keeps the consents' primary key usable by both the classification's hash join over
// the whole audience and the lease's lookup per recipient, where a function call would have to be
// inlined for that; and a change of the rule ships with the binary, not as a schema change.
type consentRule struct {
	// IYSType is the İYS consent type of the channel ("" when İYS has none for it).
	IYSType string
	// RecipientType (BIREYSEL or TACIR) and BrandCode select the consents that count.
	RecipientType, BrandCode string
	// OptInColumn is the audience column that must say true on a channel without an İYS type.
	OptInColumn string
	// Transactional messages are not commercial: no consent is asked.
	Transactional bool
}

// newConsentRule returns the rule of a campaign on ch for the İYS recipient type (BIREYSEL when empty) and
// brand.
func newConsentRule(ch Channel, recipientType, brand string, transactional bool) consentRule {
	cs := ch.Spec()
	return consentRule{IYSType: cs.IYSType, RecipientType: iysRecipientType(recipientType), BrandCode: brand,
		OptInColumn: cs.OptInColumn, Transactional: transactional}
}

// consentRule returns the campaign's consent rule.
func (c *Campaign) consentRule() consentRule {
	return newConsentRule(c.Channel, c.RecipientType, c.BrandCode, c.Transactional)
}

// consentRule returns the launch's consent rule.
func (s Spec) consentRule() consentRule {
	return newConsentRule(s.Channel, s.RecipientType, s.BrandCode, s.Transactional)
}

// checksIYS says whether İYS decides who may be sent: a commercial message on a channel with an İYS type.
// Only then do the consents' age and version matter.
func (r consentRule) checksIYS() bool { return !r.Transactional && r.IYSType != "" }

// joinSQL is the condition that the iys_consents row c is the consent of the address addr that the rule
// reads (the table's primary key: recipient, type, recipient type, brand). bind puts each value into the
// statement: as a literal (quoteLiteral) where the statement takes no parameters, or as a parameter
// (params.bind). A channel without an İYS type matches no row: no consent has type "".
func (r consentRule) joinSQL(c, addr string, bind func(string) string) string {
	return r.addressSQL(c, addr, bind) + " AND " + c + ".brand_code = " + bind(r.BrandCode)
}

// addressSQL is the part of joinSQL that names the address, the type and the recipient type: every brand's
// consent of them.
func (r consentRule) addressSQL(c, addr string, bind func(string) string) string {
	return c + ".recipient = " + addr + " AND " + c + ".type = " + bind(r.IYSType) + " AND " + c + ".recipient_type = " + bind(r.RecipientType)
}

// sendJoinSQL is joinSQL for the consent read at send time (LeaseChunk), whose caller takes a refusal
// first (refusalFirstSQL): a campaign of no brand also finds a refusal recorded under any brand. iys sync
// records its brand, and a RET pulled after the launch would otherwise go unseen by a campaign that reads
// the consents recorded without one; the launch refuses to go ahead with such a RET already there
// (brandGate).
func (r consentRule) sendJoinSQL(c, addr string, bind func(string) string) string {
	if r.BrandCode != "" {
		return r.joinSQL(c, addr, bind)
	}
	return r.addressSQL(c, addr, bind) + " AND (" + c + ".brand_code = '' OR " + c + ".status <> " + quoteLiteral(iys.StatusApproved) + ")"
}

// refusalFirstSQL orders the rows sendJoinSQL finds so that a refusal comes first.
func refusalFirstSQL(c string) string {
	return " ORDER BY " + c + ".status = " + quoteLiteral(iys.StatusApproved) + " LIMIT 1"
}

// refusalSQL is the SQL expression of why the rule refuses a recipient, NULL when it may be sent: status is
// the status of the consent joinSQL found (NULL when none), vars the recipient's audience values. Its
// values are literals of the code's own, never the marketer's.
func (r consentRule) refusalSQL(status, vars string) string {
	switch {
	case r.Transactional:
		return "NULL::text"
	case r.IYSType == "":
		return `CASE WHEN lower(coalesce(` + vars + `->>` + quoteLiteral(r.OptInColumn) + `, '')) NOT IN (` + optInTrue + `) THEN '` + ReasonNoOptIn + `' END`
	}
	return `CASE WHEN ` + status + ` IS NULL THEN '` + ReasonNoConsent + `'
		WHEN ` + status + ` <> '` + iys.StatusApproved + `' THEN '` + ReasonConsentRET + `' END`
}

// withBrand returns the rule for the consents of another brand.
func (r consentRule) withBrand(brand string) consentRule { r.BrandCode = brand; return r }

// optInTrue are the values of an opt-in column that say yes, lower-cased: a boolean column arrives as
// true, a text one as whatever the audience's system writes.
const optInTrue = `'true', 't', '1', 'yes', 'y', 'on'`

// iysRecipientType is the İYS recipient type checked: BIREYSEL unless the campaign says TACIR.
func iysRecipientType(rt string) string {
	if rt == "" {
		return iys.RecipientIndividual
	}
	return rt
}

// params collects the arguments of a statement whose text is built: bind adds one and returns its
// placeholder.
type params []any

func (p *params) bind(v string) string {
	*p = append(*p, v)
	return "$" + strconv.Itoa(len(*p))
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
