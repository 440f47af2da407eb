package server

import (
	"bufio"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/gin-gonic/gin"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
)

// Large workspaces cross the bus in pages: a NATS message is bounded (1 MB
// by default), so the edge reads a file range by range, lists a tree page
// by page and forwards a change set in pieces, each request and reply well
// under the bound, and streams what it reads to the client. It holds one
// page at a time, whatever the size of the file or tree.

// maxPageBytes is the most raw file bytes one page carries (raw after a
// small JSON envelope: contract.AppendFrame).
const maxPageBytes = 512 << 10

// pageOverhead is room left in a bus message besides a page's data.
const pageOverhead = 8 << 10

// pageBytes is the raw byte size of one page on this connection's bus.
func (s *Server) pageBytes() int {
	fit := int(s.nc.MaxPayload() - pageOverhead)
	return max(min(maxPageBytes, fit), 1<<10)
}

// treePageBytes is the JSON budget of one tree page.
func (s *Server) treePageBytes() int {
	return max(min(maxPageBytes/2, int(s.nc.MaxPayload()-pageOverhead)/2), 1<<10)
}

// abortStream ends a response whose 200 head is already sent but whose
// body cannot be completed: the connection is closed without the body's
// end, so the client sees a failed transfer, never a well-formed body that
// is wrong. gin's recovery swallows http.ErrAbortHandler and gin refuses
// to hijack once a body byte is written, so the connection is hijacked
// from the server's own writer and closed.
func abortStream(c *gin.Context, bw *bufio.Writer) {
	_ = bw.Flush() // What is buffered is sent; the end is what is missing.
	var w http.ResponseWriter = c.Writer
	if u, ok := w.(interface{ Unwrap() http.ResponseWriter }); ok {
		w = u.Unwrap()
	}
	if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
		_ = conn.Close() // Closing is the message.
		return
	}
	panic(http.ErrAbortHandler)
}

// streamTree answers GET …/workspace (4.8) page by page. An error on the
// first page is answered as usual; one after the head went out aborts the
// response.
func (s *Server) streamTree(c *gin.Context, id string) {
	ctx := c.Request.Context()
	req := contract.WSTreePage{Bytes: s.treePageBytes()}
	var page contract.TreePage
	if err := s.wsCall(ctx, id, bus.WSTreePage, req, &page); err != nil {
		s.fail(c, err)
		return
	}
	c.Header("Content-Type", "application/json; charset=utf-8")
	c.Status(http.StatusOK)
	bw := bufio.NewWriterSize(c.Writer, 32<<10)
	_, _ = bw.WriteString(`{"files":[`)
	first := true
	for {
		for _, f := range page.Files {
			if !first {
				_ = bw.WriteByte(',')
			}
			first = false
			b, _ := json.Marshal(f) // Two strings: cannot fail.
			_, _ = bw.Write(b)
		}
		if !page.More {
			break
		}
		if len(page.Files) == 0 {
			s.log.Warn("workspace tree page empty but not last", "session", id)
			abortStream(c, bw)
			return
		}
		req.After = page.Files[len(page.Files)-1].Path
		page = contract.TreePage{}
		if err := s.wsCall(ctx, id, bus.WSTreePage, req, &page); err != nil {
			s.log.Warn("workspace tree stream cut", "session", id, "err", err)
			abortStream(c, bw)
			return
		}
	}
	_, _ = bw.WriteString("]}")
	_ = bw.Flush() // The client went away; nothing left to tell it.
}

// readRange reads one range of a file through runner-ws.
func (s *Server) readRange(c *gin.Context, id string, r contract.WSReadRange) (contract.FileRange, error) {
	var fr contract.FileRange
	body, _ := json.Marshal(r) // Strings and numbers: cannot fail.
	data, err := s.wsExchange(c.Request.Context(), id, bus.WSReadRange, body, &fr)
	fr.Data = data
	return fr, err
}

func isCode(err error, code string) bool {
	var ce *contract.Error
	return errors.As(err, &ce) && ce.Code == code
}

// streamFile answers GET …/workspace/file (4.10) range by range:
// {"content": <utf8 text or base64>, "size": <bytes>}, byte for byte what
// encoding the whole file at once gives. Every range must carry the stamp
// of the first: a file that changed under the read (4.10 allows no mixed
// content) fails the first range with 409 file_changed after one restart,
// and aborts the response when it changes once the head is out.
func (s *Server) streamFile(c *gin.Context, id, path, encoding string) {
	page := s.pageBytes()
	req := contract.WSReadRange{Path: path, Length: page}
	first, err := s.readRange(c, id, req)
	if isCode(err, "file_changed") {
		first, err = s.readRange(c, id, req)
	}
	if err != nil {
		if isCode(err, "file_changed") {
			err = contract.Errorf("file_changed", "file '%s' kept changing while it was read; read it again", path)
		}
		s.fail(c, err)
		return
	}
	c.Header("Content-Type", "application/json; charset=utf-8")
	c.Status(http.StatusOK)
	bw := bufio.NewWriterSize(c.Writer, 64<<10)
	_, _ = bw.WriteString(`{"content":"`)
	var enc contentWriter = &textWriter{w: bw}
	if encoding == "base64" {
		enc = &b64Writer{enc: base64.NewEncoder(base64.StdEncoding, bw)}
	}
	_ = enc.write(first.Data)
	offset := int64(len(first.Data))
	for offset < first.Size {
		req.Offset = offset
		next, err := s.readRange(c, id, req)
		switch {
		case err != nil:
			s.log.Warn("workspace file stream cut", "session", id, "path", path, "err", err)
		case next.Stamp != first.Stamp || next.Size != first.Size || len(next.Data) == 0:
			s.log.Info("workspace file changed during a read: response cut", "session", id, "path", path)
		default:
			_ = enc.write(next.Data)
			offset += int64(len(next.Data))
			continue
		}
		abortStream(c, bw)
		return
	}
	_ = enc.close()
	_, _ = bw.WriteString(`","size":` + strconv.FormatInt(first.Size, 10) + "}")
	_ = bw.Flush() // The client went away; nothing left to tell it.
}

// contentWriter writes a file's bytes as the inside of a JSON string.
type contentWriter interface {
	write(p []byte) error
	close() error
}

// b64Writer is base64 (standard, padded) across pages.
type b64Writer struct{ enc io.WriteCloser }

func (b *b64Writer) write(p []byte) error { _, err := b.enc.Write(p); return err }
func (b *b64Writer) close() error         { return b.enc.Close() }

// textWriter escapes bytes as encoding/json escapes a Go string made of
// them (invalid UTF-8 becomes U+FFFD, HTML characters are escaped), with
// a rune split across pages carried to the next.
type textWriter struct {
	w     *bufio.Writer
	carry []byte
}

func (t *textWriter) write(p []byte) error {
	buf := append(t.carry, p...)
	cut := len(buf)
	for k := len(buf) - 1; k >= 0 && k >= len(buf)-utf8.UTFMax+1; k-- {
		if utf8.RuneStart(buf[k]) {
			if !utf8.FullRune(buf[k:]) {
				cut = k
			}
			break
		}
	}
	t.carry = append([]byte(nil), buf[cut:]...)
	return t.emit(buf[:cut])
}

func (t *textWriter) close() error {
	err := t.emit(t.carry)
	t.carry = nil
	return err
}

func (t *textWriter) emit(p []byte) error {
	if len(p) == 0 {
		return nil
	}
	b, err := json.Marshal(string(p))
	if err != nil {
		return err
	}
	_, err = t.w.Write(b[1 : len(b)-1])
	return err
}

// readWorkspaceBody reads POST …/workspace's body under the workspace
// limit. A declared length over it is refused before any byte is read.
func (s *Server) readWorkspaceBody(c *gin.Context) ([]byte, bool) {
	limit := s.cfg.WorkspaceBodyBytes
	tooLarge := func() ([]byte, bool) {
		c.Header("Connection", "close") // the rest of the body is not read
		c.JSON(http.StatusRequestEntityTooLarge, contract.Errorf("payload_too_large",
			"request body is larger than %d bytes (RUNNER_WORKSPACE_MAX_BODY_BYTES)", limit))
		return nil, false
	}
	if c.Request.ContentLength > limit {
		return tooLarge()
	}
	data, err := io.ReadAll(http.MaxBytesReader(c.Writer, c.Request.Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return tooLarge()
		}
		c.JSON(http.StatusBadRequest, contract.Errorf("invalid_request", "read body: %v", err))
		return nil, false
	}
	return data, true
}

// checkContents refuses base64 contents that do not decode, before
// anything of the change set is forwarded.
func checkContents(cs contract.ChangeSet) error {
	for i, w := range cs.Write {
		if w.Encoding != "base64" {
			continue
		}
		if _, err := io.Copy(io.Discard, base64.NewDecoder(base64.StdEncoding, strings.NewReader(w.Content))); err != nil {
			return contract.Errorf("invalid_request", "body/write/%d/content is not base64: %v", i, err)
		}
	}
	return nil
}

// forwardChangeSet applies cs through runner-ws in pieces: writes and
// deletes go in order in batches of about one page; a write too large for
// a batch is first staged in chunks (contract.WSStage) and then named by
// its batch, so it lands whole. As for one change set (9.2), a failure
// part-way leaves earlier batches applied.
func (s *Server) forwardChangeSet(c *gin.Context, id string, cs contract.ChangeSet) error {
	ctx := c.Request.Context()
	page := s.pageBytes()
	var batch contract.ChangeSet
	used := 0
	flush := func() error {
		if len(batch.Write) == 0 && len(batch.Delete) == 0 {
			return nil
		}
		err := s.wsCall(ctx, id, bus.WSApply, batch, nil)
		batch, used = contract.ChangeSet{}, 0
		return err
	}
	for _, w := range cs.Write {
		cost := jsonStringSize(w.Path) + jsonStringSize(w.Content) + 64
		if cost > page {
			staged, err := s.stage(c, id, w)
			if err != nil {
				return err
			}
			w = contract.WriteOp{Path: w.Path, Staged: staged}
			cost = jsonStringSize(w.Path) + 128
		}
		if used+cost > page {
			if err := flush(); err != nil {
				return err
			}
		}
		batch.Write = append(batch.Write, w)
		used += cost
	}
	for _, d := range cs.Delete {
		cost := jsonStringSize(d) + 4
		if used+cost > page {
			if err := flush(); err != nil {
				return err
			}
		}
		batch.Delete = append(batch.Delete, d)
		used += cost
	}
	return flush()
}

// stage sends w's bytes in chunks of one page to a new upload and returns
// its id; on failure the upload is dropped.
func (s *Server) stage(c *gin.Context, id string, w contract.WriteOp) (string, error) {
	ctx := c.Request.Context()
	var rnd [16]byte
	_, _ = rand.Read(rnd[:]) // crypto/rand.Read never fails.
	upload := hex.EncodeToString(rnd[:])
	var src io.Reader = strings.NewReader(w.Content)
	if w.Encoding == "base64" {
		src = base64.NewDecoder(base64.StdEncoding, src)
	}
	buf := make([]byte, s.pageBytes())
	var offset int64
	for {
		n, err := io.ReadFull(src, buf)
		if n > 0 || offset == 0 {
			frame, _ := contract.AppendFrame(contract.WSStage{Upload: upload, Path: w.Path, Offset: offset}, buf[:n])
			if _, serr := s.wsExchange(ctx, id, bus.WSStage, frame, nil); serr != nil {
				s.discard(c, id, upload)
				return "", serr
			}
			offset += int64(n)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return upload, nil
		}
		if err != nil {
			s.discard(c, id, upload)
			return "", contract.Errorf("invalid_request", "write %s: %v", w.Path, err)
		}
	}
}

// discard drops an upload, best effort: the workspace server also drops
// uploads left idle.
func (s *Server) discard(c *gin.Context, id, upload string) {
	if err := s.wsCall(c.Request.Context(), id, bus.WSStage, contract.WSStage{Upload: upload, Discard: true}, nil); err != nil {
		s.log.Warn("discard staged upload", "session", id, "err", err)
	}
}

// jsonStringSize bounds the JSON size of s as a string (every byte that
// may need escaping counted as \u00XX).
func jsonStringSize(s string) int {
	n := 2
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' || c >= 0x80 {
			n += 6
		} else {
			n++
		}
	}
	return n
}
