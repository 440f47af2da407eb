package expand

import "testing"

func TestString(t *testing.T) {
	vars := Map(map[string]string{"A": "a", "B": "bee", "EMPTY": "", "X": "$(A)"})
	tests := []struct {
		name, in, want string
	}{
		{"no reference", "plain", "plain"},
		{"defined", "$(A)", "a"},
		{"embedded", "x$(A)y$(B)z", "xaybeez"},
		{"undefined kept", "$(NOPE)", "$(NOPE)"},
		{"empty value", "[$(EMPTY)]", "[]"},
		{"escaped", "$$(A)", "$(A)"},
		{"double escape then ref", "$$$(A)", "$a"},
		{"lone dollar at end", "cost$", "cost$"},
		{"dollar before other", "$HOME $1", "$HOME $1"},
		{"unterminated", "$(A", "$(A"},
		{"unterminated then ref", "$(A $(B)", "$(A $(B)"},
		{"empty name", "$()", "$()"},
		{"no recursion", "$(X)", "$(A)"},
		{"adjacent", "$(A)$(A)", "aa"},
		{"escaped dollar alone", "$$", "$"},
		{"shell style left alone", "${A}", "${A}"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := String(tt.in, vars); got != tt.want {
				t.Errorf("String(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func FuzzString(f *testing.F) {
	for _, s := range []string{"$(A)", "$$(A)", "$(", "$", "a$(B)c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		// With no variables defined, only $$ changes the text.
		got := String(s, Map(nil))
		if len(got) > len(s) {
			t.Fatalf("String(%q) = %q grew without variables", s, got)
		}
	})
}
