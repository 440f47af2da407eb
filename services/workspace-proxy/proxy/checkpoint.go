package proxy

import (
	"context"
	"encoding/base64"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/checkpoint"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/services/workspace-proxy/internal/wsclient"
)

// newCheckpointStore binds the checkpoint store (runner_blobs,
// runner_checkpoints) with its defaults: four transfers in flight, a
// ten-minute grace period.
func newCheckpointStore(ctx context.Context, js jetstream.JetStream) (*checkpoint.Store, error) {
	return checkpoint.NewStore(ctx, js, checkpoint.Options{})
}

// checkpoints returns the store the checkpoint and restore operations use.
// Binding is two stream lookups; a proxy that holds a store from
// newCheckpointStore can return it here instead.
func (p *proxy) checkpoints(ctx context.Context) (*checkpoint.Store, error) {
	if p.ckpt != nil {
		return p.ckpt, nil
	}
	st, err := newCheckpointStore(ctx, p.store.JS)
	if err != nil {
		return nil, contract.Errorf("workspace_error", "%v", err)
	}
	return st, nil
}

// workspace adapts a workspace server client to checkpoint.Workspace.
type workspace struct{ c *wsclient.Client }

func (w workspace) Tree(ctx context.Context) ([]checkpoint.File, error) {
	t, err := w.c.Tree(ctx)
	if err != nil {
		return nil, err
	}
	files := make([]checkpoint.File, len(t.Files))
	for i, f := range t.Files {
		files[i] = checkpoint.File{Path: f.Path, Hash: f.Hash}
	}
	return files, nil
}

func (w workspace) Blob(ctx context.Context, hash string) ([]byte, error) { return w.c.Blob(ctx, hash) }

// checkpointResult answers runner.ws.<id>.checkpoint.
type checkpointResult struct {
	TakenAt       time.Time `json:"takenAt"`
	Files         int       `json:"files"`
	Changed       int       `json:"changed"`
	Uploaded      int       `json:"uploaded"`
	BytesUploaded int64     `json:"bytesUploaded"`
	BytesTotal    int64     `json:"bytesTotal"`
}

// checkpointOp takes an incremental checkpoint of the session's live
// workspace (design §6): only content the blob store lacks is read from
// the workspace and uploaded. A failure leaves the previous checkpoint.
func (p *proxy) checkpointOp(ctx context.Context, c *wsclient.Client, sessionID string) (any, error) {
	st, err := p.checkpoints(ctx)
	if err != nil {
		return nil, err
	}
	m, stats, err := st.Take(ctx, sessionID, workspace{c})
	if err != nil {
		return nil, storeErr("checkpoint", sessionID, err)
	}
	return checkpointResult{TakenAt: m.TakenAt, Files: stats.Files, Changed: stats.Changed,
		Uploaded: stats.Uploaded, BytesUploaded: stats.BytesUploaded, BytesTotal: stats.BytesTotal}, nil
}

// restoreResult answers runner.ws.<id>.restore.
type restoreResult struct {
	TakenAt time.Time `json:"takenAt"` // Of the checkpoint restored.
	Files   int       `json:"files"`   // Files written.
	Bytes   int64     `json:"bytes"`   // Their bytes.
	Batches int       `json:"batches"` // Change sets applied.
}

// batchLimits bound one restore change set; a file larger than bytes goes
// in a set of its own.
type batchLimits struct {
	files int
	bytes int64
}

// restoreBatch keeps a change set well under the workspace server's 64 MiB
// body limit once base64 (4/3) and JSON are added.
var restoreBatch = batchLimits{files: 256, bytes: 8 << 20}

// restoreOp writes every file of the session's checkpoint into its
// workspace, base64, in change sets of bounded size. Files the checkpoint
// does not list are left alone (restore targets a fresh workspace). No
// checkpoint answers no_checkpoint. A failure part-way leaves the change
// sets already applied.
func (p *proxy) restoreOp(ctx context.Context, c *wsclient.Client, sessionID string) (any, error) {
	st, err := p.checkpoints(ctx)
	if err != nil {
		return nil, err
	}
	return restore(ctx, st, c, sessionID, restoreBatch)
}

func restore(ctx context.Context, st *checkpoint.Store, c *wsclient.Client, sessionID string, lim batchLimits) (restoreResult, error) {
	var res restoreResult
	m, ok, err := st.Load(ctx, sessionID)
	if err != nil {
		return res, storeErr("restore", sessionID, err)
	}
	if !ok {
		return res, contract.Errorf("no_checkpoint", "session '%s' has no checkpoint", sessionID)
	}
	res.TakenAt = m.TakenAt
	var cs wsclient.ChangeSet
	var pending int64
	flush := func() error {
		if len(cs.Write) == 0 {
			return nil
		}
		if _, err := c.Apply(ctx, cs); err != nil {
			return err
		}
		res.Batches++
		cs.Write, pending = cs.Write[:0], 0
		return nil
	}
	for f, err := range st.Files(ctx, m) {
		if err != nil {
			return res, storeErr("restore", sessionID, err)
		}
		path, err := contract.NormalizePath(f.Path)
		if err != nil {
			return res, contract.Errorf("invalid_path", "checkpoint of '%s': %v", sessionID, err)
		}
		size := int64(len(f.Content))
		if len(cs.Write) > 0 && (len(cs.Write) >= lim.files || pending+size > lim.bytes) {
			if err := flush(); err != nil {
				return res, err
			}
		}
		cs.Write = append(cs.Write, wsclient.WriteOp{Path: path, Encoding: wsclient.EncodingBase64,
			Content: base64.StdEncoding.EncodeToString(f.Content)})
		pending += size
		res.Files++
		res.Bytes += size
	}
	return res, flush()
}

// storeErr keeps workspace server failures for mapErr and reports store
// failures as workspace_error naming the operation.
func storeErr(op, sessionID string, err error) error {
	var we *wsclient.Error
	if errors.As(err, &we) {
		return err
	}
	return contract.Errorf("workspace_error", "%s '%s': %v", op, sessionID, err)
}
