package driver

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
)

func TestParsePortsResolved(t *testing.T) {
	tests := []struct {
		payload string
		ok      bool
		want    string
	}{
		{`{"ports":[{"name":"http","port":3000,"protocol":"tcp"}]}`, true, "[tcp/3000]"},
		{`{"ports":[{"port":53,"protocol":"udp"},{"port":54,"protocol":"UDP"},{"port":55}]}`, true, "[udp/53 tcp/54 tcp/55]"},
		{`{"ports":[{"port":"3000"},{"port":3.5},{"port":0},{"port":70000},{"port":8080}]}`, true, "[tcp/8080]"},
		{`{"ports":[{"port":1},{"port":1}]}`, true, "[tcp/1]"},
		{`{"ports":[]}`, true, "[]"},
		{`{"ports":"3000"}`, false, ""},
		{`{"ports":{"a":1}}`, false, ""},
		{`{}`, false, ""},
		{`nope`, false, ""},
	}
	for _, tt := range tests {
		got, ok := parsePortsResolved(json.RawMessage(tt.payload))
		var keys []string
		for _, p := range got {
			keys = append(keys, p.Key())
		}
		g := fmt.Sprint(keys)
		if len(keys) == 0 {
			g = "[]"
		}
		if ok != tt.ok || (ok && g != tt.want) {
			t.Errorf("parsePortsResolved(%s) = %s, %v; want %s, %v", tt.payload, g, ok, tt.want, tt.ok)
		}
	}
}

func TestDiffPorts(t *testing.T) {
	tcp := func(n int) contract.PortMapping { return contract.PortMapping{Port: n, Protocol: "tcp"} }
	udp := func(n int) contract.PortMapping { return contract.PortMapping{Port: n, Protocol: "udp"} }
	rec := func() *session.Record {
		return &session.Record{
			Mode: contract.ModeWatch,
			Apps: []session.App{
				{Name: "web", Ports: []contract.PortMapping{tcp(3000)}},
				{Name: "worker", Ports: []contract.PortMapping{tcp(4000)}},
			},
			Launch: session.Launch{AgentSpec: &session.AgentSpec{Name: "agent", Port: 8080}},
		}
	}
	tests := []struct {
		name     string
		declared []contract.PortMapping
		want     string
	}{
		{"unchanged", []contract.PortMapping{tcp(3000)}, "ports=[tcp/3000] added=[] removed=[] rejected=[]"},
		{"added", []contract.PortMapping{tcp(3000), tcp(3001)}, "ports=[tcp/3000 tcp/3001] added=[tcp/3001] removed=[] rejected=[]"},
		{"removed", []contract.PortMapping{}, "ports=[] added=[] removed=[tcp/3000] rejected=[]"},
		{"taken by other app", []contract.PortMapping{tcp(3000), tcp(4000)}, "ports=[tcp/3000] added=[] removed=[] rejected=[4000:another app in this session already declares tcp port 4000]"},
		{"udp twin of other app's tcp is fine", []contract.PortMapping{tcp(3000), udp(4000)}, "ports=[tcp/3000 udp/4000] added=[udp/4000] removed=[] rejected=[]"},
		{"agent port", []contract.PortMapping{tcp(8080)}, "ports=[] added=[] removed=[tcp/3000] rejected=[8080:the co-resident agent uses tcp port 8080]"},
		{"workspace port", []contract.PortMapping{tcp(3000), tcp(8099)}, "ports=[tcp/3000] added=[] removed=[] rejected=[8099:port 8099 is reserved for the workspace server]"},
		{"inspect ports of both apps, not a third", []contract.PortMapping{tcp(9230), udp(9231), tcp(9232)}, "ports=[tcp/9232] added=[tcp/9232] removed=[tcp/3000] rejected=[9230:port 9230 is reserved for an inspect port (app 0) 9231:port 9231 is reserved for an inspect port (app 1)]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, ok := diffPorts(rec(), "web", tt.declared)
			if !ok {
				t.Fatal("diffPorts() not ok")
			}
			keys := func(ps []contract.PortMapping) []string {
				out := []string{}
				for _, p := range ps {
					out = append(out, p.Key())
				}
				return out
			}
			rej := []string{}
			for _, r := range c.rejected {
				rej = append(rej, fmt.Sprintf("%d:%s", r.Port, r.Reason))
			}
			got := fmt.Sprintf("ports=%v added=%v removed=%v rejected=%v", keys(c.ports), keys(c.added), keys(c.removed), rej)
			if got != tt.want {
				t.Errorf("diffPorts() = %s, want %s", got, tt.want)
			}
		})
	}
}
