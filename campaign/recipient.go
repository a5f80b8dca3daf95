package campaign

import (
	"bytes"
	"encoding/json"
	"strings"
	"time"
)

// Recipient is one planned recipient as the worker needs it.
type Recipient struct {
	UserID  string
	Address string
	// Vars is the JSON object of the audience columns other than user_id and the address.
	Vars []byte
	Code string
	// Attempts counts the runs that tried this recipient (transient failures included).
	Attempts int
	// Consent is false when the recipient's consent is no longer ONAY at send time.
	Consent bool
	// Suspect is true when the row was taken over from a run that died under another Redis epoch: if no
	// claim is found, the message may still have been sent.
	Suspect bool
	// UnsubscribeURL is the recipient's one-click unsubscribe link (commercial e-mail; set by the worker),
	// given to the template as unsubscribe_url.
	UnsubscribeURL string
}

// UnsubscribeSample stands for a recipient's unsubscribe link where none is made (the launch's sample
// message and checks): the real link is signed per recipient by the worker.
const UnsubscribeSample = "https://unsubscribe.example/u/…"

// TemplateData is the map a message template runs over: the audience columns, the address column under
// its channel's name, user_id, code, campaign, and unsubscribe_url when the recipient has one.
func (r *Recipient) TemplateData(ch Channel, campaignName string) map[string]any {
	data := map[string]any{}
	if len(r.Vars) > 0 {
		dec := json.NewDecoder(bytes.NewReader(r.Vars))
		dec.UseNumber()   // 1234567 stays 1234567, not 1.234567e+06
		dec.Decode(&data) //nolint:errcheck // written by the planner from a map; cannot be malformed
		// A NULL column is left out, so that a template naming it fails instead of printing "<no value>".
		for k, v := range data {
			if v == nil {
				delete(data, k)
			}
		}
	}
	data["user_id"] = r.UserID
	data[ch.AddressColumn()] = r.Address
	if r.Code != "" {
		data["code"] = r.Code
	}
	data["campaign"] = campaignName
	if r.UnsubscribeURL != "" {
		data["unsubscribe_url"] = r.UnsubscribeURL
	}
	return data
}

// Outcome is what happened to one recipient in a batch run.
type Outcome struct {
	UserID    string
	Status    string
	Reason    string
	MessageID string
	Segments  int
	// SentAt is when the request that sent the message went out: the row's sent_at, so that a receipt
	// never comes before it. The zero value records the time of the record.
	SentAt time.Time
	// Snapshot is the consent record read when the chunk was leased (Chunk.Snapshots), kept in the outcome's
	// audit record. The zero value records none.
	Snapshot ConsentRecord
	// Durable says that nothing else holds the outcome (the provider's answer could not be written into
	// the recipient's claim): Record then waits for its commit to reach the disk (see Record).
	Durable bool
	// ReceiptKeyed says that the provider's receipts for MessageID name the campaign and the user
	// (providers.ReceiptsNameRecipient): the audit entry then needs no place in the message-ID index
	// (migration 0014). False, the safe value, when unknown.
	ReceiptKeyed bool
	// Provider names the provider the message went through (or that refused it); "" when not known (an
	// outcome read back from a claim).
	Provider string
	// BadAddress says the provider condemned the address itself (an unregistered push token): Record
	// adds it to the invalid addresses later launches exclude, in the outcome's own statement, so a worker
	// killed or a Postgres gone after the answer does not lose it (the claim's reason says it too:
	// InvalidAddressReason).
	BadAddress bool
}

// InvalidAddressReason is the reason of a failure that condemns the address (Outcome.BadAddress), in the
// outcome and in the claim: the provider's reason after "invalid_address: ".
func InvalidAddressReason(providerReason string) string {
	return ReasonInvalidAddress + ": " + providerReason
}

// IsInvalidAddressReason tells a reason made by InvalidAddressReason.
func IsInvalidAddressReason(reason string) bool {
	return strings.HasPrefix(reason, ReasonInvalidAddress+": ")
}

// ConsentRecord is a recipient's İYS consent as a worker read it when it leased the recipient's chunk: what
// the audit keeps with the outcome that was decided on it.
type ConsentRecord struct {
	Status        string // ONAY or RET; empty when no consent was found
	Source        string
	TransactionID string
	Date          time.Time
	// SyncedAt is when the consent was last confirmed from İYS (or loaded).
	SyncedAt time.Time
}
