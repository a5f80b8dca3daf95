package providers

import (
	"errors"
	"fmt"
	"net/url"
)

// ParseBaseURL checks a provider's base URL from the environment variable env (TWILIO_BASE_URL, ...) for
// provider name: http or https, a host, no user or password, no query or fragment, and no path unless
// withPath. An error says what is wrong with it, and quotes it with any password masked (a parse error
// would quote it whole). It returns the URL as given, less a trailing "/" path.
func ParseBaseURL(name, env, raw string, withPath bool) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, errors.New(name + ": base URL is not a valid URL: check " + env)
	}
	var problem string
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		problem = "its scheme is not http or https"
	case u.Host == "":
		problem = "it has no host"
	case u.User != nil:
		problem = "it carries a user name or password (the credentials have variables of their own)"
	case !withPath && u.Path != "" && u.Path != "/":
		problem = "it has a path"
	case u.RawQuery != "" || u.Fragment != "":
		problem = "it has a query or a fragment"
	default:
		if u.Path == "/" {
			u.Path = ""
		}
		return u, nil
	}
	form := "http(s)://host[:port]"
	if withPath {
		form += "[/path]"
	}
	return nil, fmt.Errorf("%s: base URL %q must be %s, but %s: check %s", name, u.Redacted(), form, problem, env)
}
