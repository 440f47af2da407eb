package devkernel

import (
	"errors"
	"reflect"
	"testing"
)

func TestParseArgs(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want Options
	}{
		{"runner k8s watch", []string{"run", "--watch", "--inspect", "0.0.0.0:9231", "--no-open", "/workspace/telo.yaml"},
			Options{Path: "/workspace/telo.yaml", Watch: true, Inspect: true, InspectAddr: "0.0.0.0:9231"}},
		{"inspect value then path", []string{"--inspect", "0.0.0.0:9231", "--no-open", "/x/telo.yaml"},
			Options{Path: "/x/telo.yaml", Inspect: true, InspectAddr: "0.0.0.0:9231"}},
		{"inspect equals port", []string{"--inspect=9230", "/x/telo.yaml"},
			Options{Path: "/x/telo.yaml", Inspect: true, InspectAddr: "127.0.0.1:9230"}},
		{"inspect followed by path takes no value", []string{"--inspect", "/x/telo.yaml"},
			Options{Path: "/x/telo.yaml", Inspect: true, InspectAddr: DefaultInspectAddr}},
		{"flags after path (k8s run session)", []string{"run", "/app/main.yaml", "--no-cache-write", "--inspect", "0.0.0.0:9230", "--no-open"},
			Options{Path: "/app/main.yaml", Inspect: true, InspectAddr: "0.0.0.0:9230"}},
		{"docker run without command", []string{"./main.yaml", "--inspect", "0.0.0.0:9230", "--no-open"},
			Options{Path: "./main.yaml", Inspect: true, InspectAddr: "0.0.0.0:9230"}},
		{"inspect last with no value", []string{"x.yaml", "--inspect"},
			Options{Path: "x.yaml", Inspect: true, InspectAddr: DefaultInspectAddr}},
		{"inspect empty equals", []string{"--inspect=", "x.yaml"},
			Options{Path: "x.yaml", Inspect: true, InspectAddr: DefaultInspectAddr}},
		{"inspect bare port token", []string{"--inspect", "9300", "x.yaml"},
			Options{Path: "x.yaml", Inspect: true, InspectAddr: "127.0.0.1:9300"}},
		{"inspect localhost token", []string{"--inspect", "localhost", "x.yaml"},
			Options{Path: "x.yaml", Inspect: true, InspectAddr: "localhost:9230"}},
		{"inspect ip token", []string{"--inspect", "0.0.0.0", "x.yaml"},
			Options{Path: "x.yaml", Inspect: true, InspectAddr: "0.0.0.0:9230"}},
		{"inspect ipv6 token", []string{"--inspect", "[::1]:9231", "x.yaml"},
			Options{Path: "x.yaml", Inspect: true, InspectAddr: "[::1]:9231"}},
		{"inspect ipv6 literal equals", []string{"--inspect=::1", "x.yaml"},
			Options{Path: "x.yaml", Inspect: true, InspectAddr: "[::1]:9230"}},
		{"inspect host equals", []string{"--inspect=myhost", "x.yaml"},
			Options{Path: "x.yaml", Inspect: true, InspectAddr: "myhost:9230"}},
		{"inspect host:port equals", []string{"--inspect=myhost:1234", "x.yaml"},
			Options{Path: "x.yaml", Inspect: true, InspectAddr: "myhost:1234"}},
		{"inspect does not eat a bare word", []string{"--inspect", "myhost", "x.yaml"},
			Options{Path: "myhost", Inspect: true, InspectAddr: DefaultInspectAddr, AppArgs: []string{"x.yaml"}}},
		{"registry url separate", []string{"--registry-url", "https://r.example", "x.yaml"},
			Options{Path: "x.yaml"}},
		{"registry url equals and debug", []string{"--registry-url=https://r.example", "--debug", "x.yaml"},
			Options{Path: "x.yaml"}},
		{"app args after path", []string{"run", "x.yaml", "--port", "8080", "--watch", "extra"},
			Options{Path: "x.yaml", Watch: true, AppArgs: []string{"--port", "8080", "extra"}}},
		{"double dash", []string{"--watch", "--", "x.yaml", "--inspect"},
			Options{Path: "x.yaml", Watch: true, AppArgs: []string{"--inspect"}}},
		{"help", []string{"--help"}, Options{Help: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseArgs(tt.args)
			if err != nil {
				t.Fatalf("ParseArgs(%q) error = %v", tt.args, err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ParseArgs(%q) = %+v, want %+v", tt.args, got, tt.want)
			}
		})
	}
}

func TestParseArgsErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
	}{
		{"no path", []string{"run", "--watch"}},
		{"nothing", nil},
		{"unknown flag before path", []string{"--frobnicate", "x.yaml"}},
		{"registry url without value", []string{"x.yaml", "--registry-url"}},
		{"inspect bad port", []string{"--inspect=70000", "x.yaml"}},
		{"inspect bad ipv6", []string{"--inspect=[nope]:1", "x.yaml"}},
		{"inspect empty host", []string{"--inspect=:1", "x.yaml"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseArgs(tt.args)
			if !errors.Is(err, ErrUsage) {
				t.Errorf("ParseArgs(%q) = %+v, %v, want an ErrUsage error", tt.args, got, err)
			}
		})
	}
}

func TestPodAddr(t *testing.T) {
	for _, c := range []struct{ addr, podIP, want string }{
		{"0.0.0.0:9230", "127.1.0.5", "127.1.0.5:9230"},
		{":9231", "127.1.0.5", "127.1.0.5:9231"},
		{"[::]:9230", "127.1.0.5", "127.1.0.5:9230"},
		{"127.0.0.1:9230", "127.1.0.5", "127.0.0.1:9230"},
		{"example.test:9230", "127.1.0.5", "example.test:9230"},
		{"0.0.0.0:9230", "", "0.0.0.0:9230"},
		{"garbage", "127.1.0.5", "garbage"},
		{"0.0.0.0:9230", "fd00::5", "[fd00::5]:9230"},
	} {
		if got := PodAddr(c.addr, c.podIP); got != c.want {
			t.Errorf("PodAddr(%q, %q) = %q, want %q", c.addr, c.podIP, got, c.want)
		}
	}
}
