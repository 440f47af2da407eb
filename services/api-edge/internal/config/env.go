package config

import (
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/telorunner/telorunner/pkg/envconf"
)

// parser applies section 18's parsing rules (package envconf) and
// collects one error per bad variable. Each method leaves the destination
// at its default when the variable is unset or blank.
type parser struct{ *envconf.Env }

// str returns the trimmed value of name; "" means unset or blank.
func (p *parser) str(name string) string { return p.Str(name) }

func (p *parser) failf(name, format string, args ...any) { p.Failf(name, format, args...) }

func (p *parser) fail(name string, err error) { p.Fail(name, err) }

// port parses a set PORT. Unlike every other variable, an empty value is an
// error rather than the default.
func (p *parser) port(name string) int {
	var n int
	p.Port(name, &n)
	return n
}

func (p *parser) positiveInt(name string, dst *int) { p.Int(name, 1, envconf.NoMax, dst) }

func (p *parser) positiveInt64(name string, dst *int64) { p.Int64(name, 1, envconf.NoMax, dst) }

// duration parses a positive integer count of unit.
func (p *parser) duration(name string, unit time.Duration, dst *time.Duration) {
	p.Duration(name, unit, 1, envconf.NoMax, dst)
}

func (p *parser) boolean(name string, dst *bool) { p.Bool(name, dst) }

func (p *parser) logLevel(name string, dst *slog.Level) {
	if raw := p.str(name); raw != "" {
		switch strings.ToLower(raw) {
		case "debug":
			*dst = slog.LevelDebug
		case "info":
			*dst = slog.LevelInfo
		case "warn":
			*dst = slog.LevelWarn
		case "error":
			*dst = slog.LevelError
		default:
			p.failf(name, "must be debug, info, warn or error, got %q", raw)
		}
	}
}

// levelName is the LOG_LEVEL spelling of l, or "" for a level LOG_LEVEL
// cannot produce.
func levelName(l slog.Level) string {
	switch l {
	case slog.LevelDebug:
		return "debug"
	case slog.LevelInfo:
		return "info"
	case slog.LevelWarn:
		return "warn"
	case slog.LevelError:
		return "error"
	}
	return ""
}

// text sets *dst to the trimmed value unless it is blank.
func (p *parser) text(name string, dst *string) { p.Text(name, dst) }

// url sets *dst to an absolute http or https URL.
func (p *parser) url(name string, dst *string) {
	if raw := p.str(name); raw != "" {
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			p.failf(name, "must be an absolute http or https URL, got %q", raw)
			return
		}
		*dst = raw
	}
}
