// Package config loads the api-edge configuration from the environment
// (contract section 18): one typed struct, defaults first, then each variable
// parsed, then the whole validated. A bad value is reported naming the
// variable; main prints it and exits with status 2.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/telorunner/telorunner/pkg/envconf"
	"github.com/telorunner/telorunner/pkg/session"
)

// Version is the runner version this build reports.
const Version = "0.1.0"

// Defaults that other packages may want to show or compare against.
const (
	DefaultPort           = 8062
	DefaultImage          = "telorun/node:latest-slim"
	DefaultDisplayName    = "Telo Runner"
	DefaultDescription    = "Runs the Telo application in a cloud environment"
	DefaultTermsTitle     = "Usage agreement"
	DefaultBodyLimitBytes = 1 << 20
	// DefaultWorkspaceBodyBytes bounds POST /v1/sessions/:id/workspace:
	// room for a 20 MB file written base64 (about 27 MB of JSON) and more.
	DefaultWorkspaceBodyBytes = 64 << 20
)

// Config is everything the edge reads from its environment.
type Config struct {
	Port              int           // PORT, 1-65535
	ListenHost        string        // RUNNER_LISTEN_HOST: address the listener binds (0.0.0.0; the all-in-one: 127.0.0.1)
	LogLevel          slog.Level    // LOG_LEVEL: debug, info, warn or error
	MaxSessions       int           // RUNNER_MAX_SESSIONS: registry ceiling, live + retained
	ExitTTL           time.Duration // RUNNER_EXIT_TTL_MS: retention of terminal sessions
	ReplayBufferBytes int64         // RUNNER_REPLAY_BUFFER_BYTES: per-session event and per-app byte buffer cap
	BodyLimitBytes    int64         // RUNNER_BODY_LIMIT_BYTES: request body limit (our addition)
	// WorkspaceBodyBytes is RUNNER_WORKSPACE_MAX_BODY_BYTES: the body limit
	// of POST /v1/sessions/:id/workspace, which alone carries files
	// (our addition; BodyLimitBytes governs every other route).
	WorkspaceBodyBytes int64
	CORS               CORS    // RUNNER_CORS_ORIGINS
	Terms              *Terms  // RUNNER_TERMS_*; nil when no terms are configured
	Apps               Catalog // RUNNER_APPS; empty when unset
	RegistryURL        string  // TELO_REGISTRY_URL; empty when unset
	Watch              Watch   // RUNNER_WATCH_*, RUNNER_WORKSPACE_CHECKPOINT_SECONDS
	DisplayName        string  // RUNNER_DISPLAY_NAME
	Description        string  // RUNNER_DESCRIPTION
	Image              string  // RUNNER_IMAGE: default kernel image
	// BaseImages is the base-image menu (RUNNER_BASE_IMAGE_*, 11.12): the
	// images config.image may name besides Image.
	BaseImages BaseImages
	Pprof      bool // RUNNER_PPROF: /debug/pprof beside /metrics (off by default)
}

// Watch holds the watch-session settings.
type Watch struct {
	Enabled              bool          // RUNNER_WATCH_SESSIONS
	Idle                 time.Duration // RUNNER_WATCH_IDLE_SECONDS: zero-subscriber window before suspend
	MaxTTL               time.Duration // RUNNER_WATCH_MAX_TTL_SECONDS: watch session deadline
	MaxSessions          int           // RUNNER_WATCH_MAX_SESSIONS: live watch session ceiling
	ReloadLimitPerMinute int           // RUNNER_WATCH_RELOAD_LIMIT: reload budget per session per 60 s
	SuspendedTTL         time.Duration // RUNNER_WATCH_SUSPENDED_TTL_SECONDS: retention of suspended records
	Checkpoint           time.Duration // RUNNER_WORKSPACE_CHECKPOINT_SECONDS: checkpoint cadence
}

// Default returns the configuration used when no variable is set.
func Default() Config {
	life := session.DefaultLifetimes()
	return Config{
		Port:               DefaultPort,
		ListenHost:         "0.0.0.0",
		LogLevel:           slog.LevelInfo,
		MaxSessions:        32,
		ExitTTL:            life.ExitTTL,
		ReplayBufferBytes:  5_000_000,
		BodyLimitBytes:     DefaultBodyLimitBytes,
		WorkspaceBodyBytes: DefaultWorkspaceBodyBytes,
		CORS:               CORS{AnyOrigin: true},
		Watch: Watch{
			Idle:                 life.Idle,
			MaxTTL:               6 * time.Hour,
			MaxSessions:          8,
			ReloadLimitPerMinute: 30,
			SuspendedTTL:         life.SuspendedTTL,
			Checkpoint:           life.Checkpoint,
		},
		DisplayName: DefaultDisplayName,
		Description: DefaultDescription,
		Image:       DefaultImage,
		BaseImages:  DefaultBaseImages(),
	}
}

// Error is a configuration error for one variable (envconf.Error:
// "NAME: reason[: cause]").
type Error = envconf.Error

// Load builds the configuration from lookupEnv, which has the shape of
// os.LookupEnv: PORT needs to tell an unset variable from an empty one.
// It reads RUNNER_TERMS_FILE once when set. Every invalid variable is
// reported; the returned error joins one *Error per variable.
func Load(lookupEnv func(string) (string, bool)) (Config, error) {
	return LoadOver(Default(), lookupEnv)
}

// LoadOver is Load with base instead of Default as the values of unset
// variables (the all-in-one's own defaults). RUNNER_CORS_ORIGINS replaces
// an any-origin base and adds to a listed one: "*" must then be asked for.
func LoadOver(base Config, lookupEnv func(string) (string, bool)) (Config, error) {
	c := base
	p := parser{envconf.New(lookupEnv)}

	if _, ok := lookupEnv("PORT"); ok {
		c.Port = p.port("PORT")
	}
	p.logLevel("LOG_LEVEL", &c.LogLevel)
	p.positiveInt("RUNNER_MAX_SESSIONS", &c.MaxSessions)
	session.ReadLifetimes(p.Env, &c.ExitTTL, &c.Watch.Idle, &c.Watch.SuspendedTTL, &c.Watch.Checkpoint)
	p.positiveInt64("RUNNER_REPLAY_BUFFER_BYTES", &c.ReplayBufferBytes)
	p.positiveInt64("RUNNER_BODY_LIMIT_BYTES", &c.BodyLimitBytes)
	p.positiveInt64("RUNNER_WORKSPACE_MAX_BODY_BYTES", &c.WorkspaceBodyBytes)
	p.boolean("RUNNER_PPROF", &c.Pprof)
	if raw := p.str("RUNNER_CORS_ORIGINS"); raw != "" {
		cors, err := parseCORS(raw)
		p.fail("RUNNER_CORS_ORIGINS", err)
		if base.CORS.AnyOrigin {
			c.CORS = cors
		} else {
			c.CORS = base.CORS.merge(cors)
		}
	}
	if raw := p.str("RUNNER_LISTEN_HOST"); raw != "" {
		if net.ParseIP(strings.Trim(raw, "[]")) == nil && raw != "localhost" {
			p.failf("RUNNER_LISTEN_HOST", "must be an IP address or localhost, got %q", raw)
		}
		c.ListenHost = strings.Trim(raw, "[]")
	}
	c.Terms = p.terms()
	if raw := p.str("RUNNER_APPS"); raw != "" {
		apps, err := parseCatalog(raw)
		p.fail("RUNNER_APPS", err)
		c.Apps = apps
	}
	p.url("TELO_REGISTRY_URL", &c.RegistryURL)
	p.boolean("RUNNER_WATCH_SESSIONS", &c.Watch.Enabled)
	p.duration("RUNNER_WATCH_MAX_TTL_SECONDS", time.Second, &c.Watch.MaxTTL)
	p.positiveInt("RUNNER_WATCH_MAX_SESSIONS", &c.Watch.MaxSessions)
	p.positiveInt("RUNNER_WATCH_RELOAD_LIMIT", &c.Watch.ReloadLimitPerMinute)
	p.text("RUNNER_DISPLAY_NAME", &c.DisplayName)
	p.text("RUNNER_DESCRIPTION", &c.Description)
	p.text("RUNNER_IMAGE", &c.Image)
	p.baseImages(&c.BaseImages)

	if err := p.Err(); err != nil {
		return Config{}, err
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// Validate checks the invariants Load guarantees, for configurations built
// by hand (tests, embedding). Errors name the variable the field comes from.
func (c Config) Validate() error {
	var errs []error
	check := func(ok bool, name, format string, args ...any) {
		if !ok {
			errs = append(errs, &Error{Var: name, Reason: fmt.Sprintf(format, args...)})
		}
	}
	check(c.Port >= 1 && c.Port <= 65535, "PORT", "must be in 1-65535, got %d", c.Port)
	check(c.ListenHost != "", "RUNNER_LISTEN_HOST", "must not be empty")
	check(levelName(c.LogLevel) != "", "LOG_LEVEL", "must be debug, info, warn or error, got %v", c.LogLevel)
	check(c.MaxSessions > 0, "RUNNER_MAX_SESSIONS", "must be positive, got %d", c.MaxSessions)
	check(c.ExitTTL > 0, "RUNNER_EXIT_TTL_MS", "must be positive, got %v", c.ExitTTL)
	check(c.ReplayBufferBytes > 0, "RUNNER_REPLAY_BUFFER_BYTES", "must be positive, got %d", c.ReplayBufferBytes)
	check(c.BodyLimitBytes > 0, "RUNNER_BODY_LIMIT_BYTES", "must be positive, got %d", c.BodyLimitBytes)
	check(c.WorkspaceBodyBytes > 0, "RUNNER_WORKSPACE_MAX_BODY_BYTES", "must be positive, got %d", c.WorkspaceBodyBytes)
	check(c.CORS.AnyOrigin || len(c.CORS.Origins) > 0, "RUNNER_CORS_ORIGINS", "no origin allowed")
	if c.Terms != nil {
		check(c.Terms.Version != "", "RUNNER_TERMS_VERSION", "must not be empty")
		check(c.Terms.Title != "", "RUNNER_TERMS_TITLE", "must not be empty")
	}
	check(c.Watch.Idle > 0, "RUNNER_WATCH_IDLE_SECONDS", "must be positive, got %v", c.Watch.Idle)
	check(c.Watch.MaxTTL > 0, "RUNNER_WATCH_MAX_TTL_SECONDS", "must be positive, got %v", c.Watch.MaxTTL)
	check(c.Watch.MaxSessions > 0, "RUNNER_WATCH_MAX_SESSIONS", "must be positive, got %d", c.Watch.MaxSessions)
	check(c.Watch.ReloadLimitPerMinute > 0, "RUNNER_WATCH_RELOAD_LIMIT", "must be positive, got %d", c.Watch.ReloadLimitPerMinute)
	check(c.Watch.SuspendedTTL > 0, "RUNNER_WATCH_SUSPENDED_TTL_SECONDS", "must be positive, got %v", c.Watch.SuspendedTTL)
	check(c.Watch.Checkpoint > 0, "RUNNER_WORKSPACE_CHECKPOINT_SECONDS", "must be positive, got %v", c.Watch.Checkpoint)
	check(c.DisplayName != "", "RUNNER_DISPLAY_NAME", "must not be empty")
	check(c.Description != "", "RUNNER_DESCRIPTION", "must not be empty")
	check(c.Image != "", "RUNNER_IMAGE", "must not be empty")
	c.BaseImages.validate(check)
	return errors.Join(errs...)
}
