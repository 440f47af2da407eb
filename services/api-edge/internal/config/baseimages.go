package config

import (
	"net/url"
	"regexp"
	"strings"
	"time"
)

// DefaultBaseImageAPIURL is the Docker Hub API the base-image menu lists
// tags from (RUNNER_BASE_IMAGE_API_URL, our addition, changes it).
const DefaultBaseImageAPIURL = "https://hub.docker.com"

// BaseImages is the base-image menu's configuration (contract 11.12,
// RUNNER_BASE_IMAGE_*).
type BaseImages struct {
	Enabled           bool           // RUNNER_BASE_IMAGE_CATALOG_ENABLED
	Repo              string         // RUNNER_BASE_IMAGE_REPO: Docker Hub namespace/repo
	PinnedOnly        bool           // RUNNER_BASE_IMAGE_PINNED_ONLY: keep only X.Y.Z[-variant] tags
	ExcludeSHA        bool           // RUNNER_BASE_IMAGE_EXCLUDE_SHA: drop commit-hash tags
	ExcludePrerelease bool           // RUNNER_BASE_IMAGE_EXCLUDE_PRERELEASE: drop rc, beta, ... tags
	Include           *regexp.Regexp // RUNNER_BASE_IMAGE_INCLUDE: keep only matching tags; nil = all
	Exclude           *regexp.Regexp // RUNNER_BASE_IMAGE_EXCLUDE: drop matching tags; nil = none
	Limit             int            // RUNNER_BASE_IMAGE_LIMIT: most tags advertised
	Refresh           time.Duration  // RUNNER_BASE_IMAGE_REFRESH_SECONDS: refresh cadence
	APIURL            string         // RUNNER_BASE_IMAGE_API_URL (ours): tag API base URL
}

// DefaultBaseImages is the menu configuration with no variable set.
func DefaultBaseImages() BaseImages {
	return BaseImages{
		Enabled:           true,
		Repo:              "telorun/node",
		PinnedOnly:        true,
		ExcludeSHA:        true,
		ExcludePrerelease: true,
		Limit:             20,
		Refresh:           time.Hour,
		APIURL:            DefaultBaseImageAPIURL,
	}
}

// baseImages parses RUNNER_BASE_IMAGE_* into dst.
func (p *parser) baseImages(dst *BaseImages) {
	p.boolean("RUNNER_BASE_IMAGE_CATALOG_ENABLED", &dst.Enabled)
	p.text("RUNNER_BASE_IMAGE_REPO", &dst.Repo)
	p.boolean("RUNNER_BASE_IMAGE_PINNED_ONLY", &dst.PinnedOnly)
	p.boolean("RUNNER_BASE_IMAGE_EXCLUDE_SHA", &dst.ExcludeSHA)
	p.boolean("RUNNER_BASE_IMAGE_EXCLUDE_PRERELEASE", &dst.ExcludePrerelease)
	p.regexp("RUNNER_BASE_IMAGE_INCLUDE", &dst.Include)
	p.regexp("RUNNER_BASE_IMAGE_EXCLUDE", &dst.Exclude)
	p.positiveInt("RUNNER_BASE_IMAGE_LIMIT", &dst.Limit)
	p.duration("RUNNER_BASE_IMAGE_REFRESH_SECONDS", time.Second, &dst.Refresh)
	if raw := p.str("RUNNER_BASE_IMAGE_API_URL"); raw != "" {
		p.url("RUNNER_BASE_IMAGE_API_URL", &dst.APIURL)
		dst.APIURL = strings.TrimRight(dst.APIURL, "/")
	}
}

// regexp compiles a Go (RE2) regular expression; an invalid one is a fatal
// configuration error (contract 18.2).
func (p *parser) regexp(name string, dst **regexp.Regexp) {
	if raw := p.str(name); raw != "" {
		re, err := regexp.Compile(raw)
		if err != nil {
			p.fail(name, err)
			return
		}
		*dst = re
	}
}

// validate checks the menu settings; errors name the variable.
func (b BaseImages) validate(check func(ok bool, name, format string, args ...any)) {
	check(b.Repo != "", "RUNNER_BASE_IMAGE_REPO", "must not be empty")
	check(b.Limit > 0, "RUNNER_BASE_IMAGE_LIMIT", "must be positive, got %d", b.Limit)
	check(b.Refresh > 0, "RUNNER_BASE_IMAGE_REFRESH_SECONDS", "must be positive, got %v", b.Refresh)
	u, err := url.Parse(b.APIURL)
	check(err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "",
		"RUNNER_BASE_IMAGE_API_URL", "must be an absolute http or https URL, got %q", b.APIURL)
}
