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
	// Store is where state lives: "memory" (lost on restart) or
	// "file:DIR", durable in DIR on this node (flag --store, env
	// RETRYD_STORE).
	Store string
}

// StoreMemory and StoreFilePrefix are the values of Config.Store.
const (
	StoreMemory     = "memory"
	StoreFilePrefix = "file:"
)

// StoreKind returns the kind of the configured store ("memory" or "file")
// and, for a file store, its directory.
func (c *Config) StoreKind() (kind, dir string) {
	if d, ok := strings.CutPrefix(c.Store, StoreFilePrefix); ok {
		return "file", d
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
	}
}

// RegisterFlags binds c's fields to flags on fs, taking each default from
// the environment (through getenv) when set. Environment values are parsed
// by the flag's own parser, so a bad value is reported with its variable.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Listen, "listen", c.Listen, "gRPC listen address (env RETRYD_LISTEN)")
	fs.StringVar(&c.ConfigFile, "config", c.ConfigFile, "YAML policy file (env RETRYD_CONFIG)")
	fs.DurationVar(&c.ChainTTL, "chain-ttl", c.ChainTTL, "how long an idle session's chains are kept (env RETRYD_CHAIN_TTL)")
	fs.DurationVar(&c.AbandonGrace, "abandon-grace", c.AbandonGrace, "how long a due retry waits for an awaiter (env RETRYD_ABANDON_GRACE)")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", c.ShutdownTimeout, "bound on the graceful stop after SIGTERM (env RETRYD_SHUTDOWN_TIMEOUT)")
	fs.IntVar(&c.EventLogSize, "event-log-size", c.EventLogSize, "how many events the log retains (env RETRYD_EVENT_LOG_SIZE)")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error (env RETRYD_LOG_LEVEL)")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "text or json (env RETRYD_LOG_FORMAT)")
	fs.StringVar(&c.MetricsListen, "metrics-listen", c.MetricsListen, "HTTP address of /metrics; empty: off (env RETRYD_METRICS_LISTEN)")
	fs.StringVar(&c.Store, "store", c.Store, "memory, or file:DIR for state that survives restarts (env RETRYD_STORE)")
}

// EnvNames maps each flag to its environment variable.
var EnvNames = map[string]string{
	"listen":           "RETRYD_LISTEN",
	"config":           "RETRYD_CONFIG",
	"chain-ttl":        "RETRYD_CHAIN_TTL",
	"abandon-grace":    "RETRYD_ABANDON_GRACE",
	"shutdown-timeout": "RETRYD_SHUTDOWN_TIMEOUT",
	"event-log-size":   "RETRYD_EVENT_LOG_SIZE",
	"log-level":        "RETRYD_LOG_LEVEL",
	"log-format":       "RETRYD_LOG_FORMAT",
	"metrics-listen":   "RETRYD_METRICS_LISTEN",
	"store":            "RETRYD_STORE",
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
	if c.MetricsListen != "" {
		checkAddr("metrics-listen", c.MetricsListen)
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
	case kind != StoreMemory && kind != "file":
		bad("store", c.Store, "want memory or file:DIR")
	}
	return errors.Join(errs...)
}

func (c *Config) level() (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(strings.ToUpper(c.LogLevel)))
	return l, err
}
