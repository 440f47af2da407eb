package config

import (
	"errors"
	"slices"
	"strings"
)

// CORS is the allowed-origin policy of RUNNER_CORS_ORIGINS (contract 2.4).
// The zero value allows no origin; Load defaults to AnyOrigin.
type CORS struct {
	Origins   []string // exact-match allowlist, used when AnyOrigin is false
	AnyOrigin bool     // "*": every origin is allowed
}

// AllowOrigin returns the Access-Control-Allow-Origin value for a request
// carrying origin: "*" when any origin is allowed, otherwise origin itself
// when it is in the list (the caller must then also send Vary: Origin).
// ok is false when the header must be omitted.
func (c CORS) AllowOrigin(origin string) (allowed string, ok bool) {
	if c.AnyOrigin {
		return "*", true
	}
	if origin != "" && slices.Contains(c.Origins, origin) {
		return origin, true
	}
	return "", false
}

// parseCORS parses a non-blank RUNNER_CORS_ORIGINS: "*" or a comma-separated
// list, entries trimmed and empties dropped. A list with no entry, or one
// that mixes "*" with origins, is rejected rather than silently matching
// nothing.
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
	return CORS{Origins: origins}, nil
}
