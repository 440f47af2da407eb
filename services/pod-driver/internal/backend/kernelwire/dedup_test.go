package kernelwire

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// history is a kernel's frame history: frame i has timestamp base+ms[i].
type history []string

func makeHistory(ms ...int) (history, []time.Time) {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h := make(history, len(ms))
	ts := make([]time.Time, len(ms))
	for i, m := range ms {
		h[i] = fmt.Sprintf(`{"n":%d}`, i)
		ts[i] = base.Add(time.Duration(m) * time.Millisecond)
	}
	return h, ts
}

// connect feeds frames [from, to) of the history to a new connection and
// returns the indexes delivered.
func connect(d *dedup, h history, ts []time.Time, from, to int) []int {
	f := d.begin()
	var got []int
	for i := from; i < to; i++ {
		if f.admit([]byte(h[i]), ts[i]) {
			got = append(got, i)
		}
	}
	return got
}

func span(from, to int) []int {
	var s []int
	for i := from; i < to; i++ {
		s = append(s, i)
	}
	return s
}

func TestDedup(t *testing.T) {
	// Ten frames, several sharing a millisecond, as a fast kernel emits them.
	h, ts := makeHistory(0, 0, 0, 1, 1, 2, 2, 2, 3, 4)
	tests := []struct {
		name string
		// each connection sees history[from:to): a replay from `from` (the
		// kernel's buffer start) then live frames up to `to`.
		conns [][2]int
		want  [][]int
	}{
		{
			name:  "first connection delivers everything",
			conns: [][2]int{{0, 4}},
			want:  [][]int{span(0, 4)},
		},
		{
			name:  "reconnect skips the replay by count",
			conns: [][2]int{{0, 4}, {0, 7}, {0, 10}},
			want:  [][]int{span(0, 4), span(4, 7), span(7, 10)},
		},
		{
			name:  "reconnect with nothing new",
			conns: [][2]int{{0, 5}, {0, 5}},
			want:  [][]int{span(0, 5), nil},
		},
		{
			name:  "rolled-over buffer falls back to timestamp plus position",
			conns: [][2]int{{0, 7}, {3, 10}},
			want:  [][]int{span(0, 7), span(7, 10)},
		},
		{
			name:  "rolled over past everything delivered",
			conns: [][2]int{{0, 4}, {6, 10}},
			want:  [][]int{span(0, 4), span(6, 10)},
		},
		{
			name:  "rolled over inside a millisecond group",
			conns: [][2]int{{0, 6}, {1, 9}},
			want:  [][]int{span(0, 6), span(6, 9)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var d dedup
			for i, c := range tt.conns {
				if got := connect(&d, h, ts, c[0], c[1]); !slices.Equal(got, tt.want[i]) {
					t.Errorf("connection %d over [%d,%d) delivered %v, want %v", i, c[0], c[1], got, tt.want[i])
				}
			}
		})
	}
}
