package providers_test

import (
	"strings"
	"testing"

	"github.com/campaignctl/campaignctl/providers"
)

// A bad base URL is refused naming what is wrong with it and the variable to fix, never with its password.
func TestABadBaseURLSaysWhatIsWrong(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		raw, says string
		withPath  bool
	}{
		{"http://user:TbSecret9@127.0.0.1:8125", "carries a user name or password", false},
		{"ftp://127.0.0.1", "scheme is not http or https", false},
		{"http://", "no host", false},
		{"http://127.0.0.1:8125/2010-04-01", "has a path", false},
		{"http://127.0.0.1:8125/?x=1", "query or a fragment", true},
		{"http://h/%zz", "not a valid URL", false},
	} {
		_, err := providers.ParseBaseURL("twilio", "TWILIO_BASE_URL", c.raw, c.withPath)
		if err == nil || !strings.Contains(err.Error(), c.says) || !strings.Contains(err.Error(), "TWILIO_BASE_URL") || strings.Contains(err.Error(), "TbSecret9") {
			t.Errorf("%s: %v; want it to say %q and name TWILIO_BASE_URL, without the password", c.raw, err, c.says)
		}
	}
	for _, c := range []struct {
		raw, want string
		withPath  bool
	}{{"https://api.twilio.com/", "https://api.twilio.com", false}, {"http://127.0.0.1:9/proxy/fcm", "http://127.0.0.1:9/proxy/fcm", true}} {
		if u, err := providers.ParseBaseURL("x", "X_BASE_URL", c.raw, c.withPath); err != nil || u.String() != c.want {
			t.Errorf("%s: %v, %v; want %s", c.raw, u, err, c.want)
		}
	}
}
