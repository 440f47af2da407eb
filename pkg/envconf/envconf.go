// Package envconf is the one environment parser of every service: typed
// readers for integers with bounds, durations counted in a unit, booleans,
// lists and text, each leaving its destination at the default when the
// variable is unset or blank, and one *Error per bad variable, naming it.
//
// Every service keeps its own configuration struct and reads its variables
// into it through an Env:
//
//	e := envconf.New(os.LookupEnv)
//	e.Duration("RUNNER_EXIT_TTL_MS", time.Millisecond, 1, envconf.NoMax, &c.ExitTTL)
//	e.Int("RUNNER_CHECKPOINT_HISTORY", 1, 20, &c.History)
//	if err := e.Err(); err != nil { ... }
package envconf

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// NoMax as an upper bound accepts any value that fits the destination.
const NoMax = math.MaxInt64

// Error is one invalid variable: "NAME: reason[: err]".
type Error struct {
	Var    string // the variable's name
	Reason string // what is wrong, with the value
	Err    error  // the underlying error, when there is one
}

func (e *Error) Error() string {
	switch {
	case e.Err == nil:
		return e.Var + ": " + e.Reason
	case e.Reason == "":
		return e.Var + ": " + e.Err.Error()
	default:
		return e.Var + ": " + e.Reason + ": " + e.Err.Error()
	}
}

func (e *Error) Unwrap() error { return e.Err }

// Env reads variables through a lookup shaped like os.LookupEnv and
// collects the errors.
type Env struct {
	lookup func(string) (string, bool)
	errs   []error
}

// New is an Env over lookup.
func New(lookup func(string) (string, bool)) *Env { return &Env{lookup: lookup} }

// NewGetenv is an Env over a getter shaped like os.Getenv: an empty value
// counts as unset.
func NewGetenv(get func(string) string) *Env {
	return New(func(k string) (string, bool) { v := get(k); return v, v != "" })
}

// Lookup is the raw value of name and whether it is set.
func (e *Env) Lookup(name string) (string, bool) { return e.lookup(name) }

// Str is the trimmed value of name; "" means unset or blank.
func (e *Env) Str(name string) string {
	v, _ := e.lookup(name)
	return strings.TrimSpace(v)
}

// Failf records that name is invalid.
func (e *Env) Failf(name, format string, args ...any) {
	e.errs = append(e.errs, &Error{Var: name, Reason: fmt.Sprintf(format, args...)})
}

// Fail records err (when not nil) against name.
func (e *Env) Fail(name string, err error) {
	if err != nil {
		e.errs = append(e.errs, &Error{Var: name, Err: err})
	}
}

// Errs are the errors recorded so far, one per bad variable.
func (e *Env) Errs() []error { return e.errs }

// Err joins the recorded errors (nil when there are none).
func (e *Env) Err() error { return errors.Join(e.errs...) }

// Text sets *dst to the trimmed value unless it is blank.
func (e *Env) Text(name string, dst *string) {
	if raw := e.Str(name); raw != "" {
		*dst = raw
	}
}

// Required is the trimmed value of name, recording an error when it is
// unset or blank.
func (e *Env) Required(name string) string {
	raw := e.Str(name)
	if raw == "" {
		e.Failf(name, "must be set")
	}
	return raw
}

// Fields sets *dst to the value's whitespace-separated words unless it is
// blank.
func (e *Env) Fields(name string, dst *[]string) {
	if raw := e.Str(name); raw != "" {
		*dst = strings.Fields(raw)
	}
}

// Int sets *dst to an integer in lo..hi (hi NoMax: any int).
func (e *Env) Int(name string, lo, hi int64, dst *int) {
	var n int64
	if e.Int64(name, lo, min(hi, math.MaxInt), &n) {
		*dst = int(n)
	}
}

// Int64 sets *dst to an integer in lo..hi and reports whether it did.
// Decimal digits only, with a minus sign where lo allows one: no plus sign,
// space, underscore, fraction or exponent.
func (e *Env) Int64(name string, lo, hi int64, dst *int64) bool {
	raw := e.Str(name)
	if raw == "" {
		return false
	}
	n, ok := parse(raw)
	if !ok || n < lo || n > hi {
		e.Failf(name, "%s, got %q", rangeText(lo, hi), raw)
		return false
	}
	*dst = n
	return true
}

// Port sets *dst to a TCP port, 1..65535, when name is set, and reports
// whether it did. Unlike the other readers, a set but blank value is an
// error rather than the default.
func (e *Env) Port(name string, dst *int) bool {
	raw, set := e.lookup(name)
	if !set {
		return false
	}
	n, ok := parse(strings.TrimSpace(raw))
	if !ok || n < 1 || n > 65535 {
		e.Failf(name, "must be an integer in 1-65535, got %q", raw)
		return false
	}
	*dst = int(n)
	return true
}

// Duration sets *dst to an integer count of unit in lo..hi (hi NoMax: as
// many as a time.Duration holds).
func (e *Env) Duration(name string, unit time.Duration, lo, hi int64, dst *time.Duration) {
	raw := e.Str(name)
	if raw == "" {
		return
	}
	what := rangeText(lo, hi)
	if most := math.MaxInt64 / int64(unit); hi >= most {
		hi = most
		if lo == 1 {
			what = fmt.Sprintf("must be a positive integer no larger than %d", most)
		}
	}
	n, ok := parse(raw)
	if !ok || n < lo || n > hi {
		e.Failf(name, "%s, got %q", what, raw)
		return
	}
	*dst = time.Duration(n) * unit
}

// Bool sets *dst from true, 1, yes or false, 0, no (any case).
func (e *Env) Bool(name string, dst *bool) {
	raw := e.Str(name)
	if raw == "" {
		return
	}
	switch strings.ToLower(raw) {
	case "true", "1", "yes":
		*dst = true
	case "false", "0", "no":
		*dst = false
	default:
		e.Failf(name, "must be true, 1, yes, false, 0 or no, got %q", raw)
	}
}

// parse reads a decimal integer: digits, with a leading minus at most.
func parse(s string) (int64, bool) {
	if s == "" || s[0] == '+' {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// rangeText says what lo..hi accepts.
func rangeText(lo, hi int64) string {
	if lo == 1 && hi >= math.MaxInt {
		return "must be a positive integer"
	}
	return fmt.Sprintf("must be an integer from %d to %d", lo, hi)
}
