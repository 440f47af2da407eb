// Command peercompare prints `make bench-peer`'s table: each measure of two
// runners' peerload results (telorunner and the reference peer, same
// machine, same run) and its ratio, ours ÷ reference, with which way is
// better. A side is a path prefix: PREFIX-io.json, PREFIX-sse.json and
// PREFIX-create.json (`peerload <mode> --json`), or PREFIX.json holding all
// three (`peerload all --json`); a missing scenario prints n/a.
//
//	peercompare OURS REFERENCE
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"strings"
)

// measure is one figure of a peerload result: a path into its JSON and
// whether a higher value is the better one.
type measure struct {
	name, path, unit string
	higherBetter     bool
}

var measures = []measure{
	{"create → 201 p50", "create.p50Ms", "ms", false},
	{"create → 201 p99", "create.p99Ms", "ms", false},
	{"creates per second", "create.perSecond", "/s", true},
	{"server CPU per create", "create.cpuPerCreateMs", "ms", false},
	{"io MiB/s (median)", "io.medianMiBPerSec", "MiB/s", true},
	{"io MiB per server CPU-second", "io.medianMiBPerCPUSecond", "MiB/CPU-s", true},
	{"sse latency p50", "sse.latencyP50Ms", "ms", false},
	{"sse latency p99", "sse.latencyP99Ms", "ms", false},
	{"sse bytes per idle subscriber", "sse.bytesPerIdleSubscriber", "B", false},
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: peercompare OURS REFERENCE   (path prefixes of peerload --json results)")
		os.Exit(2)
	}
	ours, err := load(os.Args[1])
	if err != nil {
		fail(err)
	}
	ref, err := load(os.Args[2])
	if err != nil {
		fail(err)
	}
	fmt.Printf("%-30s %16s %16s %9s  %s\n", "measure", "telorunner", "reference", "ours÷ref", "better")
	for _, m := range measures {
		a, b := value(ours, m.path), value(ref, m.path)
		ratio := math.NaN()
		if !math.IsNaN(a) && !math.IsNaN(b) && b != 0 {
			ratio = a / b
		}
		better := "lower"
		if m.higherBetter {
			better = "higher"
		}
		fmt.Printf("%-30s %16s %16s %9s  %s\n", m.name, num(a, m.unit), num(b, m.unit), num(ratio, "×"), better)
	}
	for _, r := range []struct {
		label string
		doc   map[string]any
	}{{"telorunner", ours}, {"reference", ref}} {
		n := func(path string) string { return num(value(r.doc, path), "") }
		fmt.Printf("%s: io %s of %s bytes received (seq breaks %s, gaps %s); sse %s of %s deliveries, %s subscriber errors; create %s, %s non-201\n",
			r.label, n("io.receivedBytes"), n("io.outputBytes"), n("io.seqBreaks"), n("io.gaps"),
			n("sse.delivered"), n("sse.expectedDeliveries"), n("sse.subscriberErrors"), n("create.count"), n("create.non201"))
	}
}

// load reads one side's peerload results and adds the derived figures.
func load(prefix string) (map[string]any, error) {
	doc := map[string]any{}
	found := false
	for _, path := range []string{prefix + ".json", prefix + "-io.json", prefix + "-sse.json", prefix + "-create.json"} {
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		var part map[string]any
		if err := json.Unmarshal(b, &part); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		for _, k := range []string{"io", "sse", "create"} {
			if v, ok := part[k]; ok {
				doc[k] = v
				found = true
			}
		}
	}
	if !found {
		return nil, fmt.Errorf("no peerload results at %s(-io|-sse|-create).json", prefix)
	}
	if io, ok := doc["io"].(map[string]any); ok {
		runs, _ := io["runs"].([]any)
		for _, k := range []string{"receivedBytes", "outputBytes", "seqBreaks", "gaps"} {
			sum := 0.0
			for _, r := range runs {
				if m, ok := r.(map[string]any); ok {
					f, _ := m[k].(float64)
					sum += f
				}
			}
			io[k] = sum
		}
	}
	if c, ok := doc["create"].(map[string]any); ok {
		cpu, _ := c["serverCpuSeconds"].(float64)
		n, _ := c["count"].(float64)
		if cpu > 0 && n > 0 {
			c["cpuPerCreateMs"] = cpu / n * 1000
		}
	}
	return doc, nil
}

func get(doc map[string]any, path string) any {
	var cur any = doc
	for _, k := range strings.Split(path, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[k]
	}
	return cur
}

func value(doc map[string]any, path string) float64 {
	if f, ok := get(doc, path).(float64); ok && f >= 0 {
		return f
	}
	return math.NaN()
}

func num(f float64, unit string) string {
	switch {
	case math.IsNaN(f):
		return "n/a"
	case unit == "":
		return fmt.Sprintf("%.0f", f)
	case unit == "×":
		return fmt.Sprintf("%.2f×", f)
	case f >= 100:
		return fmt.Sprintf("%.0f %s", f, unit)
	default:
		return fmt.Sprintf("%.2f %s", f, unit)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "peercompare:", err)
	os.Exit(1)
}
