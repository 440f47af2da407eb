package contract

import (
	"strings"
	"testing"
)

func TestNewSessionID(t *testing.T) {
	const n = 2000
	seen := make(map[string]bool, n)
	used := make(map[rune]bool)
	for range n {
		id := NewSessionID()
		if !ValidSessionID(id) {
			t.Fatalf("NewSessionID() = %q, not a valid session id", id)
		}
		if seen[id] {
			t.Fatalf("NewSessionID() = %q twice in %d draws", id, n)
		}
		seen[id] = true
		for _, c := range id {
			used[rune(c)] = true
		}
	}
	// 24000 characters over 32 symbols: a symbol never drawn means the
	// mapping from random bytes to the alphabet is broken, not bad luck.
	for _, c := range sessionIDAlphabet {
		if !used[c] {
			t.Errorf("NewSessionID() never produced %q in %d ids", c, n)
		}
	}
}

func TestValidSessionID(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want bool
	}{
		{"all letters", "abcdefghijkl", true},
		{"all digits", "234567234567", true},
		{"mixed", "k3x7a2mzq4pq", true},
		{"empty", "", false},
		{"eleven", "abcdefghijk", false},
		{"thirteen", "abcdefghijklm", false},
		{"uppercase", "ABCDEFGHIJKL", false},
		{"one uppercase", "abcdefghijkL", false},
		{"digit 0", "abcdefghijk0", false},
		{"digit 1", "abcdefghijk1", false},
		{"digit 8", "abcdefghijk8", false},
		{"digit 9", "abcdefghijk9", false},
		{"padding", "abcdefghijk=", false},
		{"dash", "abcdef-hijkl", false},
		{"dot dot", "..abcdefghij", false},
		{"slash", "abcdef/hijkl", false},
		{"space", "abcdef hijkl", false},
		{"nul", "abcdef\x00hijk", false},
		{"non-ascii twelve bytes", "abcdefghij" + "é", false},
		{"non-ascii twelve runes", strings.Repeat("é", 12), false},
		{"char after z", "abcdefghijk{", false},
		{"char before a", "abcdefghijk`", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ValidSessionID(tt.in); got != tt.want {
				t.Errorf("ValidSessionID(%q) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}
