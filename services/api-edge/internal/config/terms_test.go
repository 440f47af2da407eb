package config

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestTermsVersion(t *testing.T) {
	got := termsVersion("")
	want := "e3b0c44298fc" // sha256 of the empty string
	if got != want {
		t.Errorf("termsVersion(\"\") = %q, want %q", got, want)
	}
	if a, b := termsVersion("Be nice."), termsVersion("Be nice!"); a == b || len(a) != 12 {
		t.Errorf("termsVersion() = %q and %q, want distinct 12-char versions", a, b)
	}
}

func TestLoadTerms(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "terms.md")
	const fileBody = "# Terms\n\nDo not mine coins.\n"
	if err := os.WriteFile(file, []byte(fileBody), 0o600); err != nil {
		t.Fatal(err)
	}
	blank := filepath.Join(dir, "blank.md")
	if err := os.WriteFile(blank, []byte(" \n\t\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		env  map[string]string
		want *Terms
	}{
		{"none", nil, nil},
		{"body", map[string]string{"RUNNER_TERMS_BODY": "Be nice."},
			&Terms{Version: termsVersion("Be nice."), Title: "Usage agreement", Body: "Be nice."}},
		{"body kept verbatim", map[string]string{"RUNNER_TERMS_BODY": "  Be nice.\n"},
			&Terms{Version: termsVersion("  Be nice.\n"), Title: "Usage agreement", Body: "  Be nice.\n"}},
		{"blank body is no terms", map[string]string{"RUNNER_TERMS_BODY": " \n\t"}, nil},
		{"blank body ignores title and version", map[string]string{
			"RUNNER_TERMS_BODY": "", "RUNNER_TERMS_TITLE": "T", "RUNNER_TERMS_VERSION": "v1",
		}, nil},
		{"title and version trimmed", map[string]string{
			"RUNNER_TERMS_BODY": "Be nice.", "RUNNER_TERMS_TITLE": " Before you run ", "RUNNER_TERMS_VERSION": " 2026-01 ",
		}, &Terms{Version: "2026-01", Title: "Before you run", Body: "Be nice."}},
		{"blank title and version are default", map[string]string{
			"RUNNER_TERMS_BODY": "Be nice.", "RUNNER_TERMS_TITLE": " ", "RUNNER_TERMS_VERSION": "",
		}, &Terms{Version: termsVersion("Be nice."), Title: "Usage agreement", Body: "Be nice."}},
		{"file", map[string]string{"RUNNER_TERMS_FILE": file},
			&Terms{Version: termsVersion(fileBody), Title: "Usage agreement", Body: fileBody}},
		{"file path trimmed", map[string]string{"RUNNER_TERMS_FILE": " " + file + " "},
			&Terms{Version: termsVersion(fileBody), Title: "Usage agreement", Body: fileBody}},
		{"file wins over body", map[string]string{"RUNNER_TERMS_FILE": file, "RUNNER_TERMS_BODY": "ignored"},
			&Terms{Version: termsVersion(fileBody), Title: "Usage agreement", Body: fileBody}},
		{"blank file is no terms even with a body", map[string]string{"RUNNER_TERMS_FILE": blank, "RUNNER_TERMS_BODY": "ignored"}, nil},
		{"blank file path falls back to body", map[string]string{"RUNNER_TERMS_FILE": "  ", "RUNNER_TERMS_BODY": "Be nice."},
			&Terms{Version: termsVersion("Be nice."), Title: "Usage agreement", Body: "Be nice."}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(env(tt.env))
			if err != nil {
				t.Fatalf("Load(%v) error = %v", tt.env, err)
			}
			if got := c.Terms; !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Load(%v).Terms = %+v, want %+v", tt.env, got, tt.want)
			}
		})
	}
}

func TestLoadTermsErrors(t *testing.T) {
	dir := t.TempDir()
	latin1 := filepath.Join(dir, "latin1.md")
	if err := os.WriteFile(latin1, []byte("caf\xe9"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		env     map[string]string
		wantVar string
		wantErr error
	}{
		{"missing file", map[string]string{"RUNNER_TERMS_FILE": filepath.Join(dir, "absent.md")}, "RUNNER_TERMS_FILE", fs.ErrNotExist},
		{"missing file with body", map[string]string{"RUNNER_TERMS_FILE": filepath.Join(dir, "absent.md"), "RUNNER_TERMS_BODY": "b"}, "RUNNER_TERMS_FILE", fs.ErrNotExist},
		{"directory", map[string]string{"RUNNER_TERMS_FILE": dir}, "RUNNER_TERMS_FILE", nil},
		{"file not utf-8", map[string]string{"RUNNER_TERMS_FILE": latin1}, "RUNNER_TERMS_FILE", errNotUTF8},
		{"body not utf-8", map[string]string{"RUNNER_TERMS_BODY": "caf\xe9"}, "RUNNER_TERMS_BODY", errNotUTF8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load(env(tt.env))
			var ce *Error
			if !errors.As(err, &ce) || ce.Var != tt.wantVar {
				t.Fatalf("Load(%v) error = %v, want *Error for %s", tt.env, err, tt.wantVar)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("Load(%v) error = %v, want it to wrap %v", tt.env, err, tt.wantErr)
			}
		})
	}
}
