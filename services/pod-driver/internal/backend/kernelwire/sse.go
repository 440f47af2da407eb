package kernelwire

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"time"
	"unicode"
)

// maxFrameBytes bounds one debug frame (and one line of the stream). A
// larger block is skipped whole, the same way on every connection.
const maxFrameBytes = 16 << 20

// sseReader parses the kernel's /events stream exactly as contract 10.4
// says: blocks are separated by blank lines; in a block every line that
// starts with "data:" contributes its remainder with all leading whitespace
// stripped; the contributions are joined with "\n" and JSON-parsed. Comment
// and other lines, empty blocks, oversized blocks and anything that is not a
// JSON object are ignored; stray blank lines are harmless. A block cut off
// by the end of the stream is discarded.
type sseReader struct {
	r     *bufio.Reader
	line  []byte // current line when it spans several buffer fills
	data  []byte // joined data lines of the current block
	lines int    // data lines in the current block
	over  bool   // the current block passed maxFrameBytes
}

func newSSEReader(r io.Reader) *sseReader {
	return &sseReader{r: bufio.NewReaderSize(r, 64<<10)}
}

// next returns the next frame, freshly allocated (the caller may keep
// it), and its timestamp (zero when absent or unparseable). At the end of
// the stream it returns the reader's error (io.EOF on a clean end).
func (s *sseReader) next() (json.RawMessage, time.Time, error) {
	for {
		line, tooLong, err := s.readLine()
		if err != nil {
			return nil, time.Time{}, err
		}
		if tooLong {
			s.over = true
			continue
		}
		if len(line) == 0 {
			if frame, ts, ok := s.endBlock(); ok {
				return frame, ts, nil
			}
			continue
		}
		rest, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok || s.over {
			continue
		}
		rest = bytes.TrimLeftFunc(rest, unicode.IsSpace)
		if len(s.data)+1+len(rest) > maxFrameBytes {
			s.over = true
			continue
		}
		if s.lines > 0 {
			s.data = append(s.data, '\n')
		}
		s.data = append(s.data, rest...)
		s.lines++
	}
}

// readLine returns the next line without its "\n" (and a "\r" before it).
// The slice is valid until the next call. A line longer than maxFrameBytes
// is consumed and reported as tooLong.
func (s *sseReader) readLine() (line []byte, tooLong bool, err error) {
	s.line = s.line[:0]
	for {
		chunk, err := s.r.ReadSlice('\n')
		switch {
		case err == nil:
			if len(s.line) > 0 || tooLong {
				if tooLong || len(s.line)+len(chunk) > maxFrameBytes {
					return nil, true, nil
				}
				chunk = append(s.line, chunk...)
			}
			chunk = bytes.TrimSuffix(chunk[:len(chunk)-1], []byte("\r"))
			return chunk, false, nil
		case errors.Is(err, bufio.ErrBufferFull):
			if !tooLong && len(s.line)+len(chunk) > maxFrameBytes {
				tooLong, s.line = true, s.line[:0]
			}
			if !tooLong {
				s.line = append(s.line, chunk...)
			}
		default:
			return nil, false, err
		}
	}
}

// endBlock finishes the current block and reports whether it was a frame.
func (s *sseReader) endBlock() (json.RawMessage, time.Time, bool) {
	data, lines, over := s.data, s.lines, s.over
	s.data, s.lines, s.over = nil, 0, false
	if over || lines == 0 {
		s.data = data[:0] // nothing escaped: reuse
		return nil, time.Time{}, false
	}
	trimmed := bytes.TrimLeftFunc(data, unicode.IsSpace)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		s.data = data[:0]
		return nil, time.Time{}, false
	}
	var head struct {
		Timestamp json.RawMessage `json:"timestamp"`
	}
	if json.Unmarshal(data, &head) != nil {
		s.data = data[:0]
		return nil, time.Time{}, false
	}
	return json.RawMessage(data), frameTime(head.Timestamp), true
}

// frameTime parses a frame's ISO-8601 timestamp; zero when it is not one.
func frameTime(raw json.RawMessage) time.Time {
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}
	}
	return t
}
