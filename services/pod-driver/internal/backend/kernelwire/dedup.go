package kernelwire

import (
	"bytes"
	"slices"
	"time"
)

// dedup remembers what the relay delivered from one kernel process's
// inspection server, so a reconnect — which replays the kernel's buffer of
// up to 5,000 frames, oldest first (contract 10.3) — delivers nothing twice
// (contract 19 item 14). It is used by one relay goroutine only.
//
// While the kernel's buffer has not rolled over, a new connection starts
// with the very first frame ever delivered, and the first `delivered`
// frames of the connection are exactly the frames already delivered: they
// are skipped by count. Once it has rolled over the replay is shorter than
// the count; then frames older than the newest delivered timestamp are
// skipped, and of the frames carrying exactly that timestamp as many as
// were delivered (timestamp plus position).
type dedup struct {
	delivered int       // frames delivered from this inspection server
	first     []byte    // the first of them
	maxTS     time.Time // newest timestamp delivered
	atMax     int       // frames delivered with timestamp maxTS
}

// connFilter decides, frame by frame, what one connection delivers.
type connFilter struct {
	d     *dedup
	mode  filterMode
	skip  int // skipCount: frames of the replay still to skip
	equal int // skipTime: frames seen with timestamp maxTS
}

type filterMode int

const (
	modeFirst     filterMode = iota // no frame seen on this connection yet
	modeSkipCount                   // replay of an unrolled buffer
	modeSkipTime                    // replay of a rolled-over buffer
	modeDeliver                     // past the replay: everything is new
)

// begin starts filtering a new connection.
func (d *dedup) begin() *connFilter { return &connFilter{d: d} }

// admit reports whether frame is new and, if so, records it as delivered.
func (c *connFilter) admit(frame []byte, ts time.Time) bool {
	d := c.d
	if c.mode == modeFirst {
		switch {
		case d.delivered == 0:
			c.mode = modeDeliver
		case bytes.Equal(frame, d.first):
			c.mode, c.skip = modeSkipCount, d.delivered
		default:
			c.mode = modeSkipTime
		}
	}
	switch c.mode {
	case modeSkipCount:
		// A timestamp newer than anything delivered cannot be a replay.
		if c.skip > 0 && !ts.After(d.maxTS) {
			c.skip--
			return false
		}
		c.mode = modeDeliver
	case modeSkipTime:
		if ts.Before(d.maxTS) {
			return false
		}
		if ts.Equal(d.maxTS) {
			c.equal++
			if c.equal <= d.atMax {
				return false
			}
		}
		c.mode = modeDeliver
	}
	d.record(frame, ts)
	return true
}

func (d *dedup) record(frame []byte, ts time.Time) {
	if d.delivered == 0 {
		d.first = slices.Clone(frame)
	}
	d.delivered++
	switch {
	case ts.After(d.maxTS):
		d.maxTS, d.atMax = ts, 1
	case ts.Equal(d.maxTS):
		d.atMax++
	}
}
