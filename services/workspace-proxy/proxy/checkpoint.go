package proxy

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/checkpoint"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/merkle"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/pkg/wsapi"
)

// newCheckpointStore binds the checkpoint store (runner_blobs,
// runner_checkpoints) with its defaults: four transfers in flight, a
// ten-minute grace period.
func newCheckpointStore(ctx context.Context, js jetstream.JetStream, history int) (*checkpoint.Store, error) {
	return checkpoint.NewStore(ctx, js, checkpoint.Options{History: history})
}

// workspace adapts a workspace server client to checkpoint.Workspace:
// the tree nodes of GET /workspace/node and the blobs.
type workspace struct{ c *wsapi.Client }

func (w workspace) Root(ctx context.Context) ([]byte, error) { return w.c.Root(ctx) }

func (w workspace) Node(ctx context.Context, hash string) ([]byte, error) {
	return w.c.Node(ctx, hash)
}

func (w workspace) Blob(ctx context.Context, hash string) ([]byte, error) { return w.c.Blob(ctx, hash) }

// liveFiles lists the live workspace with sizes and modes, by path, from
// its tree nodes.
func liveFiles(ctx context.Context, c *wsapi.Client) (map[string]merkle.File, error) {
	data, err := c.Root(ctx)
	if err != nil {
		return nil, err
	}
	root := merkle.Hash(data)
	rootNode, err := merkle.Decode(data)
	if err != nil {
		return nil, contract.Errorf("workspace_error", "workspace tree: %v", err)
	}
	get := func(ctx context.Context, h string) (merkle.Node, error) {
		if h == root {
			return rootNode, nil
		}
		data, err := c.Node(ctx, h)
		if err != nil {
			return merkle.Node{}, err
		}
		n, err := merkle.Decode(data)
		if err != nil {
			return merkle.Node{}, contract.Errorf("workspace_error", "workspace tree: %v", err)
		}
		return n, nil
	}
	flat, err := merkle.Flatten(ctx, root, get, 4)
	if err != nil {
		return nil, err
	}
	files := make(map[string]merkle.File, len(flat))
	for _, f := range flat {
		files[f.Path] = f
	}
	return files, nil
}

// checkpointRequest is the optional body of runner.ws.<id>.checkpoint.
type checkpointRequest struct {
	Reason string `json:"reason"` // default checkpoint.ReasonPeriodic
}

// checkpointResult answers runner.ws.<id>.checkpoint.
type checkpointResult struct {
	ID            string    `json:"id"`
	Reason        string    `json:"reason"`
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
//
// The body may name the reason recorded in the session's history
// ({"reason":"manual"}); none is periodic. A checkpoint asked for by a
// user or a fork (any reason but periodic) that loses a race with another
// Take of the session is taken again, so it is never refused for one.
func (p *proxy) checkpointOp(ctx context.Context, c *wsapi.Client, sessionID string, data []byte) (any, error) {
	req := checkpointRequest{Reason: checkpoint.ReasonPeriodic}
	if len(data) > 0 {
		if err := json.Unmarshal(data, &req); err != nil {
			return nil, contract.Errorf("invalid_request", "checkpoint: %v", err)
		}
		if req.Reason == "" {
			req.Reason = checkpoint.ReasonPeriodic
		}
	}
	if !checkpoint.ValidReason(req.Reason) {
		return nil, contract.Errorf("invalid_request", "checkpoint: unknown reason %q", req.Reason)
	}
	st := p.ckpt
	return take(ctx, st, c, sessionID, req.Reason)
}

// take checkpoints the workspace as reason, again after a lost race
// unless reason is periodic (the next tick takes that one).
func take(ctx context.Context, st *checkpoint.Store, c *wsapi.Client, sessionID, reason string) (checkpointResult, error) {
	for attempt := 1; ; attempt++ {
		m, stats, err := st.TakeAs(ctx, sessionID, reason, workspace{c})
		if errors.Is(err, checkpoint.ErrConflict) && reason != checkpoint.ReasonPeriodic && attempt < 5 {
			continue
		}
		if err != nil {
			return checkpointResult{}, storeErr("checkpoint", sessionID, err)
		}
		return checkpointResult{ID: m.ID, Reason: reason, TakenAt: m.TakenAt, Files: stats.Files, Changed: stats.Changed,
			Uploaded: stats.Uploaded, BytesUploaded: stats.BytesUploaded, BytesTotal: stats.BytesTotal}, nil
	}
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

// applyTree writes every file of m into the workspace, base64, with its
// mode (when the checkpoint recorded one), in change sets of bounded
// size, then deletes the paths of del (in the last set).
// A failure part-way leaves the change sets already applied.
func applyTree(ctx context.Context, st *checkpoint.Store, c *wsapi.Client, sessionID string, m checkpoint.Manifest, del []string, lim batchLimits) (restoreResult, error) {
	res := restoreResult{TakenAt: m.TakenAt}
	var cs wsapi.ChangeSet
	var pending int64
	flush := func() error {
		if len(cs.Write) == 0 && len(cs.Delete) == 0 {
			return nil
		}
		if _, err := c.Apply(ctx, cs); err != nil {
			return err
		}
		res.Batches++
		cs.Write, cs.Delete, pending = cs.Write[:0], nil, 0
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
		cs.Write = append(cs.Write, wsapi.WriteOp{Path: path, Encoding: wsapi.EncodingBase64,
			Content: base64.StdEncoding.EncodeToString(f.Content), Mode: f.Mode})
		pending += size
		res.Files++
		res.Bytes += size
	}
	cs.Delete = del
	return res, flush()
}

// restoreToRequest is the body of runner.ws.<id>.restore that names a
// checkpoint of the session's history.
type restoreToRequest struct {
	Checkpoint string `json:"checkpoint"`
}

// restoreToResult answers it.
type restoreToResult struct {
	Restored   string           `json:"restored"`   // The checkpoint restored.
	Written    int              `json:"written"`    // Files written (new or with other content).
	Deleted    int              `json:"deleted"`    // Files removed (not in the checkpoint).
	Touched    []string         `json:"touched"`    // App entries touched so their kernels reload.
	Checkpoint checkpointResult `json:"checkpoint"` // The restore checkpoint recorded after.
}

// restoreTo makes the live workspace exactly the tree of checkpoint cid
// of the session's history: files whose content or mode differs are written,
// files it does not hold are removed, unchanged files are left alone.
// Every app's kernel then sees a change (its entry was written, or is
// touched), so each reloads through --watch; the tree is recorded as a
// restore checkpoint. An unknown checkpoint answers checkpoint_not_found.
func (p *proxy) restoreTo(ctx context.Context, c *wsapi.Client, rec session.Record, data []byte) (any, error) {
	var req restoreToRequest
	if err := json.Unmarshal(data, &req); err != nil {
		return nil, contract.Errorf("invalid_request", "restore: %v", err)
	}
	st := p.ckpt
	unknown := contract.Errorf("checkpoint_not_found", "session '%s' has no checkpoint '%s'", rec.ID, req.Checkpoint)
	if !checkpoint.ValidID(req.Checkpoint) {
		return nil, unknown
	}
	m, _, err := st.LoadCheckpoint(ctx, rec.ID, req.Checkpoint)
	if errors.Is(err, checkpoint.ErrUnknownCheckpoint) {
		return nil, unknown
	}
	if err != nil {
		return nil, storeErr("restore", rec.ID, err)
	}
	have, err := liveFiles(ctx, c)
	if err != nil {
		return nil, err
	}
	changed := checkpoint.Manifest{TakenAt: m.TakenAt, Files: map[string]checkpoint.Entry{}}
	var del []string
	for path := range have {
		if _, ok := m.Files[path]; !ok {
			del = append(del, path)
		}
	}
	slices.Sort(del)
	for path, e := range m.Files {
		if f, ok := have[path]; !ok || f.Hash != e.Hash || (e.Mode != 0 && f.Mode != e.Mode) {
			changed.Files[path] = e
		}
	}
	w, err := applyTree(ctx, st, c, rec.ID, changed, del, restoreBatch)
	if err != nil {
		return nil, err
	}
	res := restoreToResult{Restored: req.Checkpoint, Written: w.Files, Deleted: len(del), Touched: []string{}}
	for _, a := range rec.Apps {
		_, inTree := m.Files[a.Entry]
		_, written := changed.Files[a.Entry]
		if inTree && !written && !slices.Contains(res.Touched, a.Entry) {
			res.Touched = append(res.Touched, a.Entry)
		}
	}
	if len(res.Touched) > 0 {
		if _, err := c.Touch(ctx, res.Touched); err != nil {
			return nil, err
		}
	}
	if res.Checkpoint, err = take(ctx, st, c, rec.ID, checkpoint.ReasonRestore); err != nil {
		return nil, err
	}
	return res, nil
}

// storeErr keeps workspace server failures for mapErr and reports store
// failures as workspace_error naming the operation.
func storeErr(op, sessionID string, err error) error {
	var we *wsapi.Error
	if errors.As(err, &we) {
		return err
	}
	return contract.Errorf("workspace_error", "%s '%s': %v", op, sessionID, err)
}
