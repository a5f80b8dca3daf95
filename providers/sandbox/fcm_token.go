package sandbox

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// jwtBearerGrant is the grant type of the service-account flow (RFC 7523).
const jwtBearerGrant = "urn:ietf:params:oauth:grant-type:jwt-bearer"

// fcmTokenTTL is the lifetime of an access token, Google's hour.
const fcmTokenTTL = time.Hour

// fcmClockSkew is how far an assertion's iat may lie in the future, for clocks that drift.
const fcmClockSkew = time.Minute

// Scopes that allow sending: FCM's own and the catch-all cloud-platform.
var fcmScopes = []string{
	"https://www.googleapis.com/auth/firebase.messaging",
	"https://www.googleapis.com/auth/cloud-platform",
}

// serviceAccountKeys maps the client_email of each service account WriteServiceAccount wrote in this
// process to its public key, so that every sandbox in the process can check the assertions' RS256
// signatures. Assertions from other issuers are checked for shape only: the sandbox cannot know their key.
var serviceAccountKeys sync.Map // string → *rsa.PublicKey

// WriteServiceAccount writes to path (mode 0600) a Google service-account JSON key for the FCM fake: a
// freshly generated RSA key, a client_email unique to this call, project_id projectID, and token_uri
// sandboxURL + "/token". Sandboxes in the same process verify the signatures of this key's assertions;
// it is for tests and demos only.
func WriteServiceAccount(path, sandboxURL, projectID string) error {
	if projectID == "" || !isProjectIDLike(projectID) {
		return fmt.Errorf("write service account: project ID %q must be letters, digits and '-'", projectID)
	}
	u, err := url.Parse(sandboxURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("write service account: sandbox URL must be http(s)://host[:port]")
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return fmt.Errorf("write service account: generate key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("write service account: encode key: %w", err)
	}
	var id [20]byte
	_, _ = rand.Read(id[:])
	clientID, _ := rand.Int(rand.Reader, new(big.Int).Exp(big.NewInt(10), big.NewInt(21), nil))
	email := fmt.Sprintf("campaignctl-sandbox-%s@%s.iam.gserviceaccount.com", hex.EncodeToString(id[:4]), projectID)
	sa := map[string]string{
		"type":                        "service_account",
		"project_id":                  projectID,
		"private_key_id":              hex.EncodeToString(id[:]),
		"private_key":                 string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email":                email,
		"client_id":                   clientID.String(),
		"auth_uri":                    "https://accounts.google.com/o/oauth2/auth",
		"token_uri":                   strings.TrimRight(sandboxURL, "/") + "/token",
		"auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
		"client_x509_cert_url":        "https://www.googleapis.com/robot/v1/metadata/x509/" + url.PathEscape(email),
		"universe_domain":             "googleapis.com",
	}
	data, err := json.MarshalIndent(sa, "", "  ")
	if err != nil {
		return fmt.Errorf("write service account: %w", err)
	}
	if err := os.WriteFile(path, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("write service account: %w", err)
	}
	serviceAccountKeys.Store(email, &key.PublicKey)
	return nil
}

func isProjectIDLike(s string) bool {
	return !strings.ContainsFunc(s, func(r rune) bool {
		return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '-')
	})
}

// fcmTokenEndpoint imitates Google's OAuth2 token endpoint for the JWT-bearer grant a service account
// uses: it checks the assertion's header and claims (and its signature when the issuer's key is known)
// and answers with a bearer token valid for an hour. Refusals are 400 with RFC 6749's error JSON, as
// Google's are. Neither the assertion nor the token is ever logged.
func (s *Server) fcmTokenEndpoint(w http.ResponseWriter, r *http.Request) {
	s.fcm.count(func(st *FCMStats) { st.TokenRequests++ })
	sleep(r.Context(), s.opts.Latency)
	refuse := func(code, desc string) {
		s.fcm.count(func(st *FCMStats) { st.TokensRefused++ })
		s.logger.Debug("sandbox fcm token refused", "error", code, "reason", desc)
		w.Header().Set("Cache-Control", "no-store")
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": code, "error_description": desc})
	}
	r.Body = http.MaxBytesReader(w, r.Body, 1<<16)
	if err := r.ParseForm(); err != nil {
		refuse("invalid_request", "Cannot parse the request body.")
		return
	}
	if gt := r.PostForm.Get("grant_type"); gt != jwtBearerGrant {
		refuse("unsupported_grant_type", "Invalid grant_type: "+truncateText(gt, 80))
		return
	}
	iss, code, desc := checkAssertion(r.PostForm.Get("assertion"), time.Now())
	if code != "" {
		refuse(code, desc)
		return
	}
	tok := s.fcm.issue(fcmTokenTTL, time.Now())
	s.logger.Debug("sandbox fcm token issued", "iss", iss)
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, map[string]any{
		"access_token": tok,
		"token_type":   "Bearer",
		"expires_in":   int(fcmTokenTTL / time.Second),
	})
}

// jwtClaims are the claims of a service-account assertion.
type jwtClaims struct {
	Iss   string `json:"iss"`
	Scope string `json:"scope"`
	Aud   string `json:"aud"`
	Exp   int64  `json:"exp"`
	Iat   int64  `json:"iat"`
}

// checkAssertion checks a JWT-bearer assertion the way Google does, and returns its issuer, or an OAuth2
// error code and description. The description never quotes the assertion.
func checkAssertion(assertion string, now time.Time) (iss, code, desc string) {
	const bad = "invalid_grant"
	parts := strings.Split(assertion, ".")
	if assertion == "" || len(parts) != 3 {
		return "", bad, "Invalid JWT: the assertion must be three base64url parts."
	}
	var hdr struct {
		Alg string `json:"alg"`
		Typ string `json:"typ"`
	}
	var claims jwtClaims
	if err := decodeJWTPart(parts[0], &hdr); err != nil {
		return "", bad, "Invalid JWT: the header is not base64url JSON."
	}
	if err := decodeJWTPart(parts[1], &claims); err != nil {
		return "", bad, "Invalid JWT: the claim set is not base64url JSON."
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	switch {
	case hdr.Alg != "RS256":
		return "", bad, "Invalid JWT: the algorithm must be RS256."
	case hdr.Typ != "" && hdr.Typ != "JWT":
		return "", bad, "Invalid JWT: typ must be JWT."
	case err != nil || len(sig) == 0:
		return "", bad, "Invalid JWT Signature."
	case claims.Iss == "" || !strings.Contains(claims.Iss, "@"):
		return "", bad, "Invalid JWT: iss must be the service account's e-mail."
	case !audienceIsToken(claims.Aud):
		return "", bad, "Invalid JWT: Failed audience check. The audience must be the token endpoint."
	case claims.Exp == 0 || claims.Iat == 0:
		return "", bad, "Invalid JWT: iat and exp are required."
	case time.Unix(claims.Iat, 0).After(now.Add(fcmClockSkew)),
		!time.Unix(claims.Exp, 0).After(now),
		claims.Exp-claims.Iat > int64(fcmTokenTTL/time.Second):
		return "", bad, "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. Check your iat and exp values in the JWT claim."
	}
	if key, ok := serviceAccountKeys.Load(claims.Iss); ok {
		h := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
		if rsa.VerifyPKCS1v15(key.(*rsa.PublicKey), crypto.SHA256, h[:], sig) != nil {
			return "", bad, "Invalid JWT Signature."
		}
	}
	if !hasScope(claims.Scope) {
		return "", "invalid_scope", "Invalid OAuth scope or ID token audience provided."
	}
	return claims.Iss, "", ""
}

func decodeJWTPart(part string, v any) error {
	data, err := base64.RawURLEncoding.DecodeString(part)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, v)
}

// audienceIsToken reports whether aud names a token endpoint ("https://oauth2.googleapis.com/token", or
// this sandbox's /token under whatever host name the client used).
func audienceIsToken(aud string) bool {
	u, err := url.Parse(aud)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" && u.Path == "/token"
}

func hasScope(scope string) bool {
	for _, sc := range strings.Fields(scope) {
		if slices.Contains(fcmScopes, sc) {
			return true
		}
	}
	return false
}

func truncateText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
