package version

import (
	"bytes"
	"strings"
	"testing"
)

func TestRequested(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"version"}, true},
		{[]string{"--version"}, true},
		{[]string{"-version"}, true},
		{nil, false},
		{[]string{"provision"}, false},
		{[]string{"version", "extra"}, false},
	} {
		if got := Requested(tc.args); got != tc.want {
			t.Errorf("Requested(%q) = %v, want %v", tc.args, got, tc.want)
		}
	}
}

func TestPrint(t *testing.T) {
	Version, Revision = "1.2.3", "abc123"
	t.Cleanup(func() { Version, Revision = "dev", "" })
	var b bytes.Buffer
	Print(&b, "api-edge")
	if got := b.String(); !strings.HasPrefix(got, "api-edge 1.2.3 (abc123, go") || !strings.HasSuffix(got, ")\n") {
		t.Errorf("Print = %q, want %q", got, "api-edge 1.2.3 (abc123, go…)\n")
	}
}
