package iys

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

// MaxAddBatch is the most consent changes one asynchronous batch add (AddConsents) may carry: İYS
// refuses more with 422 H091 (research §2.5).
const MaxAddBatch = 1000

// Statuses of one item of a batch add's result (AddItem.Status), spelled as İYS spells them.
const (
	// AddSuccess means İYS recorded the change; AddItem.TransactionID names it.
	AddSuccess = "success"
	// AddFailure means İYS refused the change; AddItem.Err says why (H174, H175, H178...).
	AddFailure = "failure"
	// AddEnqueue means İYS has not processed the change yet: ask again later.
	AddEnqueue = "enqueue"
)

// ErrInvalidChange is returned, wrapped, when a ConsentChange fails the client's own checks, before
// anything is sent: İYS would refuse it, and İYS counts client errors against the provider's IP.
// Errors about the recipient also wrap ErrInvalidPhone or ErrInvalidEmail.
var ErrInvalidChange = errors.New("invalid consent change")

// hsSources are the sources a service provider may send (research §1.2); IYS_* ones only İYS sets.
var hsSources = []string{
	"HS_FIZIKSEL_ORTAM", "HS_ISLAK_IMZA", "HS_ETKINLIK", "HS_ATM", "HS_EORTAM", "HS_WEB", "HS_MOBIL",
	"HS_MESAJ", "HS_EPOSTA", "HS_CAGRI_MERKEZI", "HS_SOSYAL_MEDYA", "HS_2015", "HS_KARAR",
}

// iysEpoch is the earliest consent date İYS accepts (H156), and the only one it accepts with HS_2015
// (H155): consents given before the registry existed are declared as of 1 May 2015.
var iysEpoch = time.Date(2015, 5, 1, 0, 0, 0, 0, istanbul)

// ConsentChange is a consent decision the brand obtained through its own channels, to register in
// İYS: typically a refusal (RET) a recipient sent by replying to a message or unsubscribing by e-mail.
type ConsentChange struct {
	// Recipient is a phone number for MESAJ and ARAMA or an e-mail address for EPOSTA, in any spelling
	// CanonicalRecipient accepts; the canonical form is what is sent.
	Recipient string
	// Type is MESAJ, EPOSTA or ARAMA; RecipientType BIREYSEL or TACIR (required: İYS's silent default,
	// BIREYSEL, is not assumed); Status ONAY or RET.
	Type, RecipientType, Status string
	// Source is where the decision was obtained, an HS_* value such as HS_MESAJ (a reply to an SMS),
	// HS_EPOSTA (an e-mail unsubscribe) or HS_WEB. HS_KARAR (the brand's own decision) requires RET.
	// Required for BIREYSEL; for TACIR it may be empty on the first add only.
	Source string
	// ConsentDate is when the recipient gave or refused consent; it is sent as "YYYY-MM-DD HH:mm:ss" in
	// Europe/Istanbul, to the second. It must not be in the future nor before 2015-05-01. Required for
	// BIREYSEL; for TACIR the zero time sends none, which İYS accepts on the first add only.
	ConsentDate time.Time
}

// AddResult is İYS's answer to a single add.
type AddResult struct {
	// TransactionID is İYS's ID of the change (64 hex characters), the one the pull and status report.
	// Resending the identical change returns the same ID and records nothing again.
	TransactionID string
	// CreationDate is when İYS recorded the change, in Europe/Istanbul; zero if İYS gave none.
	CreationDate time.Time
}

// AddItem is the outcome of one change of a batch add.
type AddItem struct {
	// Index is the change's position in the slice given to AddConsents.
	Index int
	// Status is AddSuccess, AddFailure or AddEnqueue.
	Status string
	// TransactionID is İYS's ID of the change when Status is AddSuccess. For a change identical to one an
	// earlier request already stored, it is that request's ID: nothing was recorded again.
	TransactionID string
	// Err is İYS's refusal when Status is AddFailure: Code ("H174", "H175", "H178"...) and Message, Index
	// set to the item's. Its Status is 0, since the refusal came inside a 200 answer, not as an HTTP error:
	// branch on Code. Nil otherwise.
	Err *APIError
}

// wireAdd is one consent to add, in İYS's JSON. Optional fields are left out rather than sent empty,
// as İYS asks.
type wireAdd struct {
	ConsentDate   string `json:"consentDate,omitempty"`
	Source        string `json:"source,omitempty"`
	Recipient     string `json:"recipient"`
	RecipientType string `json:"recipientType"`
	Status        string `json:"status"`
	Type          string `json:"type"`
}

// wire checks ch against İYS's rules that need no stored state and converts it. now is the client's
// clock, for the future-date rule.
func (ch ConsentChange) wire(now time.Time) (wireAdd, error) {
	if err := checkKey(ch.RecipientType, ch.Type); err != nil {
		if ch.RecipientType == "" {
			return wireAdd{}, fmt.Errorf("%w: recipient type is required: BIREYSEL for a consumer, TACIR for a merchant", ErrInvalidChange)
		}
		return wireAdd{}, fmt.Errorf("%w: %w", ErrInvalidChange, err)
	}
	canon, err := CanonicalRecipient(ch.Type, ch.Recipient)
	if err != nil {
		return wireAdd{}, fmt.Errorf("%w: %w", ErrInvalidChange, err)
	}
	if ch.Status != StatusApproved && ch.Status != StatusRejected {
		return wireAdd{}, fmt.Errorf("%w: status %q must be ONAY or RET", ErrInvalidChange, ch.Status)
	}
	merchant := ch.RecipientType == RecipientMerchant
	switch {
	case ch.Source == "" && merchant:
	case ch.Source == "":
		return wireAdd{}, fmt.Errorf("%w: source is required for BIREYSEL, e.g. HS_MESAJ for a reply to an SMS, HS_EPOSTA for an e-mail unsubscribe, HS_WEB for a web form", ErrInvalidChange)
	case strings.HasPrefix(ch.Source, "IYS_"):
		return wireAdd{}, fmt.Errorf("%w: source %s is set by İYS only; use the HS_ source of the channel the brand received the decision through", ErrInvalidChange, ch.Source)
	case !slices.Contains(hsSources, ch.Source):
		return wireAdd{}, fmt.Errorf("%w: source %q is not one of İYS's: %s", ErrInvalidChange, ch.Source, strings.Join(hsSources, ", "))
	case ch.Source == "HS_KARAR" && ch.Status != StatusRejected:
		return wireAdd{}, fmt.Errorf("%w: source HS_KARAR (the brand's own decision) may only set RET", ErrInvalidChange)
	}
	w := wireAdd{Source: ch.Source, Recipient: canon, RecipientType: ch.RecipientType, Status: ch.Status, Type: ch.Type}
	if ch.ConsentDate.IsZero() {
		if !merchant {
			return wireAdd{}, fmt.Errorf("%w: consent date is required for BIREYSEL: when the recipient gave or refused consent", ErrInvalidChange)
		}
		return w, nil
	}
	d := ch.ConsentDate.In(istanbul).Truncate(time.Second)
	switch {
	case d.After(now):
		return wireAdd{}, fmt.Errorf("%w: consent date %s is in the future (İYS refuses it with H162); give the time the recipient actually decided, and check the clock",
			ErrInvalidChange, d.Format(DateLayout))
	case d.Before(iysEpoch):
		return wireAdd{}, fmt.Errorf("%w: consent date %s is before 2015-05-01; declare older consents with source HS_2015 and 2015-05-01 00:00:00",
			ErrInvalidChange, d.Format(DateLayout))
	case ch.Source == "HS_2015" && !d.Equal(iysEpoch):
		return wireAdd{}, fmt.Errorf("%w: source HS_2015 takes only the consent date 2015-05-01 00:00:00", ErrInvalidChange)
	}
	w.ConsentDate = d.Format(DateLayout)
	return w, nil
}

// consentsPathV2 is the V2 (idempotent) add path of the brand's consents.
func (c *Client) consentsPathV2() string { return "/v2" + c.brandPath() }

// AddConsent registers one consent change in İYS with the V2 single add, after checking it locally
// (errors wrap ErrInvalidChange; nothing is sent then). It retries 429s, 5xx and network errors like
// every other call: V2 makes that safe, since İYS answers an identical request with the transactionId
// it gave the first time and records nothing again. For the same reason a caller may resend a change
// whose answer it never got (a timeout, ErrMalformedResponse) unchanged.
//
// İYS's refusals come back as *APIError. The ones a RET usually meets are permanent and must not be
// resent: 400 H174 (the consent already has that status: the refusal is registered), 400 H175 (İYS has
// no record of the recipient, and a first add may not be RET: there is nothing to refuse in İYS; keep
// the refusal locally), 400 H178 (İYS holds a decision dated later). IsRetryable tells those from a 429
// or a 5xx that survived the retries.
func (c *Client) AddConsent(ctx context.Context, ch ConsentChange) (AddResult, error) {
	w, err := ch.wire(c.now())
	if err != nil {
		return AddResult{}, fmt.Errorf("iys add: %w", err)
	}
	body, _ := json.Marshal(w)
	_, data, err := c.do(ctx, call{op: opAdd, method: http.MethodPost, path: c.consentsPathV2(), body: body})
	if err != nil {
		return AddResult{}, err
	}
	var resp struct {
		TransactionID string `json:"transactionId"`
		CreationDate  string `json:"creationDate"`
	}
	if err := decodeStrict(data, &resp); err != nil {
		return AddResult{}, malformed(opAdd, err)
	}
	if resp.TransactionID == "" {
		return AddResult{}, malformed(opAdd, errors.New("no transactionId"))
	}
	created, err := parseIYSDate(resp.CreationDate)
	if err != nil {
		return AddResult{}, malformed(opAdd, fmt.Errorf("creationDate %q", resp.CreationDate))
	}
	return AddResult{TransactionID: resp.TransactionID, CreationDate: created}, nil
}

// AddConsents submits up to MaxAddBatch consent changes to İYS's V2 asynchronous batch add and returns
// the request's ID, to read the outcome with AddResults. Every change is checked locally first, and no
// two may share (recipient type, type, canonical recipient), which İYS refuses with H194: the whole
// batch is refused then (errors wrap ErrInvalidChange) and nothing is sent. To record successive
// decisions of one recipient, send them in order with AddConsent.
//
// İYS validates the list when it arrives (a 422 names the item's index in APIError.Index) but applies
// the business rules (H174, H175, H178) only when it processes it, so those come back per item from
// AddResults. A retried submission is a new request, but V2 answers the items an earlier request already
// stored with that request's transactionId instead of recording them again.
func (c *Client) AddConsents(ctx context.Context, changes []ConsentChange) (string, error) {
	switch {
	case len(changes) == 0:
		return "", fmt.Errorf("iys add batch: %w: no changes to send", ErrInvalidChange)
	case len(changes) > MaxAddBatch:
		return "", fmt.Errorf("iys add batch: %w: %d changes, İYS takes at most %d per request; split them", ErrInvalidChange, len(changes), MaxAddBatch)
	}
	now := c.now()
	list := make([]wireAdd, len(changes))
	first := make(map[[3]string]int, len(changes))
	for i, ch := range changes {
		w, err := ch.wire(now)
		if err != nil {
			return "", fmt.Errorf("iys add batch: change %d: %w", i, err)
		}
		k := [3]string{w.RecipientType, w.Type, w.Recipient}
		if j, dup := first[k]; dup {
			return "", fmt.Errorf("iys add batch: %w: changes %d and %d are for the same recipient, type and recipient type, which İYS refuses in one batch (H194); keep the latest, or send them in order with AddConsent",
				ErrInvalidChange, j, i)
		}
		first[k] = i
		list[i] = w
	}
	body, _ := json.Marshal(list)
	_, data, err := c.do(ctx, call{op: opAddBatch, method: http.MethodPost, path: c.consentsPathV2() + "/request", body: body})
	if err != nil {
		return "", err
	}
	var resp struct {
		RequestID string `json:"requestId"`
	}
	if err := decodeStrict(data, &resp); err != nil {
		return "", malformed(opAddBatch, err)
	}
	if !validRequestID(resp.RequestID) {
		return "", malformed(opAddBatch, errors.New("no usable requestId"))
	}
	return resp.RequestID, nil
}

// validRequestID is İYS's rule for a batch's ID (H198/H199/H400): at most 36 characters, neither all
// letters nor all digits, nothing that would need escaping in a path.
func validRequestID(id string) bool {
	if id == "" || len(id) > 36 {
		return false
	}
	letters, digits := true, true
	for i := 0; i < len(id); i++ {
		ch := id[i]
		isLetter := ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z'
		isDigit := ch >= '0' && ch <= '9'
		if !isLetter && !isDigit && ch != '-' && ch != '_' {
			return false
		}
		letters = letters && isLetter
		digits = digits && isDigit
	}
	return !letters && !digits
}

// AddResults asks İYS for the outcome of a batch add, by the ID AddConsents returned. An empty answer
// means İYS has not processed the batch yet: no items and done false. Otherwise items has one entry per
// change, sorted by Index, and done is true only when none is still AddEnqueue. İYS asks that the first
// query wait at least 5 minutes after the submission; a request ID can be queried for 60 days.
func (c *Client) AddResults(ctx context.Context, requestID string) ([]AddItem, bool, error) {
	if !validRequestID(requestID) {
		return nil, false, fmt.Errorf("iys add results: request ID %q is not one AddConsents returns (at most 36 letters, digits and hyphens, not all letters or all digits)", requestID)
	}
	status, data, err := c.do(ctx, call{op: opAddResults, method: http.MethodGet, path: c.consentsPathV2() + "/request/" + requestID})
	if err != nil {
		return nil, false, err
	}
	if status == http.StatusNoContent || len(strings.TrimSpace(string(data))) == 0 {
		return nil, false, nil
	}
	var list []struct {
		Index         *int   `json:"index"`
		Status        string `json:"status"`
		TransactionID string `json:"transactionId"`
		Error         *struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := decodeStrict(data, &list); err != nil {
		return nil, false, malformed(opAddResults, err)
	}
	if len(list) == 0 {
		return nil, false, nil
	}
	items := make([]AddItem, len(list))
	seen := make(map[int]bool, len(list))
	done := true
	for i, w := range list {
		if w.Index == nil || *w.Index < 0 || *w.Index >= MaxAddBatch || seen[*w.Index] {
			return nil, false, malformed(opAddResults, fmt.Errorf("item %d: missing, out of range or repeated index", i))
		}
		seen[*w.Index] = true
		it := AddItem{Index: *w.Index, Status: w.Status, TransactionID: w.TransactionID}
		switch w.Status {
		case AddSuccess:
			if w.TransactionID == "" {
				return nil, false, malformed(opAddResults, fmt.Errorf("item %d: success without a transactionId", i))
			}
		case AddFailure:
			if w.Error == nil {
				return nil, false, malformed(opAddResults, fmt.Errorf("item %d: failure without an error", i))
			}
			idx := *w.Index
			it.Err = &APIError{Op: opAddResults, Code: w.Error.Code, Message: cmpOrString(w.Error.Message, "refused"), Index: &idx,
				Details: []ErrorDetail{{Code: w.Error.Code, Message: w.Error.Message, Index: &idx}}}
		case AddEnqueue:
			done = false
		default:
			return nil, false, malformed(opAddResults, fmt.Errorf("item %d: status %q", i, w.Status))
		}
		items[i] = it
	}
	slices.SortFunc(items, func(a, b AddItem) int { return a.Index - b.Index })
	return items, done, nil
}
