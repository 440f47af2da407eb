package server

import (
	"encoding/json"
	"math"
	"testing"
)

func TestClampDim(t *testing.T) {
	tests := []struct {
		name string
		in   any
		want int
		ok   bool
	}{
		{"integer", float64(80), 80, true},
		{"one", float64(1), 1, true},
		{"floored", 3.9, 3, true},
		{"max", float64(10000), 10000, true},
		{"clamped", float64(10001), 10000, true},
		{"huge", 1e300, 10000, true},
		{"numeric string", "120", 120, true},
		{"numeric string with space", " 24 ", 24, true},
		{"fractional string", "24.9", 24, true},
		{"exponent string", "1e3", 1000, true},
		{"true is 1", true, 1, true},
		{"zero", float64(0), 0, false},
		{"half", 0.5, 0, false},
		{"0.999", 0.999, 0, false},
		{"negative", float64(-5), 0, false},
		{"negative zero", math.Copysign(0, -1), 0, false},
		{"NaN", math.NaN(), 0, false},
		{"+Inf", math.Inf(1), 0, false},
		{"-Inf", math.Inf(-1), 0, false},
		{"NaN string", "NaN", 0, false},
		{"Infinity string", "Infinity", 0, false},
		{"word", "wide", 0, false},
		{"empty string", "", 0, false},
		{"false", false, 0, false},
		{"null", nil, 0, false},
		{"object", map[string]any{}, 0, false},
		{"array", []any{float64(80)}, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := clampDim(tc.in)
			if got != tc.want || ok != tc.ok {
				t.Errorf("clampDim(%#v) = %d, %v, want %d, %v", tc.in, got, ok, tc.want, tc.ok)
			}
		})
	}
}

// FuzzClampDim decodes a resize field the way the io reader does and checks
// 7.7's bounds and, for numbers, the exact value.
func FuzzClampDim(f *testing.F) {
	for _, s := range []string{`80`, `3.9`, `10001`, `0.5`, `-1`, `"24"`, `"NaN"`, `1e400`, `true`, `null`, `"x"`, `[]`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		var v any
		if json.Unmarshal([]byte(raw), &v) != nil {
			return
		}
		got, ok := clampDim(v)
		if ok && (got < 1 || got > 10000) {
			t.Fatalf("clampDim(%s) = %d, want 1-10000", raw, got)
		}
		if !ok && got != 0 {
			t.Fatalf("clampDim(%s) = %d, false, want 0 when ignored", raw, got)
		}
		if n, isNum := v.(float64); isNum {
			want, wantOK := 0, false
			if fl := math.Floor(n); fl >= 1 {
				want, wantOK = int(math.Min(fl, 10000)), true
			}
			if got != want || ok != wantOK {
				t.Fatalf("clampDim(%s) = %d, %v, want %d, %v", raw, got, ok, want, wantOK)
			}
		}
	})
}

func TestParsePosition(t *testing.T) {
	tests := []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"0", 0, true},
		{"12", 12, true},
		{"12abc", 12, true},
		{"007", 7, true},
		{"3.7", 3, true},
		{"18446744073709551615", math.MaxUint64, true},
		{"", 0, false},
		{"x", 0, false},
		{"abc12", 0, false},
		{"-1", 0, false},
		{"18446744073709551616", 0, false}, // overflows: does not parse
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, ok := parsePosition(tc.in)
			if got != tc.want || ok != tc.ok {
				t.Errorf("parsePosition(%q) = %d, %v, want %d, %v", tc.in, got, ok, tc.want, tc.ok)
			}
		})
	}
}
