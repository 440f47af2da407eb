// Package podip hands out loopback pod IPs 127.A.x.y from one /16.
//
// Linux routes all of 127.0.0.0/8 to the loopback interface, so every
// address in the block can be bound without configuring anything. Each pod
// gets its own address; programs that bind it (not 0.0.0.0) never collide
// with another pod's ports.
package podip

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync"
)

// Pool allocates addresses 127.A.x.y with y in 2..254. It is safe for
// concurrent use.
type Pool struct {
	a byte

	mu    sync.Mutex
	next  int // index of the next candidate
	inUse map[netip.Addr]bool
}

const perBlock = 253 // y = 2..254

// size is the number of addresses in a pool: x = 0..255.
const size = 256 * perBlock

// ErrExhausted is returned when every address of the pool is in use.
var ErrExhausted = errors.New("pod IP pool exhausted")

// ParseBase parses "127.A" (A in 0..255).
func ParseBase(base string) (byte, error) {
	rest, ok := strings.CutPrefix(base, "127.")
	if !ok {
		return 0, fmt.Errorf("pod IP base %q: want 127.A", base)
	}
	a, err := strconv.ParseUint(rest, 10, 8)
	if err != nil {
		return 0, fmt.Errorf("pod IP base %q: want 127.A with A in 0..255", base)
	}
	return byte(a), nil
}

// New returns a pool for 127.a.0.0/16.
func New(a byte) *Pool {
	return &Pool{a: a, inUse: map[netip.Addr]bool{}}
}

// Allocate returns an unused address. Addresses are handed out in order and
// wrap around, so a released address is reused as late as possible.
func (p *Pool) Allocate() (netip.Addr, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for range size {
		i := p.next
		p.next = (p.next + 1) % size
		ip := netip.AddrFrom4([4]byte{127, p.a, byte(i / perBlock), byte(2 + i%perBlock)})
		if !p.inUse[ip] {
			p.inUse[ip] = true
			return ip, nil
		}
	}
	return netip.Addr{}, ErrExhausted
}

// Release returns ip to the pool. Releasing an unknown address is a no-op.
func (p *Pool) Release(ip netip.Addr) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.inUse, ip)
}
