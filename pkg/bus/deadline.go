package bus

import (
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
)

// SetDeadline marks a request with the time after which its sender stops
// waiting (HeaderDeadline). Sender and receiver compare wall clocks, so
// the sender waits a margin longer than the deadline it sets.
func SetDeadline(h nats.Header, deadline time.Time) {
	h.Set(HeaderDeadline, strconv.FormatInt(deadline.UnixMilli(), 10))
}

// Expired reports whether a request whose headers are h is past the
// deadline its sender set at now. A request without a readable deadline
// never expires.
func Expired(h interface{ Get(string) string }, now time.Time) bool {
	ms, err := strconv.ParseInt(h.Get(HeaderDeadline), 10, 64)
	if err != nil {
		return false
	}
	return now.After(time.UnixMilli(ms))
}
