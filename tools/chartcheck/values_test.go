//go:build linux

package chartcheck

import (
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	sigsyaml "sigs.k8s.io/yaml"
)

// keptInFull are the values testdata/values-full.yaml leaves at their
// default, each because changing it removes what the checks look at; the
// "external-nats" install sets them instead.
var keptInFull = []string{
	"nats.url",                     // external NATS: no NATS objects to check
	"createSessionNamespace",       // the Namespace object
	"sessionNetworkPolicy.enabled", // the session policy
	"natsNetworkPolicy.enabled",    // the NATS policy
	"sessionQuota.enabled",         // the quota
	"build.createNamespace",        // the build Namespace object
	"build.networkPolicy.enabled",  // the build policy
	"nats.pdb.enabled", "apiEdge.pdb.enabled", "podDriver.pdb.enabled", "supervisor.pdb.enabled", "workspaceProxy.pdb.enabled",
	"apps.existingSecret",  // the chart creates the catalog Secret from apps.catalog
	"terms.existingSecret", // and the terms Secret from terms.body
	"terms.as",             // file here; the external-nats install uses env
}

// leaves flattens a values tree into dotted paths; an empty map or list is
// a leaf of its own.
func leaves(prefix string, v any, out map[string]any) {
	m, ok := v.(map[string]any)
	if !ok || len(m) == 0 {
		out[prefix] = v
		return
	}
	for k, c := range m {
		p := k
		if prefix != "" {
			p = prefix + "." + k
		}
		leaves(p, c, out)
	}
}

// notOverridden lists the default leaves that full leaves unset or equal.
func notOverridden(defaults, full map[string]any) []string {
	d, f := map[string]any{}, map[string]any{}
	leaves("", defaults, d)
	leaves("", full, f)
	var missing []string
	for p, dv := range d {
		if slices.Contains(keptInFull, p) {
			continue
		}
		fv, ok := f[p]
		if !ok {
			// A map default overridden by deeper keys counts as set.
			for q := range f {
				if strings.HasPrefix(q, p+".") {
					ok = true
				}
			}
			if ok {
				continue
			}
		}
		if !ok || reflect.DeepEqual(fv, dv) {
			missing = append(missing, fmt.Sprintf("%s (default %v)", p, dv))
		}
	}
	slices.Sort(missing)
	return missing
}

func readYAML(t *testing.T, file string, replace map[string]string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	s := string(data)
	for a, b := range replace {
		s = strings.ReplaceAll(s, a, b)
	}
	var v map[string]any
	if err := sigsyaml.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return v
}

// TestFullValuesOverrideEverything: testdata/values-full.yaml (the
// "overrides" install) sets every value of the chart to something else
// than its default, so every value is rendered and checked at least once
// away from its default.
func TestFullValuesOverrideEverything(t *testing.T) {
	defaults := readYAML(t, chartDir+"/values.yaml", nil)
	full := readYAML(t, fullValues, map[string]string{"AUTH_CREDENTIALS": "{edge: {seed: x, publicKey: y}}"})
	if missing := notOverridden(defaults, full); len(missing) > 0 {
		t.Errorf("%s leaves values at their default:\n  %s", fullValues, strings.Join(missing, "\n  "))
	}
	// The check bites.
	delete(full, "logFormat")
	if got := notOverridden(defaults, full); !slices.ContainsFunc(got, func(s string) bool { return strings.HasPrefix(s, "logFormat ") }) {
		t.Errorf("with logFormat dropped, notOverridden = %v, want it named", got)
	}
}
