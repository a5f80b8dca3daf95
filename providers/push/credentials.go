package push

import (
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
)

// defaultTokenURI is Google's OAuth2 token endpoint, used when the service-account file names none.
const defaultTokenURI = "https://oauth2.googleapis.com/token"

// serviceAccount is the part of a Google service-account key file the provider uses.
type serviceAccount struct {
	Type         string `json:"type"`
	ProjectID    string `json:"project_id"`
	PrivateKeyID string `json:"private_key_id"`
	PrivateKey   string `json:"private_key"`
	ClientEmail  string `json:"client_email"`
	TokenURI     string `json:"token_uri"`
}

// readServiceAccount reads and checks the service-account JSON at path. Its errors name
// GOOGLE_APPLICATION_CREDENTIALS and never quote the file's content: it holds the private key.
func readServiceAccount(path string) (*serviceAccount, error) {
	if path == "" {
		return nil, errors.New("fcm: credentials file is not set: set GOOGLE_APPLICATION_CREDENTIALS to the path of a service-account JSON key")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("fcm: read credentials: %w: check GOOGLE_APPLICATION_CREDENTIALS", err)
	}
	var sa serviceAccount
	if err := json.Unmarshal(data, &sa); err != nil {
		// A syntax error quotes one character of the file and a type error names a field; neither says
		// which, so give only the position.
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, fmt.Errorf("fcm: credentials file %s is not valid JSON (at byte %d): check GOOGLE_APPLICATION_CREDENTIALS", path, se.Offset)
		}
		return nil, fmt.Errorf("fcm: credentials file %s is not a service-account key: check GOOGLE_APPLICATION_CREDENTIALS", path)
	}
	switch {
	case sa.Type != "" && sa.Type != "service_account":
		return nil, fmt.Errorf("fcm: credentials file %s holds %q credentials, not a service-account key: point GOOGLE_APPLICATION_CREDENTIALS at a service-account JSON key", path, sa.Type)
	case sa.ClientEmail == "":
		return nil, fmt.Errorf("fcm: credentials file %s has no client_email: check GOOGLE_APPLICATION_CREDENTIALS", path)
	case sa.PrivateKey == "":
		return nil, fmt.Errorf("fcm: credentials file %s has no private_key: check GOOGLE_APPLICATION_CREDENTIALS", path)
	}
	if err := checkRSAKey([]byte(sa.PrivateKey)); err != nil {
		return nil, fmt.Errorf("fcm: credentials file %s: private_key %v: check GOOGLE_APPLICATION_CREDENTIALS", path, err)
	}
	if sa.TokenURI == "" {
		sa.TokenURI = defaultTokenURI
	}
	u, err := url.Parse(sa.TokenURI)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil {
		return nil, fmt.Errorf("fcm: credentials file %s: token_uri is not an http(s) URL: check GOOGLE_APPLICATION_CREDENTIALS", path)
	}
	return &sa, nil
}

// checkRSAKey checks that key is a PEM RSA private key (PKCS #8 or PKCS #1), the forms
// golang.org/x/oauth2/jwt signs with. The errors describe the problem, never the key.
func checkRSAKey(key []byte) error {
	block, _ := pem.Decode(key)
	if block == nil {
		return errors.New("is not PEM-encoded")
	}
	if strings.Contains(block.Type, "ENCRYPTED") || block.Headers["Proc-Type"] != "" {
		return errors.New("is encrypted; a service-account key is not")
	}
	if k, err := x509.ParsePKCS8PrivateKey(block.Bytes); err == nil {
		if _, ok := k.(*rsa.PrivateKey); !ok {
			return errors.New("is not an RSA key")
		}
		return nil
	}
	if _, err := x509.ParsePKCS1PrivateKey(block.Bytes); err == nil {
		return nil
	}
	return errors.New("cannot be parsed as a PKCS #8 or PKCS #1 RSA key")
}
