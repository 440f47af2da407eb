// Package wsapi is the wire of the in-pod workspace server (contract 9.2,
// 9.4) in one place: its shapes (aliases of the contract's workspace
// types), the workspace marker, and the one runner-side client: typed calls
// with a 30 s per-request timeout, every non-2xx answer returned as an
// *Error carrying the server's error code. workspace-proxy (runner-ws) and
// the pod-driver (seeding, readiness) both use it.
package wsapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/telorunner/telorunner/pkg/contract"
)

// Timeout bounds each request, body included (contract 9.4).
const Timeout = 30 * time.Second

// Content encodings of WriteOp.Encoding and Read.
const (
	EncodingUTF8   = "utf8"
	EncodingBase64 = "base64"
)

// Error codes the workspace server answers with.
const (
	CodeInvalidPath    = "invalid_path"
	CodeInvalidRequest = "invalid_request"
	CodeFileNotFound   = "file_not_found"
	CodeFrozen         = "workspace_frozen" // a write to a frozen workspace (Freeze)
	CodeTooLarge       = "payload_too_large"
	CodeUnsafePath     = "unsafe_path"
	CodeWriteFailed    = "write_failed"
	CodeDeleteFailed   = "delete_failed"
	CodeReadFailed     = "read_failed"
	CodeWalkFailed     = "walk_failed"
	CodeInternal       = "internal"
)

// The workspace server's routes (contract 9.2 and the runner's own).
const (
	RouteHealth   = "/healthz"
	RouteTree     = "/workspace"          // GET: Tree; POST: apply a ChangeSet
	RouteFile     = "/workspace/file"     // GET ?path=&encoding=: File
	RouteSnapshot = "/workspace/snapshot" // GET: every file, base64
	RouteBlob     = "/workspace/blob/"    // + hash: GET a file's bytes by hash
	RouteNode     = "/workspace/node"     // GET: the root tree node; + "/" + hash: a recent walk's node
	RouteTouch    = "/workspace/touch"    // POST {"paths"}: rewrite with the same bytes
	RouteFreeze   = "/workspace/freeze"   // POST {"frozen"}
	RouteTreePage = "/workspace/treepage" // GET ?after=&limit=&bytes=: TreePage
	RouteRange    = "/workspace/range"    // GET ?path=&offset=&length=: bytes, HeaderSize, HeaderStamp
	RouteStage    = "/workspace/stage"    // POST ?upload=&path=&offset=: raw bytes; DELETE ?upload=
)

// Headers of a range answer (RouteRange).
const (
	HeaderSize  = "Workspace-Size"  // the whole file's size in bytes
	HeaderStamp = "Workspace-Stamp" // the file's version
)

// maxErrorBody is how much of a failure body an Error keeps, in characters.
const maxErrorBody = 500

// The workspace server's shapes are the contract's (section 3.10).
type (
	Tree        = contract.Tree
	TreeFile    = contract.TreeFile
	ChangeSet   = contract.ChangeSet
	WriteOp     = contract.WriteOp
	ApplyResult = contract.ApplyResult
	File        = contract.File
	TreePage    = contract.TreePage
)

// MarkerPath is the workspace marker seeded at the root (contract 9.7).
const MarkerPath = "telo-workspace.yaml"

// MarkerContent anchors the kernels' shared module cache: a comment
// block, then the non-empty modules list the workspace parser requires.
const MarkerContent = `# Workspace marker, seeded by telorunner when this watch session started.
# The Telo kernel anchors its module cache (.telo) at the nearest directory
# above an entry that holds this file, so every app of the session shares
# one cache here and a module is downloaded once per session.
# The modules list is read only by "telo release"; it must not be empty.
modules: ["*"]
`

// SnapshotFile is one file of a snapshot; Content is always base64
// (contract 3.10 CheckpointFile).
type SnapshotFile struct {
	Path     string `json:"path"`
	Hash     string `json:"hash"`
	Content  string `json:"content"`
	Encoding string `json:"encoding"`
}

// Error is a non-2xx answer from the workspace server.
type Error struct {
	Method string
	Path   string // Request path and query.
	Status int
	// Code is the body's "error" field ("file_not_found", ...), or "" when
	// the body is not a JSON error.
	Code    string
	Message string // The body's "message" field.
	Body    string // Up to 500 characters of the raw body.
}

func (e *Error) Error() string {
	if e.Code != "" {
		return fmt.Sprintf("workspace %s %s: status %d: %s: %s", e.Method, e.Path, e.Status, e.Code, e.Message)
	}
	return fmt.Sprintf("workspace %s %s: status %d: %s", e.Method, e.Path, e.Status, e.Body)
}

// IsNotFound reports whether err is the server's file_not_found answer.
func IsNotFound(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == CodeFileNotFound
}

// Client calls one workspace server. It is safe for concurrent use.
type Client struct {
	base    string
	hc      *http.Client
	timeout time.Duration
}

// New returns a client for baseURL (e.g. "http://10.0.0.7:8099"). A nil
// httpClient means http.DefaultClient.
func New(baseURL string, httpClient *http.Client) *Client {
	if httpClient == nil {
		httpClient = http.DefaultClient
	}
	return &Client{base: strings.TrimRight(baseURL, "/"), hc: httpClient, timeout: Timeout}
}

// Health returns nil when GET /healthz answers 2xx.
func (c *Client) Health(ctx context.Context) error {
	_, err := c.do(ctx, http.MethodGet, RouteHealth, nil, nil)
	return err
}

// Tree lists every regular file of the workspace with its hash.
func (c *Client) Tree(ctx context.Context) (Tree, error) {
	var t Tree
	err := c.doJSON(ctx, http.MethodGet, RouteTree, nil, nil, &t)
	return t, err
}

// Apply writes then deletes; the counts are the list lengths. A failure
// part-way leaves earlier operations applied.
func (c *Client) Apply(ctx context.Context, cs ChangeSet) (ApplyResult, error) {
	var r ApplyResult
	err := c.doJSON(ctx, http.MethodPost, RouteTree, nil, cs, &r)
	return r, err
}

// ApplyEncoded is Apply with the change set already encoded as JSON (a
// seed writes large contents into the body without a second copy).
func (c *Client) ApplyEncoded(ctx context.Context, body []byte) (ApplyResult, error) {
	var r ApplyResult
	_, data, err := c.doRaw(ctx, http.MethodPost, RouteTree, nil, body, "application/json")
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return r, fmt.Errorf("workspace POST /workspace: decode answer: %w", err)
	}
	return r, nil
}

// Read returns one file; encoding is "" (utf8), EncodingUTF8 or
// EncodingBase64.
func (c *Client) Read(ctx context.Context, path, encoding string) (File, error) {
	q := url.Values{"path": {path}}
	if encoding != "" {
		q.Set("encoding", encoding)
	}
	var f File
	err := c.doJSON(ctx, http.MethodGet, RouteFile, q, nil, &f)
	return f, err
}

// Snapshot returns every listed file with its bytes in base64.
func (c *Client) Snapshot(ctx context.Context) ([]SnapshotFile, error) {
	var s struct {
		Files []SnapshotFile `json:"files"`
	}
	err := c.doJSON(ctx, http.MethodGet, RouteSnapshot, nil, nil, &s)
	return s.Files, err
}

// Blob returns the bytes of a workspace file whose SHA-256 is hash and
// checks them against it.
func (c *Client) Blob(ctx context.Context, hash string) ([]byte, error) {
	return c.getHashed(ctx, RouteBlob+url.PathEscape(hash), hash)
}

// getHashed GETs p, whose body must have the SHA-256 hash.
func (c *Client) getHashed(ctx context.Context, p, hash string) ([]byte, error) {
	data, err := c.do(ctx, http.MethodGet, p, nil, nil)
	if err != nil {
		return nil, err
	}
	if sum := sha256.Sum256(data); !strings.EqualFold(hex.EncodeToString(sum[:]), hash) {
		return nil, fmt.Errorf("workspace GET %s: content does not match its hash", p)
	}
	return data, nil
}

// Root walks the workspace and returns the canonical encoding of its
// root tree node (package merkle); its SHA-256 is the root's hash.
func (c *Client) Root(ctx context.Context) ([]byte, error) {
	return c.do(ctx, http.MethodGet, RouteNode, nil, nil)
}

// Node returns the encoding of the tree node hash of one of the server's
// recent walks (the last 8), checked against hash; a node no recent walk
// produced is a file_not_found Error.
func (c *Client) Node(ctx context.Context, hash string) ([]byte, error) {
	return c.getHashed(ctx, RouteNode+"/"+url.PathEscape(hash), hash)
}

// Touch rewrites each file with its own bytes so file watchers fire, and
// returns how many were touched.
func (c *Client) Touch(ctx context.Context, paths []string) (int, error) {
	var r struct {
		Touched int `json:"touched"`
	}
	err := c.doJSON(ctx, http.MethodPost, RouteTouch, nil, map[string][]string{"paths": paths}, &r)
	return r.Touched, err
}

// Freeze refuses every later write to the workspace (frozen true) once the
// writes in flight have finished, or accepts writes again (false).
func (c *Client) Freeze(ctx context.Context, frozen bool) error {
	var r struct {
		Frozen bool `json:"frozen"`
	}
	return c.doJSON(ctx, http.MethodPost, RouteFreeze, nil, map[string]bool{"frozen": frozen}, &r)
}

func (c *Client) doJSON(ctx context.Context, method, p string, q url.Values, in, out any) error {
	data, err := c.do(ctx, method, p, q, in)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("workspace %s %s: decode answer: %w", method, p, err)
	}
	return nil
}

// do sends one request (in as JSON when non-nil) and returns the body of
// a 2xx answer, or an *Error.
func (c *Client) do(ctx context.Context, method, p string, q url.Values, in any) ([]byte, error) {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return nil, fmt.Errorf("workspace %s %s: encode request: %w", method, p, err)
		}
	}
	_, data, err := c.doRaw(ctx, method, p, q, body, "application/json")
	return data, err
}

// newError reads a failure body (bounded) into an *Error.
func newError(method, target string, resp *http.Response) *Error {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10)) // The status alone still says enough.
	e := &Error{Method: method, Path: target, Status: resp.StatusCode, Body: truncate(string(raw), maxErrorBody)}
	var env struct {
		Error   string `json:"error"`
		Message string `json:"message"`
	}
	if json.Unmarshal(raw, &env) == nil {
		e.Code, e.Message = env.Error, env.Message
	}
	return e
}

// truncate keeps at most n characters of s.
func truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n])
}

// TreePage is one page of the tree: the files sorted after after, at most
// limit and about bytes of JSON (0: the server's defaults), and whether
// more follow.
func (c *Client) TreePage(ctx context.Context, after string, limit, bytes int) (TreePage, error) {
	q := url.Values{}
	if after != "" {
		q.Set("after", after)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if bytes > 0 {
		q.Set("bytes", strconv.Itoa(bytes))
	}
	var p TreePage
	err := c.doJSON(ctx, http.MethodGet, RouteTreePage, q, nil, &p)
	if p.Files == nil {
		p.Files = []TreeFile{}
	}
	return p, err
}

// Range is length bytes of a file from offset (fewer at its end) with
// the whole file's size and version stamp.
type Range struct {
	Data  []byte
	Size  int64
	Stamp string
}

// CodeFileChanged is the server's answer to a range read during which
// the file changed.
const CodeFileChanged = "file_changed"

// ReadRange reads length bytes of path from offset.
func (c *Client) ReadRange(ctx context.Context, path string, offset int64, length int) (Range, error) {
	q := url.Values{"path": {path}, "offset": {strconv.FormatInt(offset, 10)}, "length": {strconv.Itoa(length)}}
	var r Range
	hdr, data, err := c.doRaw(ctx, http.MethodGet, RouteRange, q, nil, "")
	if err != nil {
		return r, err
	}
	r.Data, r.Stamp = data, hdr.Get(HeaderStamp)
	r.Size, err = strconv.ParseInt(hdr.Get(HeaderSize), 10, 64)
	if err != nil || r.Stamp == "" {
		return r, fmt.Errorf("workspace GET /workspace/range: answer without size or stamp")
	}
	return r, nil
}

// Stage writes data at offset of upload id, the staged content of path,
// and returns the upload's size.
func (c *Client) Stage(ctx context.Context, id, path string, offset int64, data []byte) (int64, error) {
	q := url.Values{"upload": {id}, "path": {path}, "offset": {strconv.FormatInt(offset, 10)}}
	_, body, err := c.doRaw(ctx, http.MethodPost, RouteStage, q, data, "application/octet-stream")
	if err != nil {
		return 0, err
	}
	var r struct {
		Size int64 `json:"size"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return 0, fmt.Errorf("workspace POST /workspace/stage: decode answer: %w", err)
	}
	return r.Size, nil
}

// Discard drops upload id.
func (c *Client) Discard(ctx context.Context, id string) error {
	_, _, err := c.doRaw(ctx, http.MethodDelete, RouteStage, url.Values{"upload": {id}}, nil, "")
	return err
}

// doRaw sends one request with a raw body (nil: none) and returns the
// headers and body of a 2xx answer, or an *Error.
func (c *Client) doRaw(ctx context.Context, method, p string, q url.Values, in []byte, contentType string) (http.Header, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	target := p
	if len(q) > 0 {
		target += "?" + q.Encode()
	}
	var body io.Reader
	if in != nil {
		body = bytes.NewReader(in)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+target, body)
	if err != nil {
		return nil, nil, fmt.Errorf("workspace %s %s: %w", method, p, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("workspace %s %s: %w", method, p, err)
	}
	defer func() { _ = resp.Body.Close() }() // Fully read or abandoned.
	if resp.StatusCode/100 != 2 {
		return nil, nil, newError(method, target, resp)
	}
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, fmt.Errorf("workspace %s %s: read answer: %w", method, p, err)
	}
	return resp.Header, data, nil
}
