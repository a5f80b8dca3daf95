package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/campaignctl/campaignctl/campaign"
	"github.com/campaignctl/campaignctl/worker"
)

const (
	defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/campaignctl?sslmode=disable"
	defaultRedisURL    = "redis://127.0.0.1:6379/0"
)

// setting resolves flag > environment > default.
func (a *app) setting(flag, env, def string) string {
	if flag != "" {
		return flag
	}
	if v := a.getenv(env); v != "" {
		return v
	}
	return def
}

func (a *app) dbURL() string { return a.setting(a.databaseURL, "DATABASE_URL", defaultDatabaseURL) }

// settingName is how messages name a setting: its flag when it was given, else its variable.
func settingName(flagValue, flag, env string) string {
	if flagValue != "" {
		return flag
	}
	return env
}

// dbName, audienceDBName and redisName name the engine database's, the audience database's and Redis's
// settings in messages.
func (a *app) dbName() string { return settingName(a.databaseURL, "--database-url", "DATABASE_URL") }
func (a *app) audienceDBName() string {
	if a.audienceURL == "" && a.getenv("AUDIENCE_DATABASE_URL") == "" {
		return a.dbName() // the engine database's, taken as the audience's
	}
	return settingName(a.audienceURL, "--audience-database-url", "AUDIENCE_DATABASE_URL")
}
func (a *app) redisName() string { return settingName(a.redisURL, "--redis-url", "REDIS_URL") }

func (a *app) audienceDBURL() string {
	return a.setting(a.audienceURL, "AUDIENCE_DATABASE_URL", a.dbURL())
}

// redact removes the credentials from a URL for messages: the password, or the user name when it is
// the only credential (a token). A URL that does not parse has whatever precedes the '@' of its
// authority masked.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Opaque != "" || !strings.Contains(raw, "://") {
		// Not a URL: "user:password@host", or a keyword/value connection string (host=… password=…).
		return dsnSecret.ReplaceAllString(redactAuthority(raw), "${1}=xxxxx")
	}
	if u.User != nil {
		if _, hasPassword := u.User.Password(); !hasPassword {
			u.User = url.User("xxxxx")
		}
	}
	// A password may come as a query parameter too (postgres://app@host/db?password=…,
	// redis+sentinel://…?sentinel_password=…).
	if q := u.Query(); len(q) > 0 {
		masked := false
		for k := range q {
			if secretParam.MatchString(k) {
				q.Set(k, "xxxxx")
				masked = true
			}
		}
		if masked {
			u.RawQuery = q.Encode()
		}
	}
	return u.Redacted()
}

// secretParam matches the name of a parameter that holds a secret: password, sslpassword,
// sentinel_password, and any other name ending in password, secret or token.
var secretParam = regexp.MustCompile(`(?i)^\w*(password|secret|token)$`)

// dsnSecret finds a password in a keyword/value connection string or a query: its value, quoted or not.
// libpq's escapes count: a backslash keeps the character after it (a space) in the value, and a quote left
// open runs to the end.
var dsnSecret = regexp.MustCompile(`(?i)\b(\w*(?:password|secret|token))\s*=\s*('(?:[^'\\]|\\.)*'?|(?:\\.|[^\s&\\])+)`)

// redactAuthority masks the user information of a URL that url.Parse refuses (or reads as opaque, as
// it does "user:password@host"): everything after the scheme up to the last '@'. A password may hold
// any character, so no other delimiter is trusted; masking a path's '@' too is the lesser harm.
func redactAuthority(raw string) string {
	start := 0
	if i := strings.Index(raw, "://"); i >= 0 {
		start = i + len("://")
	}
	at := strings.LastIndex(raw[start:], "@")
	if at < 0 {
		return raw
	}
	return raw[:start] + "xxxxx" + raw[start+at:]
}

// openDB connects to a Postgres database and checks it answers, with an error that says which address
// failed and what to do.
// maxConns, when not 0, is the pool's size unless the URL sets pool_max_conns.
func (a *app) openDB(ctx context.Context, raw, envName string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := poolConfig(raw, envName, maxConns)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, dbError(err, cfg.ConnConfig, envName)
	}
	return pool, nil
}

// poolConfig is the pool configuration of the database at raw (named envName in messages).
func poolConfig(raw, envName string, maxConns int32) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(raw)
	if err != nil {
		return nil, usagef("%s is not a valid Postgres URL (%s); use postgres://user[:password]@host:port/database", envName, redact(raw))
	}
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	if maxConns > 0 && !strings.Contains(raw, "pool_max_conns") {
		cfg.MaxConns = maxConns
	}
	return cfg, nil
}

// openEngineLater is the engine database's pool without a connection yet (pgxpool connects on demand):
// for a server that serves while Postgres is away (webhooks, with its refusal spool). The caller checks
// the schema once Postgres answers (awaitSchema).
func (a *app) openEngineLater(ctx context.Context) (*pgxpool.Pool, error) {
	cfg, err := poolConfig(a.dbURL(), a.dbName(), a.engineConns)
	if err != nil {
		return nil, err
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// postgresAway says whether openEngine's err is Postgres being out of reach (down, restarting, refusing
// connections), not something wrong in the configuration (a bad URL, user or database: usage errors) or a
// schema of another version.
func postgresAway(err error) bool {
	var ue usageError
	return err != nil && !errors.As(err, &ue) && !errors.Is(err, campaign.ErrSchema)
}

// awaitSchema checks pool's schema once Postgres answers, every second until it does; a schema of another
// version ends the process (stop), as it would have at the start.
func awaitSchema(ctx context.Context, pool *pgxpool.Pool, stop context.CancelCauseFunc, log *slog.Logger) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		err := campaign.CheckSchema(ctx, pool)
		switch {
		case err == nil:
			log.Info("Postgres answers; the schema is this version's")
			return
		case errors.Is(err, campaign.ErrSchema):
			stop(err)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func dbError(err error, cc *pgx.ConnConfig, envName string) error {
	if at := strings.LastIndex(cc.Host, "@"); at >= 0 {
		// A password with an '@' that was not percent-encoded: the parser took its tail for the host.
		// Neither the address nor the resolver's error may show it.
		return usagef("%s names the host xxxxx%s:%d, which is none: an '@' in the password must be percent-encoded as %%40 (postgres://user:pa%%40ss@host:5432/db)",
			envName, cc.Host[at:], cc.Port)
	}
	addr := fmt.Sprintf("%s:%d", cc.Host, cc.Port)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// The server answered: what is wrong is in the URL (bad input, exit 2), not the server.
		switch pgErr.Code {
		case "3D000": // invalid_catalog_name
			return usagef("database %q does not exist on %s; create it with `campaignctl migrate`, or fix the database name in %s", cc.Database, addr, envName)
		case "28000", "28P01": // invalid_authorization_specification, invalid_password
			return usagef("Postgres at %s refused user %q (database %q): %s (SQLSTATE %s); check the user and password in %s",
				addr, cc.User, cc.Database, pgErr.Message, pgErr.Code, envName)
		case "42704", "22023", "42501": // a setting in the URL's query unknown, of a bad value, or not the user's to set
			return usagef("Postgres at %s refused a setting that %s passes (database %q): %s (SQLSTATE %s); fix or drop it in the URL's query (?...)",
				addr, envName, cc.Database, pgErr.Message, pgErr.Code)
		}
	}
	return fmt.Errorf("Postgres is not reachable at %s (database %q): %s; start it (scripts/test.sh or scripts/demo.sh install and start it) or point %s at a running server",
		addr, cc.Database, distinctLines(cause(err)), envName)
}

// cause is what err wraps (pgx's connection error around the attempts' errors), or err itself when it
// wraps nothing: a connection lost during a Postgres restart came as a bare error, and "<nil>" was printed.
func cause(err error) error {
	if u := errors.Unwrap(err); u != nil {
		return u
	}
	return err
}

// distinctLines is err's text with each line once: pgx joins the error of every attempt it made, and
// without sslmode it tries with TLS and then without, so an unreachable server's one reason came twice.
func distinctLines(err error) string {
	var lines []string
	for _, l := range strings.Split(err.Error(), "\n") {
		if !slices.Contains(lines, l) {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "; ")
}

// openEngine opens the engine database and checks that it carries this version's schema.
func (a *app) openEngine(ctx context.Context) (*pgxpool.Pool, error) {
	pool, err := a.openDB(ctx, a.dbURL(), a.dbName(), a.engineConns)
	if err != nil {
		return nil, err
	}
	if err := campaign.CheckSchema(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// newRedis builds the client of --redis-url (REDIS_URL) without asking Redis anything; where names the
// server for messages.
func (a *app) newRedis() (rdb *redis.Client, where string, err error) {
	return redisClient(a.setting(a.redisURL, "REDIS_URL", defaultRedisURL), a.logger())
}

// openRedis connects to Redis and checks it answers.
func (a *app) openRedis(ctx context.Context) (*redis.Client, error) {
	return a.pingRedis(ctx, a.newRedis, 5*time.Second)
}

// openQueueRedis is openRedis for a command that takes no claim (launch): see queueRedisClient.
func (a *app) openQueueRedis(ctx context.Context) (*redis.Client, error) {
	return a.pingRedis(ctx, func() (*redis.Client, string, error) {
		return queueRedisClient(a.setting(a.redisURL, "REDIS_URL", defaultRedisURL))
	}, 5*time.Second)
}

// pingRedis builds the client newRedis gives and checks, within wait, that Redis answers.
func (a *app) pingRedis(ctx context.Context, newRedis func() (*redis.Client, string, error), wait time.Duration) (*redis.Client, error) {
	rdb, where, err := newRedis()
	if err != nil {
		return nil, usagef("%s: %v", a.redisName(), err)
	}
	pctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		rdb.Close()
		if errors.Is(err, worker.ErrNotMaster) {
			return nil, fmt.Errorf("Redis at %s: %v; nothing was changed or sent", where, err)
		}
		if msg := err.Error(); strings.HasPrefix(msg, "WRONGPASS") || strings.HasPrefix(msg, "NOAUTH") || strings.Contains(msg, "called without any password configured") {
			return nil, usagef("Redis at %s refused the connection: %v; nothing was changed or sent. Check the user and password in %s (redis://user:password@host:port/db)", where, err, a.redisName())
		}
		if strings.Contains(err.Error(), "DB index is out of range") {
			return nil, usagef("%s names a database number this Redis does not have (%s: %v); use one of its databases, 0 to 15 unless its `databases` setting says more, e.g. redis://127.0.0.1:6379/0", a.redisName(), where, err)
		}
		return nil, fmt.Errorf("Redis is not reachable at %s: %v; nothing was changed or sent. Start it (scripts/test.sh or scripts/demo.sh install and start it) or point %s at a running server", where, err, a.redisName())
	}
	return rdb, nil
}

// services are the engine database and Redis that the campaign commands use, both checked.
type services struct {
	engine *pgxpool.Pool
	redis  *redis.Client
	store  *campaign.Store
}

// Close releases both connections.
func (s *services) Close() {
	if s.redis != nil {
		s.redis.Close()
	}
	s.engine.Close()
}

// openServices opens the engine database and Redis, both checked; Close releases them. A command about one
// campaign gives its ID (0: none): a campaign that does not exist is refused (campaign.ErrNotFound) before
// Redis is opened, since the first connection writes the Redis epoch where there is none yet, and a
// refused command writes nothing.
func (a *app) openServices(ctx context.Context, campaignID int64) (*services, error) {
	engine, err := a.openCampaignEngine(ctx, campaignID)
	if err != nil {
		return nil, err
	}
	rdb, err := a.openRedis(ctx)
	if err != nil {
		engine.Close()
		return nil, err
	}
	return &services{engine: engine, redis: rdb, store: campaign.NewStore(engine)}, nil
}

// openCampaignEngine opens the engine database and, when campaignID is not 0, checks the campaign exists
// (campaign.ErrNotFound otherwise): before Redis is opened, whose first connection may write.
func (a *app) openCampaignEngine(ctx context.Context, campaignID int64) (*pgxpool.Pool, error) {
	engine, err := a.openEngine(ctx)
	if err != nil {
		return nil, err
	}
	if campaignID != 0 {
		if _, err := campaign.NewStore(engine).Get(ctx, campaignID); err != nil {
			engine.Close()
			return nil, err
		}
	}
	return engine, nil
}

// openServicesForHalt is openServices for pause and cancel, which are recorded in Postgres first: when
// Redis does not answer within a second (down, stalled, out of this machine's reach), they go on with a
// client that is not checked. Their halt mark cannot be written then (worker.Pause and worker.Cancel say
// so); the workers, which send nothing while Redis is away from them, stop at their next chunk. Redis is
// given a second, not the five other commands wait: where the workers still reach it, they send
// meanwhile. A REDIS_URL that is not one, or that Redis refuses (its password, its DB number), stays
// refused (exit 2), before anything is written.
func (a *app) openServicesForHalt(ctx context.Context, campaignID int64) (*services, error) {
	engine, err := a.openCampaignEngine(ctx, campaignID)
	if err != nil {
		return nil, err
	}
	store := campaign.NewStore(engine)
	newRedis := func() (*redis.Client, string, error) {
		return haltRedisClient(a.setting(a.redisURL, "REDIS_URL", defaultRedisURL), a.logger())
	}
	rdb, err := a.pingRedis(ctx, newRedis, time.Second)
	var bad usageError
	switch {
	case err == nil:
	case errors.As(err, &bad):
		engine.Close()
		return nil, err
	default:
		if rdb, _, err = newRedis(); err != nil {
			engine.Close()
			return nil, err
		}
	}
	return &services{engine: engine, redis: rdb, store: store}, nil
}

// rate reads a messages-per-second cap from the environment.
func (a *app) rate(env string, def float64) (float64, error) {
	v := strings.TrimSpace(a.getenv(env))
	if v == "" {
		return def, nil
	}
	r, err := strconv.ParseFloat(v, 64)
	if err != nil || r < 0 || math.IsNaN(r) || math.IsInf(r, 0) {
		return 0, usagef("%s=%q must be a number of messages per second (0 = no cap)", env, v)
	}
	if r > 0 && r < campaign.MinRate {
		return 0, usagef("%s=%q is below one message an hour: set at least %.6f (one an hour), or 0 for no cap", env, v, campaign.MinRate)
	}
	return r, nil
}
