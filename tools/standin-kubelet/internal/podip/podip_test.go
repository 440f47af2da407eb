package podip

import (
	"errors"
	"net/netip"
	"testing"
)

func TestParseBase(t *testing.T) {
	tests := []struct {
		in   string
		want byte
		ok   bool
	}{
		{"127.0", 0, true},
		{"127.42", 42, true},
		{"127.255", 255, true},
		{"127.256", 0, false},
		{"10.1", 0, false},
		{"127.", 0, false},
		{"127.1.2", 0, false},
	}
	for _, tt := range tests {
		got, err := ParseBase(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ParseBase(%q) = %d, %v, want %d (ok=%v)", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

func TestPool(t *testing.T) {
	p := New(7)
	first, err := p.Allocate()
	if err != nil {
		t.Fatal(err)
	}
	if want := netip.MustParseAddr("127.7.0.2"); first != want {
		t.Errorf("first Allocate() = %v, want %v", first, want)
	}
	seen := map[netip.Addr]bool{first: true}
	for range perBlock + 5 {
		ip, err := p.Allocate()
		if err != nil {
			t.Fatal(err)
		}
		if seen[ip] {
			t.Fatalf("Allocate() = %v twice", ip)
		}
		b := ip.As4()
		if b[0] != 127 || b[1] != 7 || b[3] < 2 || b[3] > 254 {
			t.Fatalf("Allocate() = %v, want 127.7.x.[2-254]", ip)
		}
		seen[ip] = true
	}
	p.Release(first)
	next, _ := p.Allocate()
	if next == first {
		t.Errorf("Allocate() reused %v right after release, want the next free one", first)
	}
}

func TestPoolExhausted(t *testing.T) {
	p := New(1)
	var last netip.Addr
	for range size {
		ip, err := p.Allocate()
		if err != nil {
			t.Fatalf("Allocate() error = %v before the pool was full", err)
		}
		last = ip
	}
	if _, err := p.Allocate(); !errors.Is(err, ErrExhausted) {
		t.Fatalf("Allocate() on a full pool error = %v, want %v", err, ErrExhausted)
	}
	p.Release(last)
	if ip, err := p.Allocate(); err != nil || ip != last {
		t.Errorf("Allocate() after Release(%v) = %v, %v, want it back", last, ip, err)
	}
}
