package server

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/services/api-edge/internal/config"
	"github.com/telorunner/telorunner/services/api-edge/internal/decode"
)

func (s *Server) health(c *gin.Context) {
	c.JSON(http.StatusOK, gin.H{"ok": true, "version": config.Version})
}

type appDescriptor struct {
	Name        string `json:"name"`
	Title       string `json:"title,omitempty"`
	Description string `json:"description,omitempty"`
}

type features struct {
	IO     []string `json:"io"`
	Ports  bool     `json:"ports"`
	Watch  bool     `json:"watch"`
	Agents []string `json:"agents,omitempty"`
	// Beyond the contract (docs/extensions.md): POST .../fork and the
	// checkpoint history routes; both need watch sessions.
	Fork        bool `json:"fork"`
	Checkpoints bool `json:"checkpoints"`
}

type capabilities struct {
	DisplayName string          `json:"displayName"`
	Description string          `json:"description"`
	Features    features        `json:"features"`
	Config      map[string]any  `json:"config"`
	Terms       *config.Terms   `json:"terms,omitempty"`
	Apps        []appDescriptor `json:"apps,omitempty"`
}

// capabilities is recomputed on every request (section 4.2).
func (s *Server) capabilities(c *gin.Context) {
	out := capabilities{
		DisplayName: s.cfg.DisplayName,
		Description: s.cfg.Description,
		Features: features{IO: []string{"tty", "streams"}, Ports: true, Watch: s.cfg.Watch.Enabled,
			Fork: s.cfg.Watch.Enabled, Checkpoints: s.cfg.Watch.Enabled},
		Config: map[string]any{"schema": s.configSchema()},
		Terms:  s.cfg.Terms,
	}
	if s.cfg.Watch.Enabled {
		out.Features.Agents = s.cfg.Apps.AgentNames()
	}
	for _, name := range s.cfg.Apps.Names() {
		a, _ := s.cfg.Apps.Lookup(name)
		out.Apps = append(out.Apps, appDescriptor{Name: a.Name, Title: a.Title, Description: a.Description})
	}
	c.JSON(http.StatusOK, out)
}

// configSchema describes the editable SessionConfig (section 4.2.1). With
// the base-image menu the image is an enum of it (default first); without
// it the image is locked to the default (readOnly, 11.12 last bullet).
func (s *Server) configSchema() map[string]any {
	image := map[string]any{"type": "string", "minLength": 1, "default": s.cfg.Image, "title": "Image"}
	if s.menu != nil {
		image["enum"] = s.menu.Images()
		image["description"] = "Kernel image the session runs on, from the operator's base-image menu."
	} else {
		image["readOnly"] = true
		image["description"] = "Kernel image the session runs on. Fixed by the operator."
	}
	return map[string]any{
		"type":     "object",
		"required": []string{"image", "pullPolicy"},
		"properties": map[string]any{
			"image": image,
			"pullPolicy": map[string]any{
				"type": "string", "enum": []string{"missing", "always", "never"}, "default": "missing",
				"title": "Pull policy", "description": "When to pull the kernel image.",
			},
		},
	}
}

// allowedImages is the allowlist of config.image: the menu, or the
// default image alone when the catalog is disabled.
func (s *Server) allowedImages() []string {
	if s.menu != nil {
		return s.menu.Images()
	}
	return []string{s.cfg.Image}
}

type availability struct {
	Status      string           `json:"status"`
	Issues      []contract.Issue `json:"issues,omitempty"`
	Message     string           `json:"message,omitempty"`
	Remediation string           `json:"remediation,omitempty"`
}

// probe checks that the runner can start sessions: JetStream answers, at
// least one pod-driver is pulling start commands, and a driver finds its
// backend set up (runner.probe: on Kubernetes the session namespace and the
// driver's Role; needs-setup lists what is missing).
func (s *Server) probe(c *gin.Context) {
	data, ok := s.readBody(c)
	if !ok {
		return
	}
	// Only config.image and config.pullPolicy are in the probe schema;
	// everything else is dropped unread (4.3), whatever its type.
	body, err := decode.Parse(data, "body")
	if err == nil {
		var cfgObj decode.Obj
		if cfgObj, _, err = body.Object("config", true); err == nil {
			if _, _, err = cfgObj.Str("image", true, 1); err == nil {
				_, _, err = cfgObj.Enum("pullPolicy", true, "missing", "always", "never")
			}
		}
	}
	if err != nil {
		s.fail(c, err)
		return
	}
	ctx, cancel := context.WithTimeout(c.Request.Context(), 3*time.Second)
	defer cancel()
	cons, err := s.store.DriverConsumer(ctx)
	if err != nil {
		c.JSON(http.StatusOK, availability{Status: "unavailable", Message: "the runner's message bus does not answer: " + err.Error(),
			Remediation: "Check that NATS JetStream is running and reachable at RUNNER_NATS_URL."})
		return
	}
	info, err := cons.Info(ctx)
	if err != nil || info.NumWaiting == 0 {
		c.JSON(http.StatusOK, availability{Status: "unavailable", Message: "no pod-driver is connected to start sessions",
			Remediation: "Start at least one pod-driver against the same NATS."})
		return
	}
	pctx, pcancel := context.WithTimeout(c.Request.Context(), 4*time.Second)
	defer pcancel()
	msg, err := s.nc.RequestWithContext(pctx, bus.SubjectProbe, nil)
	var reply contract.ProbeReply
	if err != nil || json.Unmarshal(msg.Data, &reply) != nil {
		// A driver pulls commands but does not answer the setup check:
		// nothing more is known.
		s.log.Warn("probe: no driver answered the setup check", "err", err)
		c.JSON(http.StatusOK, availability{Status: contract.AvailabilityReady})
		return
	}
	switch {
	case reply.Error != "":
		c.JSON(http.StatusOK, availability{Status: contract.AvailabilityUnavailable, Message: "the Kubernetes API is unreachable from the pod-driver: " + reply.Error,
			Remediation: "Check the pod-driver's ServiceAccount, its RBAC (deploy/kubernetes/role.yaml) and the API server address."})
	case len(reply.Issues) > 0:
		c.JSON(http.StatusOK, availability{Status: contract.AvailabilityNeedsSetup, Issues: reply.Issues})
	default:
		c.JSON(http.StatusOK, availability{Status: contract.AvailabilityReady})
	}
}
