//go:build linux

package chartcheck

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

const readmeFile = "../../README.md"

// allInOneOnly marks a README row the chart has no use for: a setting of
// the all-in-one's embedded server, which the chart does not run.
const allInOneOnly = "(all-in-one only)"

var backticked = regexp.MustCompile("`([A-Z_*]+)`")

// readmeVariables are the variables of every README table whose header is
// "| Variable | Default | Meaning |", with the row's meaning. A cell such
// as "`RUNNER_TERMS_FILE` / `_BODY`" names RUNNER_TERMS_FILE and
// RUNNER_TERMS_BODY (a name starting with "_" continues the first name up
// to its last "_"); a pattern with "*" is refused: the table must name
// every variable.
func readmeVariables(text string) (map[string]string, error) {
	vars := map[string]string{}
	inTable := false
	for line := range strings.SplitSeq(text, "\n") {
		if strings.HasPrefix(line, "| Variable | Default | Meaning |") {
			inTable = true
			continue
		}
		if !strings.HasPrefix(line, "|") {
			inTable = false
			continue
		}
		if !inTable || strings.HasPrefix(line, "| ---") {
			continue
		}
		cells := strings.Split(line, "|")
		if len(cells) < 4 {
			return nil, fmt.Errorf("README row %q: want three cells", line)
		}
		names := backticked.FindAllStringSubmatch(cells[1], -1)
		if len(names) == 0 {
			return nil, fmt.Errorf("README row %q names no variable", line)
		}
		first := names[0][1]
		for _, m := range names {
			n := m[1]
			if strings.Contains(n, "*") {
				return nil, fmt.Errorf("README row %q: %s is a pattern; name each variable", line, n)
			}
			if strings.HasPrefix(n, "_") {
				n = first[:strings.LastIndex(first, "_")] + n
			}
			vars[n] = strings.TrimSpace(cells[3])
		}
	}
	if len(vars) == 0 {
		return nil, fmt.Errorf("README has no configuration table")
	}
	return vars, nil
}

// settable are the variables any container of the release sets (literal
// or from a Secret).
func settable(objs []*unstructured.Unstructured, into map[string][]string) {
	for _, o := range objs {
		cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		for _, c := range cs {
			env, _ := c.(map[string]any)["env"].([]any)
			for _, e := range env {
				n, _ := e.(map[string]any)["name"].(string)
				if !slices.Contains(into[n], o.GetName()) {
					into[n] = append(into[n], o.GetName())
				}
			}
		}
	}
}

// unsettable are the README's variables no install of the chart sets.
func unsettable(vars map[string]string, set map[string][]string) []string {
	var missing []string
	for v, meaning := range vars {
		if strings.Contains(meaning, allInOneOnly) {
			continue
		}
		if _, ok := set[v]; !ok {
			missing = append(missing, v)
		}
	}
	slices.Sort(missing)
	return missing
}

// TestReadmeVariablesSettable fails on a variable of the README's
// configuration tables that no install (defaults, every value overridden,
// external NATS with the terms body as a variable) gives to a workload.
func TestReadmeVariablesSettable(t *testing.T) {
	data, err := os.ReadFile(readmeFile)
	if err != nil {
		t.Fatal(err)
	}
	vars, err := readmeVariables(string(data))
	if err != nil {
		t.Fatal(err)
	}
	for _, must := range []string{"PORT", "RUNNER_APPS", "RUNNER_TERMS_BODY", "RUNNER_WATCH_SESSIONS", "RUNNER_RUN_START_DEADLINE_SECONDS", "SESSION_INGRESS_CLASS", "RUNNER_APP_MAX_EPHEMERAL_STORAGE"} {
		if _, ok := vars[must]; !ok {
			t.Errorf("README tables lack %s (parsed %d variables): the parser or the README is wrong", must, len(vars))
		}
	}
	set := map[string][]string{}
	for _, in := range installs {
		settable(mustRender(t, loadChart(t), in, chartutil.DefaultCapabilities), set)
	}
	if missing := unsettable(vars, set); len(missing) > 0 {
		t.Errorf("README variables the chart cannot set: %v", missing)
	}
	t.Logf("%d README variables, all settable; exempt as %s: %v", len(vars), allInOneOnly, func() (ex []string) {
		for v, m := range vars {
			if strings.Contains(m, allInOneOnly) {
				ex = append(ex, v)
			}
		}
		slices.Sort(ex)
		return ex
	}())

	// The check bites: a row the chart does not know, a pattern.
	broken := string(data) + "\n| Variable | Default | Meaning |\n| --- | --- | --- |\n| `RUNNER_NOT_IN_CHART` / `_EITHER` | x | y |\n"
	bv, err := readmeVariables(broken)
	if err != nil {
		t.Fatal(err)
	}
	if got := unsettable(bv, set); !slices.Equal(got, []string{"RUNNER_NOT_IN_CHART", "RUNNER_NOT_IN_EITHER"}) {
		t.Errorf("unsettable with two unknown rows = %v, want both", got)
	}
	if _, err := readmeVariables("| Variable | Default | Meaning |\n| --- | --- | --- |\n| `RUNNER_WATCH_*` | x | y |\n"); err == nil {
		t.Error("a pattern row parsed, want an error")
	}
}
