// Package baseimage is the base-image menu of contract 11.12: the tags of a
// Docker Hub repository, filtered, offered as the config schema's image
// enum and enforced as the create allowlist. A Menu refreshes itself from
// the tag API; the filters are pure functions.
package baseimage

import (
	"regexp"
	"strings"
)

// The contract's tag patterns (11.12).
var (
	pinnedRE     = regexp.MustCompile(`^\d+\.\d+\.\d+(?:[-.].*)?$`)
	shaRE        = regexp.MustCompile(`(?i)^(?:sha-)?[0-9a-f]{7,}$`)
	prereleaseRE = regexp.MustCompile(`^\d+\.\d+\.\d+-(.*)$`)
)

// prereleaseWords are the identifiers that make X.Y.Z-<id>... a prerelease.
var prereleaseWords = map[string]bool{
	"rc": true, "alpha": true, "beta": true, "pre": true, "preview": true, "next": true,
	"canary": true, "dev": true, "nightly": true, "snapshot": true,
}

// Filter says which tags the menu offers and how many.
type Filter struct {
	PinnedOnly        bool           // keep only X.Y.Z[-variant] tags
	ExcludeSHA        bool           // drop commit-hash tags
	ExcludePrerelease bool           // drop prerelease tags
	Include           *regexp.Regexp // keep only matching tags; nil keeps all
	Exclude           *regexp.Regexp // drop matching tags; nil drops none
	Limit             int            // most tags kept; 0 or less keeps none
}

// Pinned reports whether tag is X.Y.Z or X.Y.Z followed by - or . and more.
func Pinned(tag string) bool { return pinnedRE.MatchString(tag) }

// SHA reports whether tag is a commit hash: 7 or more hex digits, optionally
// after "sha-", in any case.
func SHA(tag string) bool { return shaRE.MatchString(tag) }

// Prerelease reports whether tag is X.Y.Z-<id>... whose first identifier
// (split on - or .) is one of rc, alpha, beta, pre, preview, next, canary,
// dev, nightly or snapshot, compared case-insensitively.
func Prerelease(tag string) bool {
	m := prereleaseRE.FindStringSubmatch(tag)
	if m == nil {
		return false
	}
	first, _, _ := strings.Cut(strings.ReplaceAll(m[1], ".", "-"), "-")
	return prereleaseWords[strings.ToLower(first)]
}

// Keep reports whether one tag passes every filter but the limit.
func (f Filter) Keep(tag string) bool {
	switch {
	case f.PinnedOnly && !Pinned(tag),
		f.ExcludeSHA && SHA(tag),
		f.ExcludePrerelease && Prerelease(tag),
		f.Include != nil && !f.Include.MatchString(tag),
		f.Exclude != nil && f.Exclude.MatchString(tag):
		return false
	}
	return true
}

// Apply returns the first Limit tags that Keep accepts, in the given order
// (the tag API's: newest first).
func (f Filter) Apply(tags []string) []string {
	out := []string{}
	for _, t := range tags {
		if len(out) >= f.Limit {
			break
		}
		if f.Keep(t) {
			out = append(out, t)
		}
	}
	return out
}

// Images is the menu: def first, then repo:tag for each tag, without
// repeats.
func Images(def, repo string, tags []string) []string {
	out := []string{def}
	seen := map[string]bool{def: true}
	for _, t := range tags {
		img := repo + ":" + t
		if !seen[img] {
			seen[img] = true
			out = append(out, img)
		}
	}
	return out
}
