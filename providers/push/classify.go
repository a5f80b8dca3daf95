package push

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"golang.org/x/oauth2"

	"github.com/campaignctl/campaignctl/providers"
	"github.com/campaignctl/campaignctl/providers/internal/wire"
)

// fcmErrorType is the @type of the error detail that carries FCM's errorCode.
const fcmErrorType = "type.googleapis.com/google.firebase.fcm.v1.FcmError"

// FCM errorCode values (https://firebase.google.com/docs/reference/fcm/rest/v1/ErrorCode).
const (
	codeUnregistered     = "UNREGISTERED"
	codeInvalidArgument  = "INVALID_ARGUMENT"
	codeSenderIDMismatch = "SENDER_ID_MISMATCH"
	codeThirdPartyAuth   = "THIRD_PARTY_AUTH_ERROR"
	codeQuotaExceeded    = "QUOTA_EXCEEDED"
	codeUnavailable      = "UNAVAILABLE"
	codeInternal         = "INTERNAL"
)

// thirdPartyAuthWait is how long a token FCM cannot reach for the project's APNs or web push credentials
// (THIRD_PARTY_AUTH_ERROR) waits before its next try: time for the operator to fix them.
const thirdPartyAuthWait = 10 * time.Minute

// maxMessage bounds the FCM error text kept in a providers.Error.
const maxMessage = 200

// googleError is Google's JSON error body.
type googleError struct {
	Error struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
		Status  string `json:"status"`
		Details []struct {
			Type      string `json:"@type"`
			ErrorCode string `json:"errorCode"`
		} `json:"details"`
	} `json:"error"`
}

// classify turns an error answer into a *providers.Error, and returns FCM's errorCode ("" when the body
// has no FcmError detail). The errorCode decides when there is one; otherwise the HTTP status does.
func classify(status int, retryAfter string, body []byte, to string, now time.Time) (*providers.Error, string) {
	e := &providers.Error{Provider: "fcm", Status: status}
	var ge googleError
	code, text := "", ""
	if json.Unmarshal(body, &ge) == nil {
		for _, d := range ge.Error.Details {
			if d.Type == fcmErrorType && d.ErrorCode != "" {
				code = d.ErrorCode
				break
			}
		}
		label := code
		if label == "" {
			label = ge.Error.Status
		}
		text = wire.Join(label, redactText(ge.Error.Message, to))
	}
	switch code {
	case codeUnregistered, codeSenderIDMismatch:
		e.Class, e.BadAddress = providers.Permanent, true
	case codeInvalidArgument:
		e.Class = providers.Permanent
	case codeThirdPartyAuth:
		// The project's APNs certificate or web push key is missing or refused: iOS and web tokens cannot
		// be sent to until it is fixed, Android tokens can. Not the account's failure (it held every
		// campaign as provider_auth, Android included) nor the token's: the recipient waits for a later
		// run, and fails for good after worker.MaxRecipientAttempts runs that met it.
		e.Class, e.RecipientLimited, e.RetryAfter = providers.Transient, true, thirdPartyAuthWait
	case codeQuotaExceeded, codeUnavailable, codeInternal:
		e.Class = providers.Transient
	default:
		switch {
		case status == http.StatusTooManyRequests, status == http.StatusRequestTimeout, status >= 500:
			e.Class = providers.Transient
		case status >= 300 && status <= 399:
			e.Class = providers.Permanent
			text = "unexpected redirect: check FCM_BASE_URL"
		default:
			e.Class = providers.Permanent
		}
	}
	if text == "" {
		text = "undecodable response"
	}
	switch {
	case status == http.StatusUnauthorized && code != codeThirdPartyAuth:
		text += ": check GOOGLE_APPLICATION_CREDENTIALS"
	case code == codeThirdPartyAuth:
		text += ": check the Firebase project's APNs certificate or web push key (iOS and web tokens wait)"
	case (status == http.StatusForbidden || status == http.StatusNotFound) && code == "":
		// Not about the device: a wrong project, or a service account without FCM permission.
		text += ": check FCM_PROJECT_ID and the service account's roles"
	}
	e.Message = text
	if e.Class == providers.Transient && !e.RecipientLimited {
		e.RetryAfter = wire.ParseRetryAfter(retryAfter, now)
	}
	return e, code
}

// tokenError classifies a failure to get an access token. Nothing was sent to FCM.
func tokenError(err error, now time.Time) error {
	var re *oauth2.RetrieveError
	if errors.As(err, &re) && re.Response != nil {
		st := re.Response.StatusCode
		what := "token endpoint answered " + strconv.Itoa(st)
		if c := oauthErrorCode(re.Body); c != "" {
			what += " " + c
		}
		if st == http.StatusRequestTimeout || st == http.StatusTooManyRequests || st >= 500 {
			return &providers.Error{Provider: "fcm", Status: st, Class: providers.Transient, Message: what,
				RetryAfter: wire.ParseRetryAfter(re.Response.Header.Get("Retry-After"), now)}
		}
		// The endpoint refused the service account (invalid_grant: a deleted or rotated key, a wrong
		// client_email, a clock far off) or is not a token endpoint at all. Every message would fail the
		// same way: report it as the 401 it amounts to, which makes it account-level.
		return &providers.Error{Provider: "fcm", Status: http.StatusUnauthorized, Class: providers.Permanent,
			Message: what + ": check GOOGLE_APPLICATION_CREDENTIALS"}
	}
	// A transport error, or an answer that was not a token: oauth2 flattens both into text (quoting the
	// token URL, never the assertion). Nothing was sent, so it may be retried.
	return &providers.Error{Provider: "fcm", Class: providers.Transient, Message: "cannot get an access token",
		Err: errors.New(sanitizeTokenErr(err.Error()))}
}

// oauthErrorCode returns RFC 6749's "error" member of a token endpoint's JSON answer if it looks like one
// (a short word), "" otherwise. error_description is left out: it is free text from the endpoint.
func oauthErrorCode(body []byte) string {
	var v struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(body, &v) != nil || len(v.Error) > 64 {
		return ""
	}
	for _, c := range v.Error {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c >= '0' && c <= '9') {
			return ""
		}
	}
	return v.Error
}

// sanitizeTokenErr keeps the first line of an oauth2 error text (a RetrieveError appends the answer body
// after a newline) and bounds it.
func sanitizeTokenErr(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return wire.Truncate(s, 300)
}

// redactText removes the device token from a text that came from FCM, and the credentials, addresses and
// phone numbers it may quote (the request's Authorization header, its data: providers.ScrubText), and
// bounds its length.
func redactText(s, to string) string {
	if to != "" {
		s = strings.ReplaceAll(s, to, "[token]")
	}
	return wire.Truncate(providers.ScrubText(s), maxMessage)
}

// redactErr wraps err so that its text holds neither the access token nor the device token; errors.Is
// and errors.As still see err.
func redactErr(err error, accessToken, to string) error {
	msg := err.Error()
	for _, secret := range []string{accessToken, to} {
		if secret != "" {
			msg = strings.ReplaceAll(msg, secret, "[redacted]")
		}
	}
	return wire.Redacted(providers.ScrubSecrets(msg), err)
}
