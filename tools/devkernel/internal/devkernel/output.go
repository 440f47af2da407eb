package devkernel

import (
	"context"
	"io"
	"sync"
)

// lockedWriter serialises whole writes to one stream so lines from the stdin
// echo and the kernel never interleave mid-line. Writes go straight to the
// underlying writer: no buffering.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// patternLine is the repeating outputBytes pattern: 63 printable characters
// and a newline, so a newline falls every 64 bytes.
var patternLine = func() []byte {
	const chars = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-"
	return []byte(chars + "\n")
}()

// writePattern writes exactly n bytes of the pattern to w in chunks, stopping
// early when ctx ends or a write fails.
func writePattern(ctx context.Context, w io.Writer, n int64) error {
	const chunkLines = 512
	chunk := make([]byte, 0, chunkLines*len(patternLine))
	for range chunkLines {
		chunk = append(chunk, patternLine...)
	}
	for n > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		c := chunk
		if int64(len(c)) > n {
			c = c[:n]
		}
		if _, err := w.Write(c); err != nil {
			return err
		}
		n -= int64(len(c))
	}
	return nil
}
