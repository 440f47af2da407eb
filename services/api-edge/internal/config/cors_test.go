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
		{"port wildcard", "http://localhost:*", CORS{Origins: []string{"http://localhost:*"}}, false},
		{"wildcard in host", "http://*.example", CORS{}, true},
		{"wildcard with path", "http://localhost/x:*", CORS{}, true},
		{"wildcard with port", "http://localhost:80:*", CORS{}, true},
		{"wildcard without scheme", "localhost:*", CORS{}, true},
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
		{"loopback any port", LoopbackCORS(), "http://localhost:5173", "http://localhost:5173", true},
		{"loopback no port", LoopbackCORS(), "http://localhost", "http://localhost", true},
		{"loopback 127.0.0.1", LoopbackCORS(), "http://127.0.0.1:8062", "http://127.0.0.1:8062", true},
		{"loopback ipv6", LoopbackCORS(), "http://[::1]:3000", "http://[::1]:3000", true},
		{"loopback other scheme", LoopbackCORS(), "https://localhost:5173", "", false},
		{"loopback look-alike host", LoopbackCORS(), "http://localhost.evil.example", "", false},
		{"loopback port suffix", LoopbackCORS(), "http://localhost:80.evil.example", "", false},
		{"loopback empty port", LoopbackCORS(), "http://localhost:", "", false},
		{"loopback other address", LoopbackCORS(), "http://127.0.0.2:80", "", false},
		{"loopback null", LoopbackCORS(), "null", "", false},
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

func TestLoadOverCORS(t *testing.T) {
	base := Default()
	base.CORS = LoopbackCORS()
	base.ListenHost = "127.0.0.1"
	tests := []struct {
		name string
		env  map[string]string
		want CORS
		host string
	}{
		{"unset keeps the base", nil, LoopbackCORS(), "127.0.0.1"},
		{"list adds to the base", map[string]string{"RUNNER_CORS_ORIGINS": "https://editor.example, http://localhost:*"},
			CORS{Origins: append(LoopbackCORS().Origins, "https://editor.example")}, "127.0.0.1"},
		{"star must be asked for", map[string]string{"RUNNER_CORS_ORIGINS": "*"}, CORS{AnyOrigin: true}, "127.0.0.1"},
		{"listen host opens it", map[string]string{"RUNNER_LISTEN_HOST": "0.0.0.0"}, LoopbackCORS(), "0.0.0.0"},
		{"ipv6 listen host", map[string]string{"RUNNER_LISTEN_HOST": "[::]"}, LoopbackCORS(), "::"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := LoadOver(base, env(tt.env))
			if err != nil {
				t.Fatalf("LoadOver() error = %v", err)
			}
			if !reflect.DeepEqual(got.CORS, tt.want) || got.ListenHost != tt.host {
				t.Errorf("LoadOver() CORS = %+v, host %q; want %+v, %q", got.CORS, got.ListenHost, tt.want, tt.host)
			}
		})
	}
	// The standalone edge: a list replaces the any-origin default (2.4).
	got, err := Load(env(map[string]string{"RUNNER_CORS_ORIGINS": "https://a.example"}))
	if err != nil || !reflect.DeepEqual(got.CORS, CORS{Origins: []string{"https://a.example"}}) {
		t.Errorf("Load() CORS = %+v, %v; want only https://a.example", got.CORS, err)
	}
}
