package bench

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// minAbove is how many samples must lie above a percentile's rank for the
// percentile to be printed: p50 needs 10 samples, p95 100, p99 500. With
// fewer, the samples themselves are printed.
const minAbove = 5

// rank is the nearest-rank index of percentile q (0 < q < 1) in n sorted
// samples.
func rank(q float64, n int) int {
	return max(0, int(math.Ceil(q*float64(n)))-1)
}

// supported reports whether n samples support percentile q: at least
// minAbove of them lie above its rank, so it is not the maximum or next to
// it under another name.
func supported(q float64, n int) bool { return n > 0 && n-1-rank(q, n) >= minAbove }

// latency sorts d, reports each percentile of qs that its samples support
// as metric "<prefix>p<q>-ms" and the sample count as "<prefix>n", and logs
// one line naming what was measured with n= and what the samples support:
// the percentiles and the maximum, or, below 2×minAbove samples, every
// sample. A percentile the samples do not support is neither reported nor
// printed.
func latency(b *testing.B, what, prefix string, d []time.Duration, qs ...float64) {
	b.Helper()
	if len(d) == 0 {
		b.Fatalf("%s: no samples", what)
	}
	slices.Sort(d)
	n := len(d)
	ms := func(x time.Duration) float64 { return float64(x.Microseconds()) / 1000 }
	var parts []string
	for _, q := range qs {
		if !supported(q, n) {
			continue
		}
		v := d[rank(q, n)]
		name := fmt.Sprintf("p%g", q*100)
		b.ReportMetric(ms(v), prefix+name+"-ms")
		parts = append(parts, fmt.Sprintf("%s %s", name, v.Round(10*time.Microsecond)))
	}
	if n < 2*minAbove {
		all := make([]string, n)
		for i, x := range d {
			all[i] = x.Round(time.Millisecond).String()
		}
		parts = append(parts, "samples "+strings.Join(all, " "))
		b.ReportMetric(ms(d[0]), prefix+"min-ms")
	}
	b.ReportMetric(ms(d[n-1]), prefix+"max-ms")
	b.ReportMetric(float64(n), prefix+"n")
	parts = append(parts, fmt.Sprintf("max %s", d[n-1].Round(10*time.Microsecond)))
	b.Logf("%s: n=%d %s", what, n, strings.Join(parts, ", "))
}

func TestPercentileSupport(t *testing.T) {
	for _, c := range []struct {
		q    float64
		n    int
		want bool
	}{
		{0.5, 3, false}, {0.5, 9, false}, {0.5, 10, true},
		{0.95, 3, false}, {0.95, 99, false}, {0.95, 100, true},
		{0.99, 150, false}, {0.99, 499, false}, {0.99, 500, true}, {0.99, 3000, true},
	} {
		if got := supported(c.q, c.n); got != c.want {
			t.Errorf("supported(p%g, n=%d) = %v, want %v (rank %d)", c.q*100, c.n, got, c.want, rank(c.q, c.n))
		}
	}
	if r := rank(0.95, 3); r != 2 {
		t.Errorf("rank(p95, 3) = %d, want 2: the maximum, which is why p95 of 3 samples is not printed", r)
	}
}
