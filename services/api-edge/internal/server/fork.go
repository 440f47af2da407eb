package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/checkpoint"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/services/api-edge/internal/decode"
)

// Fork and checkpoint history: routes beyond the contract (issue 17,
// docs/extensions.md). Each follows the contract's conventions: the
// error envelope, 404 not_found for an unknown session, 409
// not_a_watch_session / not_running / no_checkpoint.

// checkpointDoc is one entry of a session's checkpoint history.
type checkpointDoc struct {
	ID      string `json:"id"`
	TakenAt string `json:"takenAt"`
	Reason  string `json:"reason"`
	Files   int    `json:"files"`
	Bytes   int64  `json:"bytes"`
}

func docOf(c checkpoint.Checkpoint) checkpointDoc {
	return checkpointDoc{ID: c.ID, TakenAt: contract.Timestamp(c.TakenAt), Reason: c.Reason, Files: c.Files, Bytes: c.Bytes}
}

// wsCheckpoint is runner-ws's answer to a checkpoint.
type wsCheckpoint struct {
	ID         string    `json:"id"`
	Reason     string    `json:"reason"`
	TakenAt    time.Time `json:"takenAt"`
	Files      int       `json:"files"`
	BytesTotal int64     `json:"bytesTotal"`
}

func (w wsCheckpoint) doc() checkpointDoc {
	return checkpointDoc{ID: w.ID, TakenAt: contract.Timestamp(w.TakenAt), Reason: w.Reason, Files: w.Files, Bytes: w.BytesTotal}
}

// listCheckpoints is GET /v1/sessions/:id/checkpoints: the kept
// checkpoints, newest first, in any state of the session.
func (s *Server) listCheckpoints(c *gin.Context) {
	rec, ok := s.watchSession(c)
	if !ok {
		return
	}
	h, err := checkpoint.History(c.Request.Context(), s.store.Checkpoints(), rec.ID)
	if err != nil {
		s.fail(c, err)
		return
	}
	out := make([]checkpointDoc, 0, len(h))
	for _, e := range h {
		out = append(out, docOf(e))
	}
	c.JSON(http.StatusOK, gin.H{"checkpoints": out})
}

// takeCheckpoint is POST /v1/sessions/:id/checkpoints: a checkpoint of
// the live workspace now (reason manual); 201 with its entry.
func (s *Server) takeCheckpoint(c *gin.Context) {
	rec, ok := s.liveWatchSession(c)
	if !ok {
		return
	}
	var res wsCheckpoint
	if err := s.wsCall(c.Request.Context(), rec.ID, bus.WSCheckpoint, map[string]string{"reason": checkpoint.ReasonManual}, &res); err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusCreated, res.doc())
}

// restoreCheckpoint is POST /v1/sessions/:id/checkpoints/:cid/restore:
// the live workspace becomes that checkpoint's tree exactly, every app
// reloads through its watcher (trigger watch), and the tree is recorded
// as a restore checkpoint; 202 {restored, checkpoint}. Charged to the
// reload budget like a workspace write (13.5).
func (s *Server) restoreCheckpoint(c *gin.Context) {
	rec, ok := s.watchSession(c)
	if !ok {
		return
	}
	cid := c.Param("cid")
	if !checkpoint.ValidID(cid) {
		s.fail(c, unknownCheckpoint(rec.ID, cid))
		return
	}
	if !live(rec) {
		s.fail(c, notRunning(rec))
		return
	}
	if !s.chargeReload(c, rec.ID) {
		return
	}
	var res struct {
		Restored   string       `json:"restored"`
		Checkpoint wsCheckpoint `json:"checkpoint"`
	}
	if err := s.wsCall(c.Request.Context(), rec.ID, bus.WSRestore, map[string]string{"checkpoint": cid}, &res); err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusAccepted, gin.H{"restored": res.Restored, "checkpoint": res.Checkpoint.doc()})
}

func unknownCheckpoint(id, cid string) *contract.Error {
	return contract.Errorf("checkpoint_not_found", "session '%s' has no checkpoint '%s'", id, cid)
}

// forkSession is POST /v1/sessions/:id/fork: a new watch session from
// the source's latest state — a fresh checkpoint when the source is live,
// else its last one — with the source's env, config, agent and apps (or
// the body's apps), answered as create (201 {sessionId, streamUrl,
// createdAt}) after the same terms, watch ceiling and admission. The
// fork's first checkpoint is a metadata copy of the source's (no blob is
// copied); the source is only read.
func (s *Server) forkSession(c *gin.Context) {
	data, ok := s.readBody(c)
	if !ok {
		return
	}
	specs, err := parseForkBody(data)
	if err != nil {
		s.fail(c, err)
		return
	}
	if !s.termsAccepted(c) {
		return
	}
	src, ok := s.watchSession(c)
	if !ok {
		return
	}
	if !s.cfg.Watch.Enabled {
		s.fail(c, contract.Errorf("watch_disabled", "watch sessions are not enabled on this runner (RUNNER_WATCH_SESSIONS)"))
		return
	}
	ctx := c.Request.Context()
	if n, err := s.store.CountLiveWatch(ctx); err != nil {
		s.fail(c, err)
		return
	} else if n >= s.cfg.Watch.MaxSessions {
		s.fail(c, contract.Errorf("too_many_watch_sessions", "runner is at its limit of %d live watch sessions", s.cfg.Watch.MaxSessions))
		return
	}
	var apps []session.App
	if specs != nil {
		if apps, err = resolveApps(specs, contract.ReservedPorts(contract.ModeWatch, true, len(specs))); err != nil {
			s.fail(c, err)
			return
		}
	} else {
		for _, a := range src.Apps {
			apps = append(apps, session.App{Name: a.Name, Entry: a.Entry, IO: a.IO, Ports: a.Ports, Trigger: contract.TriggerInitial})
		}
	}
	launch := src.Launch
	var notices []string
	if a := launch.AgentSpec; a != nil {
		if owner := portOwner(apps, contract.PortMapping{Port: a.Port, Protocol: "tcp"}); owner != "" {
			notices = append(notices, fmt.Sprintf("co-resident agent %q was not started: app %q declares its port tcp/%d", a.Name, owner, a.Port))
			launch.AgentSpec = nil
		}
	}
	if live(src) {
		err := s.wsCall(ctx, src.ID, bus.WSCheckpoint, map[string]string{"reason": checkpoint.ReasonFork}, nil)
		if err != nil {
			s.fail(c, err)
			return
		}
	} else if _, err := s.store.Checkpoints().Get(ctx, src.ID); err != nil {
		s.fail(c, contract.Errorf("no_checkpoint", "session '%s' is not running and has no checkpoint to fork from", src.ID))
		return
	}
	// The driver seeds a watch session from its checkpoint; the bundle is
	// only the entry, never read while the checkpoint exists.
	bundle := contract.Bundle{EntryRelativePath: apps[0].Entry, Files: []contract.BundleFile{}}
	s.admitAndStart(c, contract.ModeWatch, apps, launch, bundle, notices, func(ctx context.Context, id string) error {
		_, err := checkpoint.Fork(ctx, s.store.Checkpoints(), src.ID, id)
		if errors.Is(err, checkpoint.ErrNoCheckpoint) {
			return contract.Errorf("no_checkpoint", "session '%s' has no checkpoint to fork from", src.ID)
		}
		if err != nil {
			_ = checkpoint.Purge(ctx, s.store.Checkpoints(), id) // a half-written copy pins blobs
		}
		return err
	})
}

// parseForkBody reads {} or {apps}: nil apps keep the source's.
func parseForkBody(data []byte) ([]contract.AppSpec, error) {
	if len(data) == 0 {
		return nil, nil
	}
	body, err := decode.Parse(data, "body")
	if err != nil {
		return nil, err
	}
	specs, _, err := body.Apps("apps", false)
	return specs, err
}
