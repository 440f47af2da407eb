package config

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
)

// LoopbackOrigins are the origins of pages served from this machine, any
// port: the all-in-one's default allowlist (it listens on loopback too).
var LoopbackOrigins = []string{"http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*"}

// CORS is the allowed-origin policy of RUNNER_CORS_ORIGINS (contract 2.4).
// The zero value allows no origin; Load defaults to AnyOrigin.
//
// An entry is an exact origin ("https://editor.telo.run") or an origin
// whose port is "*" ("http://localhost:*"), which matches that scheme and
// host on any port, or on none.
type CORS struct {
	Origins   []string // allowlist, used when AnyOrigin is false
	AnyOrigin bool     // "*": every origin is allowed
}

// LoopbackCORS allows exactly LoopbackOrigins.
func LoopbackCORS() CORS { return CORS{Origins: slices.Clone(LoopbackOrigins)} }

// AllowOrigin returns the Access-Control-Allow-Origin value for a request
// carrying origin: "*" when any origin is allowed, otherwise origin itself
// when it is in the list (the caller must then also send Vary: Origin).
// ok is false when the header must be omitted.
func (c CORS) AllowOrigin(origin string) (allowed string, ok bool) {
	if c.AnyOrigin {
		return "*", true
	}
	if origin == "" {
		return "", false
	}
	for _, o := range c.Origins {
		if o == origin || matchPortWildcard(o, origin) {
			return origin, true
		}
	}
	return "", false
}

// matchPortWildcard reports whether origin matches pattern
// "scheme://host:*": the same scheme and host with any port, or none.
func matchPortWildcard(pattern, origin string) bool {
	prefix, ok := strings.CutSuffix(pattern, ":*")
	if !ok {
		return false
	}
	rest, ok := strings.CutPrefix(origin, prefix)
	if !ok {
		return false
	}
	if rest == "" {
		return true
	}
	port, ok := strings.CutPrefix(rest, ":")
	if !ok || port == "" || len(port) > 5 {
		return false
	}
	for _, r := range port {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// merge returns c with the origins of add appended (duplicates dropped);
// add being AnyOrigin makes the result AnyOrigin.
func (c CORS) merge(add CORS) CORS {
	if c.AnyOrigin || add.AnyOrigin {
		return CORS{AnyOrigin: true}
	}
	out := CORS{Origins: slices.Clone(c.Origins)}
	for _, o := range add.Origins {
		if !slices.Contains(out.Origins, o) {
			out.Origins = append(out.Origins, o)
		}
	}
	return out
}

// parseCORS parses a non-blank RUNNER_CORS_ORIGINS: "*" or a comma-separated
// list, entries trimmed and empties dropped. A list with no entry, or one
// that mixes "*" with origins, is rejected rather than silently matching
// nothing; so is a wildcard entry that is not "scheme://host:*".
func parseCORS(raw string) (CORS, error) {
	var origins []string
	for o := range strings.SplitSeq(raw, ",") {
		if o = strings.TrimSpace(o); o != "" && !slices.Contains(origins, o) {
			origins = append(origins, o)
		}
	}
	switch {
	case len(origins) == 0:
		return CORS{}, errors.New("no origin in the list")
	case slices.Equal(origins, []string{"*"}):
		return CORS{AnyOrigin: true}, nil
	case slices.Contains(origins, "*"):
		return CORS{}, errors.New(`"*" cannot be combined with other origins`)
	}
	for _, o := range origins {
		if !strings.Contains(o, "*") {
			continue
		}
		prefix, ok := strings.CutSuffix(o, ":*")
		u, err := url.Parse(prefix)
		if !ok || strings.Contains(prefix, "*") || err != nil || u.Scheme == "" || u.Host == "" || u.Port() != "" || u.Path != "" || u.User != nil {
			return CORS{}, fmt.Errorf("origin %q: a wildcard is only allowed as the port (scheme://host:*)", o)
		}
	}
	return CORS{Origins: origins}, nil
}
