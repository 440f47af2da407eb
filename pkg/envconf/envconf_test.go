package envconf_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/telorunner/telorunner/pkg/envconf"
)

func env(vars map[string]string) *envconf.Env {
	return envconf.New(func(k string) (string, bool) { v, ok := vars[k]; return v, ok })
}

func TestReaders(t *testing.T) {
	e := env(map[string]string{
		"N": " 42 ", "NEG": "-1", "D": "3", "B": "YES", "L": " a  b c ", "T": " x ", "BLANK": "  ",
	})
	n, neg, d, b, l, txt, keep := 7, 0, time.Duration(0), false, []string(nil), "", 9
	e.Int("N", 1, 100, &n)
	e.Int("NEG", -1, 65535, &neg)
	e.Duration("D", time.Second, 1, envconf.NoMax, &d)
	e.Bool("B", &b)
	e.Fields("L", &l)
	e.Text("T", &txt)
	e.Int("BLANK", 1, 5, &keep)
	e.Int("UNSET", 1, 5, &keep)
	if err := e.Err(); err != nil {
		t.Fatal(err)
	}
	if n != 42 || neg != -1 || d != 3*time.Second || !b || strings.Join(l, ",") != "a,b,c" || txt != "x" || keep != 9 {
		t.Fatalf("got %d %d %v %v %q %q %d", n, neg, d, b, l, txt, keep)
	}
}

func TestErrors(t *testing.T) {
	e := env(map[string]string{
		"PLUS": "+5", "ZERO": "0", "BIG": "101", "WORD": "x", "OVER": "99999999999999999999",
		"DUR": "9223372036854775807", "FRAC": "1.5", "BOOL": "on",
	})
	var i int
	var d time.Duration
	var b bool
	e.Int("PLUS", 1, envconf.NoMax, &i)
	e.Int("ZERO", 1, envconf.NoMax, &i)
	e.Int("BIG", 1, 100, &i)
	e.Int("WORD", 1, envconf.NoMax, &i)
	e.Int("OVER", 1, envconf.NoMax, &i)
	e.Duration("DUR", time.Millisecond, 1, envconf.NoMax, &d)
	e.Duration("FRAC", time.Second, 1, 86400, &d)
	e.Bool("BOOL", &b)
	e.Required("MISSING")
	want := []string{
		`PLUS: must be a positive integer, got "+5"`,
		`ZERO: must be a positive integer, got "0"`,
		`BIG: must be an integer from 1 to 100, got "101"`,
		`WORD: must be a positive integer, got "x"`,
		`OVER: must be a positive integer, got "99999999999999999999"`,
		`DUR: must be a positive integer no larger than 9223372036854, got "9223372036854775807"`,
		`FRAC: must be an integer from 1 to 86400, got "1.5"`,
		`BOOL: must be true, 1, yes, false, 0 or no, got "on"`,
		`MISSING: must be set`,
	}
	errs := e.Errs()
	if len(errs) != len(want) {
		t.Fatalf("%d errors, want %d: %v", len(errs), len(want), e.Err())
	}
	for k, err := range errs {
		var ee *envconf.Error
		if !errors.As(err, &ee) || err.Error() != want[k] {
			t.Errorf("error %d = %q, want %q", k, err, want[k])
		}
	}
	if i != 0 || d != 0 || b {
		t.Fatalf("a bad value was stored: %d %v %v", i, d, b)
	}
}
