package kernelwire

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/wsapi"
)

// WorkspaceRequestTimeout bounds one request to a workspace server (9.4).
const WorkspaceRequestTimeout = wsapi.Timeout

// MarkerPath is the workspace marker seeded at the root (contract 9.7).
const MarkerPath = wsapi.MarkerPath

// MarkerContent anchors the kernels' shared module cache (wsapi).
const MarkerContent = wsapi.MarkerContent

// WorkspaceClient talks to one workspace server through the one client,
// wsapi.Client (contract 9.2). Its methods are safe for concurrent use.
type WorkspaceClient struct {
	Base string       // http://<host>:<port>, no trailing slash
	HTTP *http.Client // nil: http.DefaultClient
}

// Write is one write of a change set (wsapi.WriteOp): Mode is the file's
// permission bits, at most 0777 (0: none sent); Staged names an upload
// holding the content (POST /workspace/stage).
type Write = wsapi.WriteOp

// ChangeSet is the body of POST /workspace.
type ChangeSet = wsapi.ChangeSet

// TreeFile is one file of GET /workspace.
type TreeFile = wsapi.TreeFile

func (c WorkspaceClient) api() *wsapi.Client { return wsapi.New(c.Base, c.HTTP) }

// Ping reads the tree once: the readiness probe.
func (c WorkspaceClient) Ping(ctx context.Context) error {
	_, err := c.api().Tree(ctx)
	return err
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
	res, err := c.api().ApplyEncoded(ctx, body)
	if err != nil {
		return err
	}
	if res.Written != writes || res.Deleted != deletes {
		return fmt.Errorf("POST /workspace: applied %d writes and %d deletes, want %d and %d",
			res.Written, res.Deleted, writes, deletes)
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
