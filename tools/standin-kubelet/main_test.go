package main

import (
	"io"
	"strings"
	"testing"
)

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{"--kubeconfig", "/k", "--root", "/r", "--node-name", "n1",
		"--listen", "127.0.0.1:0", "--pod-ip-base", "127.9", "--image-map", "busybox=/bin/sh", "--volumes", "env"}, io.Discard)
	if err != nil {
		t.Fatalf("parseFlags() error = %v", err)
	}
	want := options{kubeconfig: "/k", root: "/r", nodeName: "n1", listen: "127.0.0.1:0", podIPBase: "127.9",
		imageMap: "busybox=/bin/sh", logLevel: "info", volumes: "env"}
	if o != want {
		t.Errorf("parseFlags() = %+v, want %+v", o, want)
	}

	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no kubeconfig", []string{"--root", "/r"}, "--kubeconfig"},
		{"no root", []string{"--kubeconfig", "/k"}, "--root"},
		{"bad volumes", []string{"--kubeconfig", "/k", "--root", "/r", "--volumes", "tmpfs"}, "--volumes"},
		{"stray argument", []string{"--kubeconfig", "/k", "--root", "/r", "extra"}, "unexpected"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := parseFlags(tt.args, io.Discard); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("parseFlags(%q) error = %v, want one naming %s", tt.args, err, tt.want)
			}
		})
	}
}

func TestRunRejectsBadValues(t *testing.T) {
	base := []string{"--kubeconfig", "/nonexistent", "--root", t.TempDir()}
	tests := []struct {
		name  string
		extra []string
		want  string
	}{
		{"ip base", []string{"--pod-ip-base", "10.1"}, "--pod-ip-base"},
		{"image map", []string{"--image-map", "busybox"}, "--image-map"},
		{"log level", []string{"--log-level", "loud"}, "--log-level"},
		{"kubeconfig", nil, "--kubeconfig"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := run(t.Context(), append(append([]string{}, base...), tt.extra...), io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("run() error = %v, want one naming %s", err, tt.want)
			}
		})
	}
}
