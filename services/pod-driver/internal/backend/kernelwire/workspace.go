package kernelwire

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/telorunner/telorunner/pkg/contract"
)

const (
	// WorkspaceRequestTimeout bounds one request to a workspace server (9.4).
	WorkspaceRequestTimeout = 30 * time.Second
	// wsErrorBody is how much of a failed answer an error quotes (9.4).
	wsErrorBody = 500
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

// WorkspaceClient talks to one workspace server over plain HTTP
// (contract 9.2). Its methods are safe for concurrent use.
type WorkspaceClient struct {
	Base string       // http://<host>:<port>, no trailing slash
	HTTP *http.Client // nil: http.DefaultClient
}

// Write is one write of a change set.
type Write struct {
	Path     string `json:"path"`
	Content  string `json:"content"`
	Encoding string `json:"encoding"`
	// Mode is the file's permission bits, at most 0777 (0: none sent; a
	// new file gets the server's default, a rewritten one keeps its
	// mode): the workspace server's optional per-write "mode".
	Mode uint32 `json:"mode,omitempty"`
	// Staged names an upload holding the content (POST /workspace/stage):
	// a file too large for one request is staged in chunks and committed
	// whole by this write.
	Staged string `json:"staged,omitempty"`
}

// ChangeSet is the body of POST /workspace.
type ChangeSet struct {
	Write  []Write  `json:"write"`
	Delete []string `json:"delete,omitempty"`
}

// Ping reads the tree once: the readiness probe.
func (c WorkspaceClient) Ping(ctx context.Context) error {
	var tree struct {
		Files []json.RawMessage `json:"files"`
	}
	return c.do(ctx, http.MethodGet, "/workspace", nil, &tree)
}

// Apply posts one change set and checks every write and delete was
// applied.
func (c WorkspaceClient) Apply(ctx context.Context, cs ChangeSet) error {
	data, err := json.Marshal(cs)
	if err != nil {
		return fmt.Errorf("POST /workspace: encode body: %w", err)
	}
	return c.apply(ctx, data, len(cs.Write), len(cs.Delete))
}

// apply posts an encoded change set of writes writes and deletes deletes.
func (c WorkspaceClient) apply(ctx context.Context, body []byte, writes, deletes int) error {
	var res struct {
		Written int `json:"written"`
		Deleted int `json:"deleted"`
	}
	if err := c.doJSON(ctx, http.MethodPost, "/workspace", body, &res); err != nil {
		return err
	}
	if res.Written != writes || res.Deleted != deletes {
		return fmt.Errorf("POST /workspace: applied %d writes and %d deletes, want %d and %d",
			res.Written, res.Deleted, writes, deletes)
	}
	return nil
}

// do sends one request (bounded by WorkspaceRequestTimeout) and decodes a 2xx
// answer into out. Any other answer is an error quoting method, path,
// status and the start of the body.
func (c WorkspaceClient) do(ctx context.Context, method, path string, in, out any) error {
	var data []byte
	if in != nil {
		var err error
		if data, err = json.Marshal(in); err != nil {
			return fmt.Errorf("%s %s: encode body: %w", method, path, err)
		}
	}
	return c.doJSON(ctx, method, path, data, out)
}

// doJSON is do with the body already encoded (nil: none).
func (c WorkspaceClient) doJSON(ctx context.Context, method, path string, data []byte, out any) error {
	ctx, cancel := context.WithTimeout(ctx, WorkspaceRequestTimeout)
	defer cancel()
	var body io.Reader
	if data != nil {
		body = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.Base+path, body)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if data != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	client := c.HTTP
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer func() { _ = resp.Body.Close() }() // read to the end below; nothing to flush
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		snippet, _ := io.ReadAll(io.LimitReader(resp.Body, wsErrorBody))
		return fmt.Errorf("%s %s: status %s: %s", method, path, resp.Status, snippet)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return nil
}

// SeedChanges is the change set that seeds a fresh workspace (contract
// 9.5): every bundle file at its normalized path, then the marker at the
// root unless the bundle has a file at exactly that path. It fails on a
// path that does not normalize or a base64 content that does not decode,
// so a bad bundle is refused before anything starts. As in run sessions,
// any encoding but base64 is text.
func SeedChanges(files []contract.BundleFile) (ChangeSet, error) {
	cs := ChangeSet{Write: make([]Write, 0, len(files)+1)}
	hasMarker := false
	for _, f := range files {
		rel, err := contract.NormalizePath(f.RelativePath)
		if err != nil {
			return ChangeSet{}, err
		}
		enc := "utf8" // as writeBundle: anything but base64 is text
		if f.Encoding == "base64" {
			if _, err := base64.StdEncoding.DecodeString(f.Contents); err != nil {
				return ChangeSet{}, fmt.Errorf("decode bundle file %s: %w", rel, err)
			}
			enc = "base64"
		}
		hasMarker = hasMarker || rel == MarkerPath
		cs.Write = append(cs.Write, Write{Path: rel, Content: f.Contents, Encoding: enc})
	}
	if !hasMarker {
		cs.Write = append(cs.Write, Write{Path: MarkerPath, Content: MarkerContent, Encoding: "utf8"})
	}
	return cs, nil
}
