package podspec

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ParseCPU parses a CPU quantity as millicores (contract 11.2): "500m" is
// 500, "1" is 1000, "0.5" is 500.
func ParseCPU(s string) (int64, error) {
	if v, ok := strings.CutSuffix(s, "m"); ok {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("parse cpu %q", s)
		}
		return n, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) || f > math.MaxInt64/1000 {
		return 0, fmt.Errorf("parse cpu %q", s)
	}
	return int64(math.Round(f * 1000)), nil
}

var byteSuffixes = []struct {
	suffix string
	mult   float64
}{
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40},
	{"K", 1e3}, {"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12},
}

// ParseBytes parses a memory or storage quantity as bytes (contract 11.2):
// suffixes Ki Mi Gi Ti are powers of 1024, K k M G T powers of 1000.
func ParseBytes(s string) (int64, error) {
	num, mult := s, 1.0
	for _, b := range byteSuffixes {
		if v, ok := strings.CutSuffix(s, b.suffix); ok {
			num, mult = v, b.mult
			break
		}
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f < 0 || math.IsNaN(f) || f*mult > math.MaxInt64/2 {
		return 0, fmt.Errorf("parse quantity %q", s)
	}
	return int64(f * mult), nil
}

// Clamp returns requested when it parses and is at most ceiling, else
// ceiling (contract 11.2: ceilings are hard). ceiling must parse.
func Clamp(requested, ceiling string, parse func(string) (int64, error)) string {
	if requested == "" {
		return ceiling
	}
	r, err := parse(requested)
	if err != nil {
		return ceiling
	}
	c, err := parse(ceiling)
	if err != nil || r > c {
		return ceiling
	}
	return requested
}

// ClampTTL is min(requested, ceiling) when requested > 0, else ceiling.
func ClampTTL(requested, ceiling int64) int64 {
	if requested > 0 && requested < ceiling {
		return requested
	}
	return ceiling
}
