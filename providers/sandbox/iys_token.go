package sandbox

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"
)

// İYS's token lifetimes: two hours for the access token, four for the refresh token.
const (
	iysTokenTTL   = 2 * time.Hour
	iysRefreshTTL = 4 * time.Hour
)

// iysToken imitates POST /oauth2/token (createToken2): the password and refresh_token grants, in JSON
// or form-encoded. Neither the password nor any token is ever logged.
func (s *Server) iysToken(w http.ResponseWriter, r *http.Request) {
	const op = "token"
	st := s.iys
	st.count(func(x *IYSStats) { x.TokenRequests++ })
	sleep(r.Context(), s.opts.Latency)
	refuse := func(code, desc string) {
		st.count(func(x *IYSStats) {
			x.TokensRefused++
			x.ByCode[code]++
		})
		s.iysLog(op, "", http.StatusBadRequest, code)
		w.Header().Set("Cache-Control", "no-store")
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": code, "error_description": desc})
	}
	ip := clientIP(r)
	if !st.limiter.allow(ip) {
		st.count(func(x *IYSStats) { x.TokensRefused++ })
		w.Header().Set("Retry-After", "1")
		s.iysFail(w, op, "", http.StatusTooManyRequests, iysErrorItem{Code: "H124", Message: iysMsgRate})
		return
	}
	if !st.tokenHourAllows(ip) {
		st.count(func(x *IYSStats) { x.TokensRefused++ })
		w.Header().Set("Retry-After", "3600")
		s.iysFail(w, op, "", http.StatusTooManyRequests, iysErrorItem{Code: "H084", Message: iysMsgHourlyToken})
		return
	}
	form, ok := iysTokenForm(w, r)
	if !ok {
		refuse("invalid_request", "Giriş yöntemi belirtilmemiş.")
		return
	}
	gt, has := form["grant_type"]
	switch {
	case !has:
		refuse("invalid_request", "Giriş yöntemi belirtilmemiş.")
		return
	case gt == "":
		refuse("invalid_grant", "Giriş yöntemi boş olamaz.")
		return
	case gt == "password":
		user, hasUser := form["username"]
		pass, hasPass := form["password"]
		switch {
		case !hasUser:
			refuse("invalid_request", "Kullanıcı adı verilmemiş.")
		case user == "":
			refuse("invalid_grant", "Kullanıcı adı boş bırakılamaz.")
		case !hasPass:
			refuse("invalid_request", "Şifre verilmemiş.")
		case pass == "":
			refuse("invalid_grant", "Şifre boş bırakılamaz.")
		case !st.credentialsMatch(user, pass):
			refuse("invalid_request", "Kullanıcı kimlik bilgileri geçersiz.")
		default:
			s.iysIssue(w, false)
		}
		return
	case gt == "refresh_token":
		rt, hasRT := form["refresh_token"]
		switch {
		case !hasRT:
			refuse("invalid_request", "Yenileme jetonu verilmemiş.")
		case rt == "":
			refuse("invalid_grant", "Yenileme jetonu boş olamaz.")
		case !st.useRefresh(rt):
			refuse("invalid_grant", "Yenileme jetonu geçersiz veya süresi dolmuş.")
		default:
			s.iysIssue(w, true)
		}
		return
	default:
		refuse("invalid_request", "Bilinmeyen giriş yöntemi.")
	}
}

// iysTokenForm reads the token request's fields from a JSON object or a form. A field present with an
// empty value is kept, so that "missing" and "empty" get İYS's different answers.
func iysTokenForm(w http.ResponseWriter, r *http.Request) (map[string]string, bool) {
	r.Body = http.MaxBytesReader(w, r.Body, 1<<16)
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mt == "application/json" {
		data, err := io.ReadAll(r.Body)
		if err != nil {
			return nil, false
		}
		var raw map[string]any
		if err := json.Unmarshal(data, &raw); err != nil {
			return nil, false
		}
		out := make(map[string]string, len(raw))
		for k, v := range raw {
			if str, ok := v.(string); ok {
				out[k] = str
			}
		}
		return out, true
	}
	if err := r.ParseForm(); err != nil {
		return nil, false
	}
	out := make(map[string]string, len(r.PostForm))
	for k, v := range r.PostForm {
		out[k] = v[0]
	}
	return out, true
}

// credentialsMatch compares in constant time; with no configured pair any non-empty one passes.
func (st *iysState) credentialsMatch(user, pass string) bool {
	if st.opts.IYSUsername == "" && st.opts.IYSPassword == "" {
		return true
	}
	u := subtle.ConstantTimeCompare([]byte(user), []byte(st.opts.IYSUsername))
	p := subtle.ConstantTimeCompare([]byte(pass), []byte(st.opts.IYSPassword))
	return u&p == 1
}

// tokenHourAllows counts a token request against the client's hourly budget. A refused request restarts
// the hour, as İYS does.
func (st *iysState) tokenHourAllows(ip string) bool {
	limit := st.opts.IYSTokenPerHour
	if limit <= 0 {
		return true
	}
	now := st.now()
	st.mu.Lock()
	defer st.mu.Unlock()
	h, ok := st.tokenHr[ip]
	if !ok || now.Sub(h.start) >= time.Hour {
		h = &hourWindow{start: now}
		st.tokenHr[ip] = h
	}
	h.n++
	if h.n > limit {
		h.start = now
		return false
	}
	return true
}

// useRefresh consumes a refresh token: it is valid once, until its expiry.
func (st *iysState) useRefresh(tok string) bool {
	now := st.now()
	st.mu.Lock()
	defer st.mu.Unlock()
	exp, ok := st.refresh[tok]
	delete(st.refresh, tok)
	return ok && now.Before(exp)
}

// iysIssue answers a new access and refresh token pair.
func (s *Server) iysIssue(w http.ResponseWriter, refreshed bool) {
	st := s.iys
	ttl := cmpOr(st.opts.IYSTokenTTL, iysTokenTTL)
	rttl := cmpOr(st.opts.IYSRefreshTTL, iysRefreshTTL)
	now := st.now()
	access := st.jwt("Bearer", now, ttl)
	refresh := st.jwt("Refresh", now, rttl)
	st.mu.Lock()
	for t, exp := range st.access {
		if !now.Before(exp) {
			delete(st.access, t)
		}
	}
	for t, exp := range st.refresh {
		if !now.Before(exp) {
			delete(st.refresh, t)
		}
	}
	st.access[access] = now.Add(ttl)
	st.refresh[refresh] = now.Add(rttl)
	if refreshed {
		st.stats.RefreshGrants++
	} else {
		st.stats.PasswordGrants++
	}
	st.mu.Unlock()
	s.logger.Debug("sandbox iys token issued", "grant", map[bool]string{false: "password", true: "refresh_token"}[refreshed])
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, map[string]any{
		"access_token":       access,
		"refresh_token":      refresh,
		"expires_in":         int64(ttl / time.Second),
		"refresh_expires_in": int64(rttl / time.Second),
		"token_type":         "bearer",
	})
}

func cmpOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// jwt returns a signed token shaped like İYS's (a Keycloak JWT whose claims name the service provider
// and its brands). Only the fake reads it back, by lookup; the signature just makes it look real.
func (st *iysState) jwt(typ string, now time.Time, ttl time.Duration) string {
	var jti [16]byte
	_, _ = rand.Read(jti[:])
	claims := map[string]any{
		"jti": hex.EncodeToString(jti[:]),
		"iat": now.Unix(),
		"exp": now.Add(ttl).Unix(),
		"typ": typ,
		"serviceProvider": map[string]any{
			"iysCode": st.opts.IYSCode,
		},
		"brands": []map[string]any{{"brandCode": st.opts.IYSBrandCode}},
	}
	hdr, _ := json.Marshal(map[string]string{"alg": "HS256", "typ": "JWT"})
	body, _ := json.Marshal(claims)
	unsigned := base64.RawURLEncoding.EncodeToString(hdr) + "." + base64.RawURLEncoding.EncodeToString(body)
	mac := hmac.New(sha256.New, st.jwtKey[:])
	mac.Write([]byte(unsigned))
	return unsigned + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// authorized reports whether r carries an access token the fake issued and that has not expired.
func (st *iysState) authorized(r *http.Request) bool {
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
		return false
	}
	now := st.now()
	st.mu.Lock()
	defer st.mu.Unlock()
	exp, ok := st.access[tok]
	return ok && now.Before(exp)
}

// ExpireIYSTokens makes every access token issued so far expire now, as if its two hours were up:
// the next API request with one gets 401 H351. Refresh tokens stay valid.
func (s *Server) ExpireIYSTokens() {
	st := s.iys
	now := st.now()
	st.mu.Lock()
	defer st.mu.Unlock()
	for t := range st.access {
		st.access[t] = now
	}
}

// RevokeIYSTokens forgets every access and refresh token issued: only the password grant works again.
func (s *Server) RevokeIYSTokens() {
	st := s.iys
	st.mu.Lock()
	defer st.mu.Unlock()
	clear(st.access)
	clear(st.refresh)
}
