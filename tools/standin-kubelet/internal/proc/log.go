package proc

import "sync"

// LogBytes is how much output a process keeps for pods/log.
const LogBytes = 1 << 20

// logRing keeps the last LogBytes written to it. Safe for concurrent use.
type logRing struct {
	mu  sync.Mutex
	buf []byte
}

func (l *logRing) write(b []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, b...)
	if over := len(l.buf) - LogBytes; over > 0 {
		l.buf = append(l.buf[:0], l.buf[over:]...)
	}
}

func (l *logRing) bytes() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]byte(nil), l.buf...)
}
