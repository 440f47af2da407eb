package config

import (
	"fmt"
	"log/slog"
	"math"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// parser applies section 18's parsing rules and collects one error per bad
// variable. Each method leaves the destination at its default when the
// variable is unset or blank.
type parser struct {
	lookup func(string) (string, bool)
	errs   []error
}

// str returns the trimmed value of name; "" means unset or blank.
func (p *parser) str(name string) string {
	v, _ := p.lookup(name)
	return strings.TrimSpace(v)
}

func (p *parser) failf(name, format string, args ...any) {
	p.errs = append(p.errs, &Error{Var: name, Reason: fmt.Sprintf(format, args...)})
}

func (p *parser) fail(name string, err error) {
	if err != nil {
		p.errs = append(p.errs, &Error{Var: name, Err: err})
	}
}

// port parses a set PORT. Unlike every other variable, an empty value is an
// error rather than the default.
func (p *parser) port(name, raw string) int {
	n, ok := parsePositive(strings.TrimSpace(raw))
	if !ok || n > 65535 {
		p.failf(name, "must be an integer in 1-65535, got %q", raw)
		return 0
	}
	return int(n)
}

func (p *parser) positiveInt(name string, dst *int) {
	if raw := p.str(name); raw != "" {
		n, ok := parsePositive(raw)
		if !ok || n > math.MaxInt {
			p.failf(name, "must be a positive integer, got %q", raw)
			return
		}
		*dst = int(n)
	}
}

func (p *parser) positiveInt64(name string, dst *int64) {
	if raw := p.str(name); raw != "" {
		n, ok := parsePositive(raw)
		if !ok {
			p.failf(name, "must be a positive integer, got %q", raw)
			return
		}
		*dst = int64(n)
	}
}

// duration parses a positive integer count of unit.
func (p *parser) duration(name string, unit time.Duration, dst *time.Duration) {
	if raw := p.str(name); raw != "" {
		n, ok := parsePositive(raw)
		if !ok || n > uint64(math.MaxInt64/unit) {
			p.failf(name, "must be a positive integer no larger than %d, got %q", math.MaxInt64/unit, raw)
			return
		}
		*dst = time.Duration(n) * unit
	}
}

func (p *parser) boolean(name string, dst *bool) {
	if raw := p.str(name); raw != "" {
		switch strings.ToLower(raw) {
		case "true", "1", "yes":
			*dst = true
		case "false", "0", "no":
			*dst = false
		default:
			p.failf(name, "must be true, 1, yes, false, 0 or no, got %q", raw)
		}
	}
}

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
func (p *parser) text(name string, dst *string) {
	if raw := p.str(name); raw != "" {
		*dst = raw
	}
}

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

// parsePositive accepts ASCII decimal digits only (ParseUint in base 10
// allows no sign, space, underscore, fraction or exponent) denoting a value
// in 1..MaxInt64.
func parsePositive(s string) (uint64, bool) {
	n, err := strconv.ParseUint(s, 10, 63)
	if err != nil || n == 0 {
		return 0, false
	}
	return n, true
}
