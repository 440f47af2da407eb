package baseimage

import (
	"reflect"
	"regexp"
	"testing"
)

func TestPinned(t *testing.T) {
	for tag, want := range map[string]bool{
		"0.30.1": true, "0.30.1-slim": true, "1.2.3.4": true, "10.20.30-rc.1": true,
		"latest": false, "latest-slim": false, "0.30": false, "v0.30.1": false, "0.30.1slim": false, "0-slim": false,
	} {
		if got := Pinned(tag); got != want {
			t.Errorf("Pinned(%q) = %v, want %v", tag, got, want)
		}
	}
}

func TestSHA(t *testing.T) {
	for tag, want := range map[string]bool{
		"abcdef0": true, "ABCDEF0123": true, "sha-1a2b3c4": true, "SHA-1A2B3C4D": true,
		"abcdef": false, "sha-abc": false, "0.30.1": false, "abcdefg": false, "1a2b3c4-slim": false,
	} {
		if got := SHA(tag); got != want {
			t.Errorf("SHA(%q) = %v, want %v", tag, got, want)
		}
	}
}

func TestPrerelease(t *testing.T) {
	for tag, want := range map[string]bool{
		"0.30.1-rc.1": true, "0.30.1-RC-2": true, "0.30.1-alpha": true, "0.30.1-beta.3-slim": true,
		"0.30.1-pre": true, "0.30.1-preview": true, "0.30.1-next.0": true, "0.30.1-canary": true,
		"0.30.1-dev": true, "0.30.1-Nightly.20250101": true, "0.30.1-snapshot": true,
		"0.30.1": false, "0.30.1-slim": false, "0.30.1-slim-rc": false, "0.30.1-beta1": false,
		"0.30.1.rc1": false, "rc-0.30.1": false, "latest-dev": false,
	} {
		if got := Prerelease(tag); got != want {
			t.Errorf("Prerelease(%q) = %v, want %v", tag, got, want)
		}
	}
}

func TestFilterApply(t *testing.T) {
	tags := []string{"latest", "0.31.0-rc.1", "0.30.2-slim", "sha-abcdef1", "0.30.2", "1a2b3c4d", "0.30.1-slim", "0.30.1", "0.29.0-beta", "0.29.0-slim"}
	all := Filter{Limit: 100}
	contract := Filter{PinnedOnly: true, ExcludeSHA: true, ExcludePrerelease: true, Limit: 20}
	tests := []struct {
		name string
		f    Filter
		want []string
	}{
		{"no filter", all, tags},
		{"contract defaults", contract, []string{"0.30.2-slim", "0.30.2", "0.30.1-slim", "0.30.1", "0.29.0-slim"}},
		{"pinned only", Filter{PinnedOnly: true, Limit: 100}, []string{"0.31.0-rc.1", "0.30.2-slim", "0.30.2", "0.30.1-slim", "0.30.1", "0.29.0-beta", "0.29.0-slim"}},
		{"exclude sha", Filter{ExcludeSHA: true, Limit: 100}, []string{"latest", "0.31.0-rc.1", "0.30.2-slim", "0.30.2", "0.30.1-slim", "0.30.1", "0.29.0-beta", "0.29.0-slim"}},
		{"exclude prerelease", Filter{ExcludePrerelease: true, Limit: 100}, []string{"latest", "0.30.2-slim", "sha-abcdef1", "0.30.2", "1a2b3c4d", "0.30.1-slim", "0.30.1", "0.29.0-slim"}},
		{"include", Filter{Include: regexp.MustCompile(`-slim$`), Limit: 100}, []string{"0.30.2-slim", "0.30.1-slim", "0.29.0-slim"}},
		{"exclude", Filter{Exclude: regexp.MustCompile(`^0\.30\.`), Limit: 100}, []string{"latest", "0.31.0-rc.1", "sha-abcdef1", "1a2b3c4d", "0.29.0-beta", "0.29.0-slim"}},
		{"include and exclude", func() Filter {
			f := contract
			f.Include, f.Exclude = regexp.MustCompile(`slim`), regexp.MustCompile(`^0\.29`)
			return f
		}(), []string{"0.30.2-slim", "0.30.1-slim"}},
		{"limit after filters", func() Filter { f := contract; f.Limit = 2; return f }(), []string{"0.30.2-slim", "0.30.2"}},
		{"limit zero", Filter{}, []string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.f.Apply(tags); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Apply() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestImages(t *testing.T) {
	tests := []struct {
		name, def, repo string
		tags            []string
		want            []string
	}{
		{"default alone", "telorun/node:latest-slim", "telorun/node", nil, []string{"telorun/node:latest-slim"}},
		{"default first", "telorun/node:latest-slim", "telorun/node", []string{"0.30.1", "0.30.1-slim"},
			[]string{"telorun/node:latest-slim", "telorun/node:0.30.1", "telorun/node:0.30.1-slim"}},
		{"default not repeated", "telorun/node:0.30.1", "telorun/node", []string{"0.30.2", "0.30.1"},
			[]string{"telorun/node:0.30.1", "telorun/node:0.30.2"}},
		{"repeats dropped", "x:1", "x", []string{"2", "2"}, []string{"x:1", "x:2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Images(tt.def, tt.repo, tt.tags); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Images() = %q, want %q", got, tt.want)
			}
		})
	}
}
