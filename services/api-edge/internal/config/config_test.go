package config

import (
	"errors"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"
)

// env returns an os.LookupEnv-shaped function over vars.
func env(vars map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	}
}

func TestLoadDefaults(t *testing.T) {
	got, err := Load(env(nil))
	if err != nil {
		t.Fatalf("Load(empty) error = %v", err)
	}
	// Spelled out from contract section 18 rather than taken from Default().
	want := Config{
		Port:               8062,
		ListenHost:         "0.0.0.0",
		LogLevel:           slog.LevelInfo,
		MaxSessions:        32,
		ExitTTL:            14_400_000 * time.Millisecond,
		ReplayBufferBytes:  5_000_000,
		BodyLimitBytes:     1_048_576,
		WorkspaceBodyBytes: 67_108_864,
		CORS:               CORS{AnyOrigin: true},
		Watch: Watch{
			Enabled:              false,
			Idle:                 300 * time.Second,
			MaxTTL:               21_600 * time.Second,
			MaxSessions:          8,
			ReloadLimitPerMinute: 30,
			SuspendedTTL:         86_400 * time.Second,
			Checkpoint:           30 * time.Second,
		},
		DisplayName: "Telo Runner",
		Description: "Runs the Telo application in a cloud environment",
		Image:       "telorun/node:latest-slim",
		BaseImages: BaseImages{
			Enabled: true, Repo: "telorun/node", PinnedOnly: true, ExcludeSHA: true, ExcludePrerelease: true,
			Limit: 20, Refresh: 3600 * time.Second, APIURL: "https://hub.docker.com",
		},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Load(empty) = %+v, want %+v", got, want)
	}
	if !reflect.DeepEqual(Default(), want) {
		t.Errorf("Default() = %+v, want %+v", Default(), want)
	}
}

func TestLoad(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want func(*Config) // applied to Default()
	}{
		{"port", map[string]string{"PORT": "8080"}, func(c *Config) { c.Port = 8080 }},
		{"port trimmed", map[string]string{"PORT": " 9000 "}, func(c *Config) { c.Port = 9000 }},
		{"port max", map[string]string{"PORT": "65535"}, func(c *Config) { c.Port = 65535 }},
		{"port leading zero", map[string]string{"PORT": "08062"}, func(c *Config) {}},
		{"log level debug", map[string]string{"LOG_LEVEL": "debug"}, func(c *Config) { c.LogLevel = slog.LevelDebug }},
		{"log level case and space", map[string]string{"LOG_LEVEL": " WARN "}, func(c *Config) { c.LogLevel = slog.LevelWarn }},
		{"log level error", map[string]string{"LOG_LEVEL": "Error"}, func(c *Config) { c.LogLevel = slog.LevelError }},
		{"log level empty is default", map[string]string{"LOG_LEVEL": ""}, func(c *Config) {}},
		{"max sessions", map[string]string{"RUNNER_MAX_SESSIONS": "1"}, func(c *Config) { c.MaxSessions = 1 }},
		{"max sessions empty is default", map[string]string{"RUNNER_MAX_SESSIONS": ""}, func(c *Config) {}},
		{"max sessions blank is default", map[string]string{"RUNNER_MAX_SESSIONS": "  "}, func(c *Config) {}},
		{"exit ttl ms", map[string]string{"RUNNER_EXIT_TTL_MS": "1500"}, func(c *Config) { c.ExitTTL = 1500 * time.Millisecond }},
		{"replay buffer", map[string]string{"RUNNER_REPLAY_BUFFER_BYTES": "1024"}, func(c *Config) { c.ReplayBufferBytes = 1024 }},
		{"body limit", map[string]string{"RUNNER_BODY_LIMIT_BYTES": "2097152"}, func(c *Config) { c.BodyLimitBytes = 2 << 20 }},
		{"workspace body limit", map[string]string{"RUNNER_WORKSPACE_MAX_BODY_BYTES": "1000"}, func(c *Config) { c.WorkspaceBodyBytes = 1000 }},
		{"cors star", map[string]string{"RUNNER_CORS_ORIGINS": "*"}, func(c *Config) {}},
		{"cors empty", map[string]string{"RUNNER_CORS_ORIGINS": ""}, func(c *Config) {}},
		{"cors list", map[string]string{"RUNNER_CORS_ORIGINS": " https://a.example ,, https://b.example,"}, func(c *Config) {
			c.CORS = CORS{Origins: []string{"https://a.example", "https://b.example"}}
		}},
		{"registry url", map[string]string{"TELO_REGISTRY_URL": " https://registry.telo.run "}, func(c *Config) { c.RegistryURL = "https://registry.telo.run" }},
		{"watch true", map[string]string{"RUNNER_WATCH_SESSIONS": "true"}, func(c *Config) { c.Watch.Enabled = true }},
		{"watch 1", map[string]string{"RUNNER_WATCH_SESSIONS": "1"}, func(c *Config) { c.Watch.Enabled = true }},
		{"watch YES trimmed", map[string]string{"RUNNER_WATCH_SESSIONS": " YES "}, func(c *Config) { c.Watch.Enabled = true }},
		{"watch False", map[string]string{"RUNNER_WATCH_SESSIONS": "False"}, func(c *Config) {}},
		{"watch 0", map[string]string{"RUNNER_WATCH_SESSIONS": "0"}, func(c *Config) {}},
		{"watch no", map[string]string{"RUNNER_WATCH_SESSIONS": "no"}, func(c *Config) {}},
		{"pprof true", map[string]string{"RUNNER_PPROF": "true"}, func(c *Config) { c.Pprof = true }},
		{"pprof false", map[string]string{"RUNNER_PPROF": "false"}, func(c *Config) {}},
		{"watch settings", map[string]string{
			"RUNNER_WATCH_IDLE_SECONDS":           "60",
			"RUNNER_WATCH_MAX_TTL_SECONDS":        "7200",
			"RUNNER_WATCH_MAX_SESSIONS":           "2",
			"RUNNER_WATCH_RELOAD_LIMIT":           "5",
			"RUNNER_WATCH_SUSPENDED_TTL_SECONDS":  "3600",
			"RUNNER_WORKSPACE_CHECKPOINT_SECONDS": "10",
		}, func(c *Config) {
			c.Watch = Watch{
				Idle:                 time.Minute,
				MaxTTL:               2 * time.Hour,
				MaxSessions:          2,
				ReloadLimitPerMinute: 5,
				SuspendedTTL:         time.Hour,
				Checkpoint:           10 * time.Second,
			}
		}},
		{"largest seconds", map[string]string{"RUNNER_WATCH_IDLE_SECONDS": "9223372036"}, func(c *Config) {
			c.Watch.Idle = 9223372036 * time.Second
		}},
		{"display strings trimmed", map[string]string{
			"RUNNER_DISPLAY_NAME": "  Acme runner ",
			"RUNNER_DESCRIPTION":  "\tRuns things\n",
			"RUNNER_IMAGE":        " telorun/node:0.30.1-slim ",
		}, func(c *Config) {
			c.DisplayName = "Acme runner"
			c.Description = "Runs things"
			c.Image = "telorun/node:0.30.1-slim"
		}},
		{"blank strings are default", map[string]string{
			"RUNNER_DISPLAY_NAME": " ", "RUNNER_DESCRIPTION": "", "RUNNER_IMAGE": "\t", "TELO_REGISTRY_URL": " ",
		}, func(c *Config) {}},
		{"terms body", map[string]string{"RUNNER_TERMS_BODY": "Be nice."}, func(c *Config) {
			c.Terms = &Terms{Version: termsVersion("Be nice."), Title: "Usage agreement", Body: "Be nice."}
		}},
		{"apps", map[string]string{"RUNNER_APPS": `{"a":{"image":"x"}}`}, func(c *Config) {
			c.Apps = Catalog{apps: []App{{Name: "a", Image: "x", Env: map[string]string{}, PullPolicy: "missing"}}}
		}},
		{"apps blank", map[string]string{"RUNNER_APPS": "  "}, func(c *Config) {}},
		{"base images", map[string]string{
			"RUNNER_BASE_IMAGE_CATALOG_ENABLED": "no", "RUNNER_BASE_IMAGE_REPO": "acme/kernel",
			"RUNNER_BASE_IMAGE_PINNED_ONLY": "false", "RUNNER_BASE_IMAGE_EXCLUDE_SHA": "0",
			"RUNNER_BASE_IMAGE_EXCLUDE_PRERELEASE": "NO", "RUNNER_BASE_IMAGE_LIMIT": "5",
			"RUNNER_BASE_IMAGE_REFRESH_SECONDS": "60", "RUNNER_BASE_IMAGE_API_URL": "http://127.0.0.1:9/",
		}, func(c *Config) {
			c.BaseImages = BaseImages{Repo: "acme/kernel", Limit: 5, Refresh: time.Minute, APIURL: "http://127.0.0.1:9"}
		}},
		{"base images blank are default", map[string]string{
			"RUNNER_BASE_IMAGE_REPO": " ", "RUNNER_BASE_IMAGE_INCLUDE": "", "RUNNER_BASE_IMAGE_EXCLUDE": " ", "RUNNER_BASE_IMAGE_LIMIT": "",
		}, func(c *Config) {}},
		{"unrelated variables ignored", map[string]string{"HOME": "/root", "RUNNER_VERSION": "junk"}, func(c *Config) {}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Load(env(tt.env))
			if err != nil {
				t.Fatalf("Load(%v) error = %v", tt.env, err)
			}
			want := Default()
			tt.want(&want)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("Load(%v) = %+v, want %+v", tt.env, got, want)
			}
		})
	}
}

func TestLoadErrors(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		wantVar string
		wantMsg string // substring of the error text
	}{
		{"port empty is not default", map[string]string{"PORT": ""}, "PORT", `PORT: must be an integer in 1-65535, got ""`},
		{"port blank", map[string]string{"PORT": "  "}, "PORT", `got "  "`},
		{"port zero", map[string]string{"PORT": "0"}, "PORT", `got "0"`},
		{"port too large", map[string]string{"PORT": "65536"}, "PORT", `got "65536"`},
		{"port negative", map[string]string{"PORT": "-1"}, "PORT", `got "-1"`},
		{"port word", map[string]string{"PORT": "http"}, "PORT", `got "http"`},
		{"port fraction", map[string]string{"PORT": "80.5"}, "PORT", `got "80.5"`},
		{"log level unknown", map[string]string{"LOG_LEVEL": "trace"}, "LOG_LEVEL", `must be debug, info, warn or error, got "trace"`},
		{"log level warning", map[string]string{"LOG_LEVEL": "warning"}, "LOG_LEVEL", `got "warning"`},
		{"max sessions word", map[string]string{"RUNNER_MAX_SESSIONS": "x"}, "RUNNER_MAX_SESSIONS", `RUNNER_MAX_SESSIONS: must be a positive integer, got "x"`},
		{"max sessions zero", map[string]string{"RUNNER_MAX_SESSIONS": "0"}, "RUNNER_MAX_SESSIONS", `got "0"`},
		{"max sessions negative", map[string]string{"RUNNER_MAX_SESSIONS": "-3"}, "RUNNER_MAX_SESSIONS", `got "-3"`},
		{"max sessions plus sign", map[string]string{"RUNNER_MAX_SESSIONS": "+3"}, "RUNNER_MAX_SESSIONS", `got "+3"`},
		{"max sessions float", map[string]string{"RUNNER_MAX_SESSIONS": "3.0"}, "RUNNER_MAX_SESSIONS", `got "3.0"`},
		{"max sessions exponent", map[string]string{"RUNNER_MAX_SESSIONS": "1e3"}, "RUNNER_MAX_SESSIONS", `got "1e3"`},
		{"max sessions hex", map[string]string{"RUNNER_MAX_SESSIONS": "0x10"}, "RUNNER_MAX_SESSIONS", `got "0x10"`},
		{"max sessions inner space", map[string]string{"RUNNER_MAX_SESSIONS": "1 0"}, "RUNNER_MAX_SESSIONS", `got "1 0"`},
		{"max sessions overflow", map[string]string{"RUNNER_MAX_SESSIONS": "99999999999999999999"}, "RUNNER_MAX_SESSIONS", `must be a positive integer`},
		{"exit ttl zero", map[string]string{"RUNNER_EXIT_TTL_MS": "0"}, "RUNNER_EXIT_TTL_MS", `got "0"`},
		{"replay buffer word", map[string]string{"RUNNER_REPLAY_BUFFER_BYTES": "5MB"}, "RUNNER_REPLAY_BUFFER_BYTES", `got "5MB"`},
		{"body limit zero", map[string]string{"RUNNER_BODY_LIMIT_BYTES": "0"}, "RUNNER_BODY_LIMIT_BYTES", `got "0"`},
		{"seconds overflow duration", map[string]string{"RUNNER_WATCH_IDLE_SECONDS": "9223372037"}, "RUNNER_WATCH_IDLE_SECONDS", `got "9223372037"`},
		{"max ttl word", map[string]string{"RUNNER_WATCH_MAX_TTL_SECONDS": "6h"}, "RUNNER_WATCH_MAX_TTL_SECONDS", `got "6h"`},
		{"watch max sessions zero", map[string]string{"RUNNER_WATCH_MAX_SESSIONS": "0"}, "RUNNER_WATCH_MAX_SESSIONS", `got "0"`},
		{"reload limit negative", map[string]string{"RUNNER_WATCH_RELOAD_LIMIT": "-1"}, "RUNNER_WATCH_RELOAD_LIMIT", `got "-1"`},
		{"suspended ttl zero", map[string]string{"RUNNER_WATCH_SUSPENDED_TTL_SECONDS": "0"}, "RUNNER_WATCH_SUSPENDED_TTL_SECONDS", `got "0"`},
		{"checkpoint word", map[string]string{"RUNNER_WORKSPACE_CHECKPOINT_SECONDS": "often"}, "RUNNER_WORKSPACE_CHECKPOINT_SECONDS", `got "often"`},
		{"watch bool on", map[string]string{"RUNNER_WATCH_SESSIONS": "on"}, "RUNNER_WATCH_SESSIONS", `must be true, 1, yes, false, 0 or no, got "on"`},
		{"watch bool y", map[string]string{"RUNNER_WATCH_SESSIONS": "y"}, "RUNNER_WATCH_SESSIONS", `got "y"`},
		{"pprof on", map[string]string{"RUNNER_PPROF": "on"}, "RUNNER_PPROF", `must be true, 1, yes, false, 0 or no, got "on"`},
		{"registry not a url", map[string]string{"TELO_REGISTRY_URL": "registry.telo.run"}, "TELO_REGISTRY_URL", `got "registry.telo.run"`},
		{"registry bad scheme", map[string]string{"TELO_REGISTRY_URL": "ftp://registry.telo.run"}, "TELO_REGISTRY_URL", `must be an absolute http or https URL`},
		{"cors only commas", map[string]string{"RUNNER_CORS_ORIGINS": " , ,"}, "RUNNER_CORS_ORIGINS", "no origin"},
		{"cors star mixed", map[string]string{"RUNNER_CORS_ORIGINS": "https://a.example,*"}, "RUNNER_CORS_ORIGINS", `"*" cannot be combined`},
		{"cors wildcard host", map[string]string{"RUNNER_CORS_ORIGINS": "https://*.example"}, "RUNNER_CORS_ORIGINS", "only allowed as the port"},
		{"listen host not an address", map[string]string{"RUNNER_LISTEN_HOST": "example.com"}, "RUNNER_LISTEN_HOST", `got "example.com"`},
		{"apps invalid", map[string]string{"RUNNER_APPS": "{"}, "RUNNER_APPS", "RUNNER_APPS: invalid JSON"},
		{"base image include invalid", map[string]string{"RUNNER_BASE_IMAGE_INCLUDE": "(slim"}, "RUNNER_BASE_IMAGE_INCLUDE", "missing closing )"},
		{"base image exclude invalid", map[string]string{"RUNNER_BASE_IMAGE_EXCLUDE": "[a-"}, "RUNNER_BASE_IMAGE_EXCLUDE", "RUNNER_BASE_IMAGE_EXCLUDE: error parsing regexp"},
		{"base image limit zero", map[string]string{"RUNNER_BASE_IMAGE_LIMIT": "0"}, "RUNNER_BASE_IMAGE_LIMIT", `got "0"`},
		{"base image refresh word", map[string]string{"RUNNER_BASE_IMAGE_REFRESH_SECONDS": "1h"}, "RUNNER_BASE_IMAGE_REFRESH_SECONDS", `got "1h"`},
		{"base image catalog bool", map[string]string{"RUNNER_BASE_IMAGE_CATALOG_ENABLED": "on"}, "RUNNER_BASE_IMAGE_CATALOG_ENABLED", `got "on"`},
		{"base image api not a url", map[string]string{"RUNNER_BASE_IMAGE_API_URL": "hub.docker.com"}, "RUNNER_BASE_IMAGE_API_URL", `got "hub.docker.com"`},
		{"terms file missing", map[string]string{"RUNNER_TERMS_FILE": "/nonexistent/terms.md"}, "RUNNER_TERMS_FILE", "/nonexistent/terms.md"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Load(env(tt.env))
			if err == nil {
				t.Fatalf("Load(%v) = %+v, want error", tt.env, got)
			}
			var ce *Error
			if !errors.As(err, &ce) || ce.Var != tt.wantVar {
				t.Errorf("Load(%v) error = %v, want *Error for %s", tt.env, err, tt.wantVar)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("Load(%v) error = %q, want it to contain %q", tt.env, err, tt.wantMsg)
			}
			if !reflect.DeepEqual(got, Config{}) {
				t.Errorf("Load(%v) config = %+v on error, want zero", tt.env, got)
			}
		})
	}
}

func TestLoadReportsEveryBadVariable(t *testing.T) {
	_, err := Load(env(map[string]string{
		"PORT":                  "",
		"RUNNER_MAX_SESSIONS":   "x",
		"RUNNER_WATCH_SESSIONS": "maybe",
		"RUNNER_APPS":           "[]",
	}))
	if err == nil {
		t.Fatal("Load() error = nil, want errors")
	}
	got := err.Error()
	for _, want := range []string{"PORT:", "RUNNER_MAX_SESSIONS:", "RUNNER_WATCH_SESSIONS:", "RUNNER_APPS:"} {
		if !strings.Contains(got, want) {
			t.Errorf("Load() error = %q, want it to name %s", got, want)
		}
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantVar string // "" means valid
	}{
		{"default", func(c *Config) {}, ""},
		{"port zero", func(c *Config) { c.Port = 0 }, "PORT"},
		{"port high", func(c *Config) { c.Port = 70000 }, "PORT"},
		{"odd log level", func(c *Config) { c.LogLevel = slog.Level(2) }, "LOG_LEVEL"},
		{"max sessions", func(c *Config) { c.MaxSessions = 0 }, "RUNNER_MAX_SESSIONS"},
		{"exit ttl", func(c *Config) { c.ExitTTL = -time.Second }, "RUNNER_EXIT_TTL_MS"},
		{"replay", func(c *Config) { c.ReplayBufferBytes = 0 }, "RUNNER_REPLAY_BUFFER_BYTES"},
		{"body limit", func(c *Config) { c.BodyLimitBytes = 0 }, "RUNNER_BODY_LIMIT_BYTES"},
		{"workspace body limit", func(c *Config) { c.WorkspaceBodyBytes = -1 }, "RUNNER_WORKSPACE_MAX_BODY_BYTES"},
		{"cors allows nothing", func(c *Config) { c.CORS = CORS{} }, "RUNNER_CORS_ORIGINS"},
		{"terms without version", func(c *Config) { c.Terms = &Terms{Title: "t", Body: "b"} }, "RUNNER_TERMS_VERSION"},
		{"terms without title", func(c *Config) { c.Terms = &Terms{Version: "v", Body: "b"} }, "RUNNER_TERMS_TITLE"},
		{"watch idle", func(c *Config) { c.Watch.Idle = 0 }, "RUNNER_WATCH_IDLE_SECONDS"},
		{"watch max ttl", func(c *Config) { c.Watch.MaxTTL = 0 }, "RUNNER_WATCH_MAX_TTL_SECONDS"},
		{"watch max sessions", func(c *Config) { c.Watch.MaxSessions = 0 }, "RUNNER_WATCH_MAX_SESSIONS"},
		{"watch reload", func(c *Config) { c.Watch.ReloadLimitPerMinute = 0 }, "RUNNER_WATCH_RELOAD_LIMIT"},
		{"watch suspended", func(c *Config) { c.Watch.SuspendedTTL = 0 }, "RUNNER_WATCH_SUSPENDED_TTL_SECONDS"},
		{"watch checkpoint", func(c *Config) { c.Watch.Checkpoint = 0 }, "RUNNER_WORKSPACE_CHECKPOINT_SECONDS"},
		{"display name", func(c *Config) { c.DisplayName = "" }, "RUNNER_DISPLAY_NAME"},
		{"description", func(c *Config) { c.Description = "" }, "RUNNER_DESCRIPTION"},
		{"image", func(c *Config) { c.Image = "" }, "RUNNER_IMAGE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			tt.mutate(&c)
			err := c.Validate()
			if tt.wantVar == "" {
				if err != nil {
					t.Errorf("Validate() = %v, want nil", err)
				}
				return
			}
			var ce *Error
			if !errors.As(err, &ce) || ce.Var != tt.wantVar {
				t.Errorf("Validate() = %v, want *Error for %s", err, tt.wantVar)
			}
		})
	}
}

func TestErrorText(t *testing.T) {
	cause := errors.New("boom")
	tests := []struct {
		name string
		err  *Error
		want string
	}{
		{"reason", &Error{Var: "PORT", Reason: "bad"}, "PORT: bad"},
		{"cause", &Error{Var: "RUNNER_APPS", Err: cause}, "RUNNER_APPS: boom"},
		{"both", &Error{Var: "RUNNER_TERMS_FILE", Reason: "read", Err: cause}, "RUNNER_TERMS_FILE: read: boom"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.err.Error(); got != tt.want {
				t.Errorf("Error() = %q, want %q", got, tt.want)
			}
			if tt.err.Err != nil && !errors.Is(tt.err, cause) {
				t.Errorf("errors.Is(%v, cause) = false, want true", tt.err)
			}
		})
	}
}

func TestLoadBaseImageRegexps(t *testing.T) {
	got, err := Load(env(map[string]string{"RUNNER_BASE_IMAGE_INCLUDE": ` -slim$ `, "RUNNER_BASE_IMAGE_EXCLUDE": `^0\.`}))
	if err != nil {
		t.Fatalf("Load() error = %v", err)
	}
	if got.BaseImages.Include == nil || got.BaseImages.Include.String() != "-slim$" {
		t.Errorf("Include = %v, want -slim$ (trimmed)", got.BaseImages.Include)
	}
	if got.BaseImages.Exclude == nil || got.BaseImages.Exclude.String() != `^0\.` {
		t.Errorf("Exclude = %v, want ^0\\.", got.BaseImages.Exclude)
	}
}
