// Package iys keeps the local copy of İYS (İleti Yönetim Sistemi, the Turkish commercial-message consent
// registry) consents that campaigns are filtered by.
//
// Consents are keyed as İYS keys them: (recipient, type, recipient_type). Recipients are stored in
// canonical form, so that a lookup with any spelling of the same address finds the same row: phone numbers
// in E.164 (+905XXXXXXXXX for Turkish mobiles, see CanonicalPhone) and e-mail addresses in lower case (see
// CanonicalEmail). İYS keeps the latest decision, so a stored consent is only replaced by one whose
// consent_date is the same or later.
package iys
