// Package expand implements Kubernetes' $(VAR) expansion for container
// command, args and env values.
//
// The rules are the API's: $(NAME) becomes the value of NAME when NAME is
// defined and stays as written otherwise; $$ is an escaped $, so $$(NAME)
// yields the literal text $(NAME); any other $ is kept; an unterminated
// $(NAME is kept as written.
package expand

import "strings"

// Lookup returns the value of a variable and whether it is defined.
type Lookup func(name string) (string, bool)

// String expands every $(VAR) reference in s using lookup.
func String(s string, lookup Lookup) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '$' || i+1 == len(s) {
			b.WriteByte(c)
			continue
		}
		switch next := s[i+1]; next {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString("$(")
				i++
				continue
			}
			name := s[i+2 : i+2+end]
			if v, ok := lookup(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString("$(" + name + ")")
			}
			i += 2 + end
		default:
			b.WriteByte('$')
			b.WriteByte(next)
			i++
		}
	}
	return b.String()
}

// Map returns a Lookup over m.
func Map(m map[string]string) Lookup {
	return func(name string) (string, bool) {
		v, ok := m[name]
		return v, ok
	}
}
