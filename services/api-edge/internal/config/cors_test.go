package config

import (
	"reflect"
	"testing"
)

func TestParseCORS(t *testing.T) {
	tests := []struct {
		name    string
		raw     string
		want    CORS
		wantErr bool
	}{
		{"star", "*", CORS{AnyOrigin: true}, false},
		{"star padded", " * ", CORS{AnyOrigin: true}, false},
		{"star with empties", ",*,", CORS{AnyOrigin: true}, false},
		{"one", "https://a.example", CORS{Origins: []string{"https://a.example"}}, false},
		{"trimmed and empties dropped", " https://a.example , ,https://b.example ,", CORS{Origins: []string{"https://a.example", "https://b.example"}}, false},
		{"duplicates collapsed", "https://a.example,https://a.example", CORS{Origins: []string{"https://a.example"}}, false},
		{"only commas", ",,", CORS{}, true},
		{"star mixed", "*,https://a.example", CORS{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseCORS(tt.raw)
			if (err != nil) != tt.wantErr {
				t.Fatalf("parseCORS(%q) error = %v, want error %v", tt.raw, err, tt.wantErr)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("parseCORS(%q) = %+v, want %+v", tt.raw, got, tt.want)
			}
		})
	}
}

func TestAllowOrigin(t *testing.T) {
	list := CORS{Origins: []string{"https://editor.telo.run", "http://localhost:5173"}}
	tests := []struct {
		name        string
		cors        CORS
		origin      string
		wantAllowed string
		wantOK      bool
	}{
		{"any with origin", CORS{AnyOrigin: true}, "https://evil.example", "*", true},
		{"any without origin", CORS{AnyOrigin: true}, "", "*", true},
		{"listed is echoed", list, "https://editor.telo.run", "https://editor.telo.run", true},
		{"second listed", list, "http://localhost:5173", "http://localhost:5173", true},
		{"unlisted", list, "https://evil.example", "", false},
		{"no origin", list, "", "", false},
		{"exact match only: case", list, "https://Editor.telo.run", "", false},
		{"exact match only: trailing slash", list, "https://editor.telo.run/", "", false},
		{"exact match only: port", list, "http://localhost:5174", "", false},
		{"exact match only: suffix", list, "https://editor.telo.run.evil.example", "", false},
		{"literal null origin", list, "null", "", false},
		{"zero value allows nothing", CORS{}, "https://editor.telo.run", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := tt.cors.AllowOrigin(tt.origin)
			if got != tt.wantAllowed || ok != tt.wantOK {
				t.Errorf("AllowOrigin(%q) = %q, %v; want %q, %v", tt.origin, got, ok, tt.wantAllowed, tt.wantOK)
			}
		})
	}
}
