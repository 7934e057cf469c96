// Package server assembles a retryd server from its typed configuration: the
// store, the RetryService, gRPC health and reflection, and an orderly
// shutdown. cmd/retryd only parses flags into a Config and calls Run.
package server

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/retryd/retryd/admission"
	"github.com/retryd/retryd/store/redis"
)

// Config is every setting of `retryd serve`. Each field has a flag and an
// environment variable; a flag given on the command line wins over the
// environment, which wins over the default.
type Config struct {
	// Listen is the gRPC address (flag --listen, env RETRYD_LISTEN).
	Listen string
	// ConfigFile is the YAML policy file; empty means built-in defaults only
	// (flag --config, env RETRYD_CONFIG).
	ConfigFile string
	// ConfigReloadInterval is how often the policy file is checked for a
	// change (flag --config-reload-interval, env
	// RETRYD_CONFIG_RELOAD_INTERVAL).
	ConfigReloadInterval time.Duration
	// ChainTTL is how long an idle session's chains are kept (flag
	// --chain-ttl, env RETRYD_CHAIN_TTL).
	ChainTTL time.Duration
	// AbandonGrace is how long a due retry waits for an awaiter before it is
	// cancelled as abandoned (flag --abandon-grace, env RETRYD_ABANDON_GRACE).
	AbandonGrace time.Duration
	// ShutdownTimeout bounds the graceful stop after SIGTERM (flag
	// --shutdown-timeout, env RETRYD_SHUTDOWN_TIMEOUT).
	ShutdownTimeout time.Duration
	// EventLogSize is how many events the log retains (flag
	// --event-log-size, env RETRYD_EVENT_LOG_SIZE).
	EventLogSize int
	// LogLevel is debug, info, warn or error (flag --log-level, env
	// RETRYD_LOG_LEVEL).
	LogLevel string
	// LogFormat is text or json (flag --log-format, env RETRYD_LOG_FORMAT).
	LogFormat string
	// MetricsListen is the HTTP address of the Prometheus /metrics endpoint;
	// empty turns it off (flag --metrics-listen, env RETRYD_METRICS_LISTEN).
	MetricsListen string
	// Pprof serves the Go runtime profiles (net/http/pprof, under
	// /debug/pprof/) on the metrics listener, for profiling a running
	// server; needs MetricsListen (flag --pprof, env RETRYD_PPROF).
	Pprof bool
	// Store is where state lives: "memory" (lost on restart),
	// "file:DIR", durable in DIR on this node, or "redis://host:port/db"
	// (rediss:// for TLS), shared by every replica using that Redis; a
	// redis:// URL with master_name finds the master through Redis
	// Sentinel: "redis://sentinel:26379/0?master_name=NAME&addr=…" (flag
	// --store, env RETRYD_STORE).
	Store string

	// TLSCert and TLSKey are the PEM certificate chain and private key of
	// the gRPC port; both or neither. Set, the port speaks only TLS
	// (1.2 or later) (flags --tls-cert, --tls-key, env RETRYD_TLS_CERT,
	// RETRYD_TLS_KEY).
	TLSCert string
	TLSKey  string
	// TLSClientCA is a PEM bundle of the CAs that sign client
	// certificates; set, every client must present one (mTLS) (flag
	// --tls-client-ca, env RETRYD_TLS_CLIENT_CA).
	TLSClientCA string
	// TLSReloadInterval is how often the TLS files are checked for a
	// rotation (flag --tls-reload-interval, env RETRYD_TLS_RELOAD_INTERVAL).
	TLSReloadInterval time.Duration
	// HealthListen is a plaintext gRPC address serving only grpc.health.v1,
	// for probes when the main port is TLS; empty turns it off (flag
	// --health-listen, env RETRYD_HEALTH_LISTEN).
	HealthListen string
	// MaxRecvMsgBytes bounds one received message (flag
	// --max-recv-msg-bytes, env RETRYD_MAX_RECV_MSG_BYTES).
	MaxRecvMsgBytes int
	// MaxConcurrentStreams bounds the concurrent calls of one connection
	// (flag --max-concurrent-streams, env RETRYD_MAX_CONCURRENT_STREAMS).
	MaxConcurrentStreams int
	// KeepaliveMinTime is the shortest interval between a client's pings;
	// a client pinging faster is disconnected (flag --keepalive-min-time,
	// env RETRYD_KEEPALIVE_MIN_TIME).
	KeepaliveMinTime time.Duration
	// MaxConnectionIdle closes a connection without calls for this long; 0:
	// never (flag --max-connection-idle, env RETRYD_MAX_CONNECTION_IDLE).
	MaxConnectionIdle time.Duration
	// MaxConnectionAge asks a connection to go away after this long; 0:
	// never (flag --max-connection-age, env RETRYD_MAX_CONNECTION_AGE).
	MaxConnectionAge time.Duration
	// MaxConnectionAgeGrace is how long the calls of an aged connection may
	// still run before it is closed; 0: unbounded (flag
	// --max-connection-age-grace, env RETRYD_MAX_CONNECTION_AGE_GRACE).
	MaxConnectionAgeGrace time.Duration
	// UnaryTimeout bounds the context of every unary call; streams are not
	// bounded (flag --unary-timeout, env RETRYD_UNARY_TIMEOUT).
	UnaryTimeout time.Duration
	// MemoryLimitRatio sets the Go runtime's soft memory limit to this
	// fraction of the memory limit of retryd's cgroup (its container's),
	// unless GOMEMLIMIT is set; 0 leaves the runtime's limit alone (flag
	// --memory-limit-ratio, env RETRYD_MEMORY_LIMIT_RATIO). See
	// memlimit.go.
	MemoryLimitRatio float64

	// AuthCredentials is the credentials file: tenants, the SHA-256 of
	// their bearer tokens and the client certificate identities that
	// authenticate as them (package auth). Empty disables authentication:
	// every caller is the default tenant (flag --auth-credentials, env
	// RETRYD_AUTH_CREDENTIALS).
	AuthCredentials string
	// AuthReloadInterval is how often the credentials file is checked for
	// a change (flag --auth-reload-interval, env
	// RETRYD_AUTH_RELOAD_INTERVAL).
	AuthReloadInterval time.Duration

	// Admission control (admission.Limits): over one of these bounds a call
	// is refused RESOURCE_EXHAUSTED and records nothing. 0 is unlimited,
	// except for MaxAwaitersPerRetry.
	//
	// MaxPendingRetriesPerTenant bounds one tenant's pending retries (flag
	// --max-pending-retries-per-tenant, env
	// RETRYD_MAX_PENDING_RETRIES_PER_TENANT).
	MaxPendingRetriesPerTenant int
	// MaxPendingRetries bounds every tenant's pending retries together
	// (flag --max-pending-retries, env RETRYD_MAX_PENDING_RETRIES).
	MaxPendingRetries int
	// MaxOpenChainsPerTenant bounds one tenant's open chains (flag
	// --max-open-chains-per-tenant, env RETRYD_MAX_OPEN_CHAINS_PER_TENANT).
	MaxOpenChainsPerTenant int
	// MaxOpenChains bounds every tenant's open chains together (flag
	// --max-open-chains, env RETRYD_MAX_OPEN_CHAINS).
	MaxOpenChains int
	// MaxActiveSessionsPerTenant bounds one tenant's sessions with an open
	// chain or a pending retry (flag --max-active-sessions-per-tenant, env
	// RETRYD_MAX_ACTIVE_SESSIONS_PER_TENANT).
	MaxActiveSessionsPerTenant int
	// MaxAwaitersPerRetry bounds the AwaitRetry streams this replica holds
	// for one retry; at least 1 (flag --max-awaiters-per-retry, env
	// RETRYD_MAX_AWAITERS_PER_RETRY).
	MaxAwaitersPerRetry int
	// MaxAwaiters bounds all AwaitRetry streams this replica holds (flag
	// --max-awaiters, env RETRYD_MAX_AWAITERS).
	MaxAwaiters int
}

// TLSEnabled reports whether the gRPC port speaks TLS.
func (c *Config) TLSEnabled() bool { return c.TLSCert != "" }

// MTLSEnabled reports whether the gRPC port requires client certificates.
func (c *Config) MTLSEnabled() bool { return c.TLSEnabled() && c.TLSClientCA != "" }

// StoreMemory, StoreFilePrefix, StoreRedisPrefix and StoreRedisTLSPrefix
// are the values of Config.Store.
const (
	StoreMemory         = "memory"
	StoreFilePrefix     = "file:"
	StoreRedisPrefix    = "redis://"
	StoreRedisTLSPrefix = "rediss://"
)

// StoreKind returns the kind of the configured store ("memory", "file" or
// "redis") and, for a file store, its directory, for a redis store its URL
// (standalone or Sentinel).
func (c *Config) StoreKind() (kind, dir string) {
	if d, ok := strings.CutPrefix(c.Store, StoreFilePrefix); ok {
		return "file", d
	}
	if strings.HasPrefix(c.Store, StoreRedisPrefix) || strings.HasPrefix(c.Store, StoreRedisTLSPrefix) {
		return "redis", c.Store
	}
	return c.Store, ""
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		Listen:          "127.0.0.1:7700",
		ChainTTL:        time.Hour,
		AbandonGrace:    time.Minute,
		ShutdownTimeout: 10 * time.Second,
		EventLogSize:    100_000,
		LogLevel:        "info",
		LogFormat:       "text",
		Store:           StoreMemory,

		ConfigReloadInterval: 5 * time.Second,

		TLSReloadInterval:     5 * time.Second,
		MaxRecvMsgBytes:       1 << 20,
		MaxConcurrentStreams:  1000,
		KeepaliveMinTime:      10 * time.Second,
		MaxConnectionIdle:     5 * time.Minute,
		MaxConnectionAge:      30 * time.Minute,
		MaxConnectionAgeGrace: 30 * time.Second,
		UnaryTimeout:          10 * time.Second,
		MemoryLimitRatio:      0.9,
		AuthReloadInterval:    5 * time.Second,

		MaxPendingRetriesPerTenant: 20_000,
		MaxPendingRetries:          50_000,
		MaxOpenChainsPerTenant:     40_000,
		MaxOpenChains:              100_000,
		MaxActiveSessionsPerTenant: 20_000,
		MaxAwaitersPerRetry:        8,
		MaxAwaiters:                20_000,
	}
}

// RegisterFlags binds c's fields to flags on fs, taking each default from
// the environment (through getenv) when set. Environment values are parsed
// by the flag's own parser, so a bad value is reported with its variable.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Listen, "listen", c.Listen, "gRPC listen address (env RETRYD_LISTEN)")
	fs.StringVar(&c.ConfigFile, "config", c.ConfigFile, "YAML policy file, reloaded when it changes (env RETRYD_CONFIG)")
	fs.DurationVar(&c.ConfigReloadInterval, "config-reload-interval", c.ConfigReloadInterval, "how often the policy file is checked for a change (env RETRYD_CONFIG_RELOAD_INTERVAL)")
	fs.DurationVar(&c.ChainTTL, "chain-ttl", c.ChainTTL, "how long an idle session's chains are kept (env RETRYD_CHAIN_TTL)")
	fs.DurationVar(&c.AbandonGrace, "abandon-grace", c.AbandonGrace, "how long a due retry waits for an awaiter (env RETRYD_ABANDON_GRACE)")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", c.ShutdownTimeout, "bound on the graceful stop after SIGTERM (env RETRYD_SHUTDOWN_TIMEOUT)")
	fs.IntVar(&c.EventLogSize, "event-log-size", c.EventLogSize, "how many events the log retains (env RETRYD_EVENT_LOG_SIZE)")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error (env RETRYD_LOG_LEVEL)")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "text or json (env RETRYD_LOG_FORMAT)")
	fs.StringVar(&c.MetricsListen, "metrics-listen", c.MetricsListen, "HTTP address of /metrics; empty: off (env RETRYD_METRICS_LISTEN)")
	fs.BoolVar(&c.Pprof, "pprof", c.Pprof, "also serve net/http/pprof under /debug/pprof/ on --metrics-listen (env RETRYD_PPROF)")
	fs.StringVar(&c.Store, "store", c.Store, "memory, file:DIR for state that survives restarts, or redis://host:port/db shared by replicas (redis://sentinel:26379/db?master_name=NAME&addr=… through Redis Sentinel) (env RETRYD_STORE)")
	fs.StringVar(&c.TLSCert, "tls-cert", c.TLSCert, "PEM certificate chain of the gRPC port; with --tls-key turns TLS on (env RETRYD_TLS_CERT)")
	fs.StringVar(&c.TLSKey, "tls-key", c.TLSKey, "PEM private key of --tls-cert (env RETRYD_TLS_KEY)")
	fs.StringVar(&c.TLSClientCA, "tls-client-ca", c.TLSClientCA, "PEM CA bundle; set: require and verify client certificates (mTLS) (env RETRYD_TLS_CLIENT_CA)")
	fs.DurationVar(&c.TLSReloadInterval, "tls-reload-interval", c.TLSReloadInterval, "how often the TLS files are checked for a rotation (env RETRYD_TLS_RELOAD_INTERVAL)")
	fs.StringVar(&c.HealthListen, "health-listen", c.HealthListen, "plaintext gRPC address serving only grpc.health.v1; empty: off (env RETRYD_HEALTH_LISTEN)")
	fs.IntVar(&c.MaxRecvMsgBytes, "max-recv-msg-bytes", c.MaxRecvMsgBytes, "largest message a call may send; larger: RESOURCE_EXHAUSTED (env RETRYD_MAX_RECV_MSG_BYTES)")
	fs.IntVar(&c.MaxConcurrentStreams, "max-concurrent-streams", c.MaxConcurrentStreams, "concurrent calls per connection (env RETRYD_MAX_CONCURRENT_STREAMS)")
	fs.DurationVar(&c.KeepaliveMinTime, "keepalive-min-time", c.KeepaliveMinTime, "shortest interval between client pings; faster clients are disconnected (env RETRYD_KEEPALIVE_MIN_TIME)")
	fs.DurationVar(&c.MaxConnectionIdle, "max-connection-idle", c.MaxConnectionIdle, "close a connection without calls after this; 0: never (env RETRYD_MAX_CONNECTION_IDLE)")
	fs.DurationVar(&c.MaxConnectionAge, "max-connection-age", c.MaxConnectionAge, "ask a connection to go away after this; 0: never (env RETRYD_MAX_CONNECTION_AGE)")
	fs.DurationVar(&c.MaxConnectionAgeGrace, "max-connection-age-grace", c.MaxConnectionAgeGrace, "calls of an aged connection may run this long; 0: unbounded (env RETRYD_MAX_CONNECTION_AGE_GRACE)")
	fs.DurationVar(&c.UnaryTimeout, "unary-timeout", c.UnaryTimeout, "bound on every unary call; streams are not bounded (env RETRYD_UNARY_TIMEOUT)")
	fs.Float64Var(&c.MemoryLimitRatio, "memory-limit-ratio", c.MemoryLimitRatio, "soft memory limit of the Go runtime as a fraction of the container's (cgroup's) memory limit, unless GOMEMLIMIT is set; 0: off (env RETRYD_MEMORY_LIMIT_RATIO)")
	fs.StringVar(&c.AuthCredentials, "auth-credentials", c.AuthCredentials, "credentials file (tenants, token hashes, client certificates); empty: no authentication (env RETRYD_AUTH_CREDENTIALS)")
	fs.DurationVar(&c.AuthReloadInterval, "auth-reload-interval", c.AuthReloadInterval, "how often the credentials file is checked for a change (env RETRYD_AUTH_RELOAD_INTERVAL)")
	fs.IntVar(&c.MaxPendingRetriesPerTenant, "max-pending-retries-per-tenant", c.MaxPendingRetriesPerTenant, "pending retries one tenant may hold; 0: unlimited (env RETRYD_MAX_PENDING_RETRIES_PER_TENANT)")
	fs.IntVar(&c.MaxPendingRetries, "max-pending-retries", c.MaxPendingRetries, "pending retries of all tenants together; 0: unlimited (env RETRYD_MAX_PENDING_RETRIES)")
	fs.IntVar(&c.MaxOpenChainsPerTenant, "max-open-chains-per-tenant", c.MaxOpenChainsPerTenant, "open chains one tenant may hold; 0: unlimited (env RETRYD_MAX_OPEN_CHAINS_PER_TENANT)")
	fs.IntVar(&c.MaxOpenChains, "max-open-chains", c.MaxOpenChains, "open chains of all tenants together; 0: unlimited (env RETRYD_MAX_OPEN_CHAINS)")
	fs.IntVar(&c.MaxActiveSessionsPerTenant, "max-active-sessions-per-tenant", c.MaxActiveSessionsPerTenant, "sessions with an open chain or pending retry one tenant may hold; 0: unlimited (env RETRYD_MAX_ACTIVE_SESSIONS_PER_TENANT)")
	fs.IntVar(&c.MaxAwaitersPerRetry, "max-awaiters-per-retry", c.MaxAwaitersPerRetry, "AwaitRetry streams per retry on this replica; at least 1 (env RETRYD_MAX_AWAITERS_PER_RETRY)")
	fs.IntVar(&c.MaxAwaiters, "max-awaiters", c.MaxAwaiters, "AwaitRetry streams on this replica; 0: unlimited (env RETRYD_MAX_AWAITERS)")
}

// EnvNames maps each flag to its environment variable.
var EnvNames = map[string]string{
	"listen":                 "RETRYD_LISTEN",
	"config":                 "RETRYD_CONFIG",
	"config-reload-interval": "RETRYD_CONFIG_RELOAD_INTERVAL",
	"chain-ttl":              "RETRYD_CHAIN_TTL",
	"abandon-grace":          "RETRYD_ABANDON_GRACE",
	"shutdown-timeout":       "RETRYD_SHUTDOWN_TIMEOUT",
	"event-log-size":         "RETRYD_EVENT_LOG_SIZE",
	"log-level":              "RETRYD_LOG_LEVEL",
	"log-format":             "RETRYD_LOG_FORMAT",
	"metrics-listen":         "RETRYD_METRICS_LISTEN",
	"pprof":                  "RETRYD_PPROF",
	"store":                  "RETRYD_STORE",

	"tls-cert":                 "RETRYD_TLS_CERT",
	"tls-key":                  "RETRYD_TLS_KEY",
	"tls-client-ca":            "RETRYD_TLS_CLIENT_CA",
	"tls-reload-interval":      "RETRYD_TLS_RELOAD_INTERVAL",
	"health-listen":            "RETRYD_HEALTH_LISTEN",
	"max-recv-msg-bytes":       "RETRYD_MAX_RECV_MSG_BYTES",
	"max-concurrent-streams":   "RETRYD_MAX_CONCURRENT_STREAMS",
	"keepalive-min-time":       "RETRYD_KEEPALIVE_MIN_TIME",
	"max-connection-idle":      "RETRYD_MAX_CONNECTION_IDLE",
	"max-connection-age":       "RETRYD_MAX_CONNECTION_AGE",
	"max-connection-age-grace": "RETRYD_MAX_CONNECTION_AGE_GRACE",
	"unary-timeout":            "RETRYD_UNARY_TIMEOUT",
	"memory-limit-ratio":       "RETRYD_MEMORY_LIMIT_RATIO",
	"auth-credentials":         "RETRYD_AUTH_CREDENTIALS",
	"auth-reload-interval":     "RETRYD_AUTH_RELOAD_INTERVAL",

	"max-pending-retries-per-tenant": "RETRYD_MAX_PENDING_RETRIES_PER_TENANT",
	"max-pending-retries":            "RETRYD_MAX_PENDING_RETRIES",
	"max-open-chains-per-tenant":     "RETRYD_MAX_OPEN_CHAINS_PER_TENANT",
	"max-open-chains":                "RETRYD_MAX_OPEN_CHAINS",
	"max-active-sessions-per-tenant": "RETRYD_MAX_ACTIVE_SESSIONS_PER_TENANT",
	"max-awaiters-per-retry":         "RETRYD_MAX_AWAITERS_PER_RETRY",
	"max-awaiters":                   "RETRYD_MAX_AWAITERS",
}

// ApplyEnv sets every flag of fs that has an environment variable present
// in getenv. Call it before fs.Parse so the command line wins.
func ApplyEnv(fs *flag.FlagSet, getenv func(string) string) error {
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		name, ok := EnvNames[f.Name]
		if !ok {
			return
		}
		if v := getenv(name); v != "" {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, &FieldError{Field: name, Value: v, Reason: err.Error()})
			}
		}
	})
	return errors.Join(errs...)
}

// FieldError is an invalid setting, named by its flag or variable.
type FieldError struct {
	Field  string
	Value  string
	Reason string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("invalid %s %q: %s", e.Field, e.Value, e.Reason)
}

// Validate checks every field and reports all problems at once.
func (c *Config) Validate() error {
	var errs []error
	bad := func(field, value, reason string) {
		errs = append(errs, &FieldError{Field: field, Value: value, Reason: reason})
	}
	checkAddr := func(field, addr string) {
		if _, port, err := net.SplitHostPort(addr); err != nil {
			bad(field, addr, "want host:port, e.g. 127.0.0.1:7700 or :7700")
		} else if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
			bad(field, addr, "port must be 0-65535")
		}
	}
	checkAddr("listen", c.Listen)
	if c.ConfigReloadInterval < minConfigReloadInterval {
		bad("config-reload-interval", c.ConfigReloadInterval.String(), "must be at least "+minConfigReloadInterval.String())
	}
	if c.MetricsListen != "" {
		checkAddr("metrics-listen", c.MetricsListen)
	}
	if c.Pprof && c.MetricsListen == "" {
		bad("pprof", "true", "needs --metrics-listen: the profiles are served on the metrics listener")
	}
	if c.ChainTTL < time.Second {
		bad("chain-ttl", c.ChainTTL.String(), "must be at least 1s")
	}
	if c.AbandonGrace <= 0 {
		bad("abandon-grace", c.AbandonGrace.String(), "must be positive")
	}
	if c.ShutdownTimeout <= 0 {
		bad("shutdown-timeout", c.ShutdownTimeout.String(), "must be positive")
	}
	if c.EventLogSize < 1 || c.EventLogSize > 100_000_000 {
		bad("event-log-size", strconv.Itoa(c.EventLogSize), "must be within [1, 100000000]")
	}
	if _, err := c.level(); err != nil {
		bad("log-level", c.LogLevel, "want debug, info, warn or error")
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		bad("log-format", c.LogFormat, "want text or json")
	}
	switch kind, dir := c.StoreKind(); {
	case kind == "file" && dir == "":
		bad("store", c.Store, "file: needs a directory, e.g. file:/var/lib/retryd")
	case kind == "redis" && (dir == StoreRedisPrefix || dir == StoreRedisTLSPrefix):
		bad("store", c.Store, "redis:// needs an address, e.g. redis://127.0.0.1:6379/0")
	case kind == "redis":
		// The URL may carry passwords: the error shows it redacted, and
		// the reason never repeats it.
		if err := redis.CheckURL(dir); err != nil {
			bad("store", redis.RedactURL(c.Store), err.Error())
		}
	case kind != StoreMemory && kind != "file":
		bad("store", c.Store, "want memory, file:DIR, redis://host:port/db, redis://sentinel:26379/db?master_name=NAME or redis://node:6379?addr=node2:6379 (Cluster)")
	}
	c.validateTransport(bad, checkAddr)
	c.validateAuth(bad)
	c.validateAdmission(bad)
	return errors.Join(errs...)
}

func (c *Config) level() (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(strings.ToUpper(c.LogLevel)))
	return l, err
}

// Bounds of the transport settings.
const (
	minRecvMsgBytes      = 1 << 10
	maxRecvMsgBytes      = 64 << 20
	maxConcurrentStreams = 1_000_000
	minTLSReloadInterval = 100 * time.Millisecond
)

// validateTransport checks the TLS, health-port and limit settings. The
// TLS files themselves are read (and refused by name) when the server
// starts.
func (c *Config) validateTransport(bad func(field, value, reason string), checkAddr func(field, addr string)) {
	switch {
	case c.TLSCert != "" && c.TLSKey == "":
		bad("tls-key", c.TLSKey, "required with --tls-cert "+c.TLSCert)
	case c.TLSCert == "" && c.TLSKey != "":
		bad("tls-cert", c.TLSCert, "required with --tls-key "+c.TLSKey)
	}
	if c.TLSClientCA != "" && c.TLSCert == "" {
		bad("tls-client-ca", c.TLSClientCA, "needs --tls-cert and --tls-key: client certificates are only asked for over TLS")
	}
	if c.TLSReloadInterval < minTLSReloadInterval {
		bad("tls-reload-interval", c.TLSReloadInterval.String(), "must be at least "+minTLSReloadInterval.String())
	}
	if c.HealthListen != "" {
		checkAddr("health-listen", c.HealthListen)
	}
	if c.MaxRecvMsgBytes < minRecvMsgBytes || c.MaxRecvMsgBytes > maxRecvMsgBytes {
		bad("max-recv-msg-bytes", strconv.Itoa(c.MaxRecvMsgBytes),
			fmt.Sprintf("must be within [%d, %d]", minRecvMsgBytes, maxRecvMsgBytes))
	}
	if c.MaxConcurrentStreams < 1 || c.MaxConcurrentStreams > maxConcurrentStreams {
		bad("max-concurrent-streams", strconv.Itoa(c.MaxConcurrentStreams),
			fmt.Sprintf("must be within [1, %d]", maxConcurrentStreams))
	}
	if c.KeepaliveMinTime <= 0 {
		bad("keepalive-min-time", c.KeepaliveMinTime.String(), "must be positive")
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{
		{"max-connection-idle", c.MaxConnectionIdle},
		{"max-connection-age", c.MaxConnectionAge},
		{"max-connection-age-grace", c.MaxConnectionAgeGrace},
	} {
		if d.v < 0 {
			bad(d.field, d.v.String(), "must not be negative (0: no limit)")
		}
	}
	if c.UnaryTimeout <= 0 {
		bad("unary-timeout", c.UnaryTimeout.String(), "must be positive")
	}
	if !(c.MemoryLimitRatio >= 0 && c.MemoryLimitRatio <= 1) { // also NaN
		bad("memory-limit-ratio", strconv.FormatFloat(c.MemoryLimitRatio, 'g', -1, 64), "must be within [0, 1] (0: off)")
	}
}

// maxAdmissionLimit is the largest admission bound accepted.
const maxAdmissionLimit = 100_000_000

// validateAdmission checks the admission control bounds: 0 (unlimited) up
// to maxAdmissionLimit; a retry always admits one awaiter.
func (c *Config) validateAdmission(bad func(field, value, reason string)) {
	for _, l := range []struct {
		field string
		v     int
		min   int
	}{
		{"max-pending-retries-per-tenant", c.MaxPendingRetriesPerTenant, 0},
		{"max-pending-retries", c.MaxPendingRetries, 0},
		{"max-open-chains-per-tenant", c.MaxOpenChainsPerTenant, 0},
		{"max-open-chains", c.MaxOpenChains, 0},
		{"max-active-sessions-per-tenant", c.MaxActiveSessionsPerTenant, 0},
		{"max-awaiters-per-retry", c.MaxAwaitersPerRetry, 1},
		{"max-awaiters", c.MaxAwaiters, 0},
	} {
		if l.v < l.min || l.v > maxAdmissionLimit {
			reason := fmt.Sprintf("must be within [%d, %d]", l.min, maxAdmissionLimit)
			if l.min == 0 {
				reason += " (0: unlimited)"
			}
			bad(l.field, strconv.Itoa(l.v), reason)
		}
	}
}

// Limits returns the admission control bounds as the service takes them.
// Counts the event log never ended are forgotten well after the store
// itself forgets their session: twice the chain TTL plus the abandon
// grace.
func (c *Config) Limits() admission.Limits {
	return admission.Limits{
		PendingRetriesPerTenant: c.MaxPendingRetriesPerTenant,
		PendingRetries:          c.MaxPendingRetries,
		OpenChainsPerTenant:     c.MaxOpenChainsPerTenant,
		OpenChains:              c.MaxOpenChains,
		ActiveSessionsPerTenant: c.MaxActiveSessionsPerTenant,
		AwaitersPerRetry:        c.MaxAwaitersPerRetry,
		Awaiters:                c.MaxAwaiters,
		Forget:                  2 * (c.ChainTTL + c.AbandonGrace),
	}
}
