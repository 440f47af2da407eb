package kernelwire

import (
	"slices"
	"testing"

	"github.com/telorunner/telorunner/pkg/contract"
)

func TestSeedChanges(t *testing.T) {
	marker := Write{Path: MarkerPath, Content: MarkerContent, Encoding: "utf8"}
	tests := []struct {
		name  string
		files []contract.BundleFile
		want  []Write
	}{
		{
			name:  "marker added",
			files: []contract.BundleFile{{RelativePath: "./a/../telo.yaml", Contents: "x"}},
			want:  []Write{{Path: "telo.yaml", Content: "x", Encoding: "utf8"}, marker},
		},
		{
			name:  "bundle brings its own",
			files: []contract.BundleFile{{RelativePath: "/telo-workspace.yaml", Contents: "modules: [a]\n"}},
			want:  []Write{{Path: "telo-workspace.yaml", Content: "modules: [a]\n", Encoding: "utf8"}},
		},
		{
			name:  "a nested marker is not the root's",
			files: []contract.BundleFile{{RelativePath: "sub/telo-workspace.yaml", Contents: "bQ==", Encoding: "base64"}},
			want:  []Write{{Path: "sub/telo-workspace.yaml", Content: "bQ==", Encoding: "base64"}, marker},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cs, err := SeedChanges(tt.files)
			if err != nil || !slices.Equal(cs.Write, tt.want) {
				t.Errorf("SeedChanges() = %+v, %v; want %+v", cs.Write, err, tt.want)
			}
		})
	}
	for _, bad := range []contract.BundleFile{{RelativePath: "../x", Contents: "x"}, {RelativePath: "x", Contents: "!", Encoding: "base64"}} {
		if _, err := SeedChanges([]contract.BundleFile{bad}); err == nil {
			t.Errorf("SeedChanges(%+v) = nil error, want one", bad)
		}
	}
}
