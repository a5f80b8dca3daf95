package campaign

import (
	"fmt"
	"slices"
	"strings"
)

// PushDataPrefix begins the audience columns that go into a push's data payload as they are, for the app
// (a deep link, a screen to open), whether or not the message prints them.
const PushDataPrefix = "data_"

// MaxPushBytes is the most FCM takes of a message's title, body and data together.
const MaxPushBytes = 4096

// PushData is a push's data payload from the values data (TemplateData) of a message rendered with t: the
// engine's own values (the code, the campaign, the user), the columns the message prints (when t is
// plain; otherwise none besides), and the columns named PushDataPrefix*. The rest of the audience's
// columns (an e-mail address, a phone number the audience selected for another use) stay here, and the
// address column too. FCM's reserved keys (from, message_type, notification, google*, gcm*) never go: one
// of them failed every message of a campaign.
func PushData(t *Template, data map[string]any, addressColumn string) map[string]string {
	fields, plain := t.PlainFields()
	out := make(map[string]string, len(data))
	for k, v := range data {
		if k == addressColumn || !pushDataKey(k, fields, plain) {
			continue
		}
		out[k] = fmt.Sprint(v)
	}
	return out
}

func pushDataKey(k string, fields []string, plain bool) bool {
	lower := strings.ToLower(k)
	if lower == "from" || lower == "message_type" || lower == "notification" || strings.HasPrefix(lower, "google") || strings.HasPrefix(lower, "gcm") {
		return false
	}
	switch {
	case k == "code" || k == "campaign" || k == "user_id", strings.HasPrefix(k, PushDataPrefix):
		return true
	case plain:
		return slices.Contains(fields, k)
	}
	return false
}

// PushBytes is about what FCM counts of a push: its title, body, and data keys and values.
func PushBytes(title, body string, data map[string]string) int {
	n := len(title) + len(body)
	for k, v := range data {
		n += len(k) + len(v)
	}
	return n
}
