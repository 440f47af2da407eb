// Package server is the api-edge's /v1 HTTP surface: routes, validation,
// terms, admission, and the SSE and io relays. It holds no session state:
// everything it reads and writes is in JetStream, so any replica serves
// any session.
package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/session"
	"github.com/telorunner/telorunner/services/api-edge/internal/baseimage"
	"github.com/telorunner/telorunner/services/api-edge/internal/config"
	"github.com/telorunner/telorunner/services/api-edge/internal/decode"
)

// Options configure a Server.
type Options struct {
	Config   config.Config
	NC       *nats.Conn
	Store    *session.Store
	Logger   *slog.Logger
	Registry prometheus.Registerer
	// EdgeID names this replica (presence keys).
	EdgeID string
	// Now is the clock of the reload budget's window; time.Now when nil.
	Now func() time.Time
	// Menu is the base-image menu (contract 11.12): the config schema's
	// image enum and the allowlist of config.image. Nil when the catalog is
	// disabled: image is then readOnly and only Config.Image is accepted.
	Menu *baseimage.Menu
	// Reuse hands the connection of a hijacked SSE stream that ended
	// cleanly back to the HTTP server (ReuseListener.Reuse); false or nil:
	// the connection is closed instead.
	Reuse func(net.Conn) bool
}

// Server serves /v1.
type Server struct {
	cfg      config.Config
	nc       *nats.Conn
	store    *session.Store
	log      *slog.Logger
	edgeID   string
	now      func() time.Time // the reload budget's clock
	menu     *baseimage.Menu  // nil: catalog disabled
	reuse    func(net.Conn) bool
	engine   *gin.Engine
	m        metrics
	presence presence
	hub      *hub
	// newID draws session ids (contract.NewSessionID; tests draw their own).
	newID func() string
	// ioHeld is the most payload any one io socket held at once (its send
	// queue and its hub follower): the slow-client bound, for tests.
	ioHeld highWater

	// ctx ends the long-lived streams on shutdown; wg waits for them.
	ctx context.Context
	wg  sync.WaitGroup

	// reads are the SSE replays under way that others may share.
	readsMu sync.Mutex
	reads   map[replayKey]*replayRead

	// watch finds hijacked SSE clients that hung up (started on first use).
	watchOnce sync.Once
	watch     *sseWatcher

	// hijackHook, when set (tests), runs in the middle of each SSE
	// hijack, before the stream is whole.
	hijackHook atomic.Pointer[func(*sseConn)]
}

// New builds the router. Streams end when ctx does.
func New(ctx context.Context, o Options) *Server {
	gin.SetMode(gin.ReleaseMode)
	s := &Server{cfg: o.Config, nc: o.NC, store: o.Store, log: o.Logger, edgeID: o.EdgeID, now: o.Now, menu: o.Menu, reuse: o.Reuse, ctx: ctx, newID: contract.NewSessionID}
	if s.now == nil {
		s.now = time.Now
	}
	s.m = newMetrics(o.Registry)
	s.hub = newHub(ctx, func(subject string) *bus.Log {
		if strings.HasPrefix(subject, bus.SubjectIOPrefix) {
			return s.store.IO()
		}
		return s.store.Events()
	})
	e := gin.New()
	e.Use(gin.Recovery(), s.cors())
	e.HandleMethodNotAllowed = false
	e.NoRoute(func(c *gin.Context) {
		c.JSON(http.StatusNotFound, contract.Errorf("not_found", "no route %s %s", c.Request.Method, c.Request.URL.Path))
	})
	v1 := e.Group("/v1")
	v1.GET("/health", s.health)
	v1.GET("/capabilities", s.capabilities)
	v1.POST("/probe", s.probe)
	v1.POST("/sessions", s.createSession)
	v1.POST("/apps/:name/sessions", s.createAppSession)
	v1.GET("/sessions/:id", s.getSession)
	v1.DELETE("/sessions/:id", s.deleteSession)
	v1.GET(strings.TrimPrefix(eventsRoute, "/v1"), s.events)
	v1.GET("/sessions/:id/io", s.io)
	v1.GET("/sessions/:id/workspace", s.getWorkspace)
	v1.POST("/sessions/:id/workspace", s.postWorkspace)
	v1.GET("/sessions/:id/workspace/file", s.getWorkspaceFile)
	v1.POST("/sessions/:id/reload", s.reload)
	v1.POST("/sessions/:id/resume", s.resume)
	v1.PUT("/sessions/:id/apps", s.putApps)
	// Beyond the contract (docs/extensions.md).
	v1.POST("/sessions/:id/fork", s.forkSession)
	v1.GET("/sessions/:id/checkpoints", s.listCheckpoints)
	v1.POST("/sessions/:id/checkpoints", s.takeCheckpoint)
	v1.POST("/sessions/:id/checkpoints/:cid/restore", s.restoreCheckpoint)
	s.engine = e
	return s
}

// eventsRoute is the SSE route's pattern (section 6).
const eventsRoute = "/v1/sessions/:id/events"

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.engine.ServeHTTP(w, r) }

// Wait blocks until every stream handler returned (after ctx ended).
func (s *Server) Wait() { s.wg.Wait() }

// cors applies contract 2.4 to ordinary responses and answers preflights.
// With an allowlist every response depends on Origin, so each carries
// Vary: Origin. The event stream carries Vary: Origin whenever it carries
// Access-Control-Allow-Origin, "*" included (6.2). A private-network preflight
// (Access-Control-Request-Private-Network: true) is granted only to an
// allowed origin.
func (s *Server) cors() gin.HandlerFunc {
	return func(c *gin.Context) {
		origin := c.GetHeader("Origin")
		if !s.cfg.CORS.AnyOrigin {
			c.Header("Vary", "Origin")
		}
		if allowed, ok := s.cfg.CORS.AllowOrigin(origin); ok {
			c.Header("Access-Control-Allow-Origin", allowed)
			if c.FullPath() == eventsRoute {
				c.Header("Vary", "Origin")
			}
		} else if origin != "" && !isUpgrade(c.Request) {
			// 19.32: refuse plain requests from origins outside a narrowed list.
			c.AbortWithStatusJSON(http.StatusForbidden, contract.Errorf("origin_not_allowed", "origin %q is not allowed", origin))
			return
		}
		if c.Request.Method == http.MethodOptions {
			c.Header("Access-Control-Allow-Methods", "GET, POST, PUT, DELETE, OPTIONS")
			if h := c.GetHeader("Access-Control-Request-Headers"); h != "" {
				c.Header("Access-Control-Allow-Headers", h)
			}
			if strings.EqualFold(c.GetHeader("Access-Control-Request-Private-Network"), "true") && origin != "" {
				c.Header("Access-Control-Allow-Private-Network", "true")
			}
			c.Header("Access-Control-Max-Age", "600")
			c.AbortWithStatus(http.StatusNoContent)
			return
		}
		c.Next()
	}
}

func isUpgrade(r *http.Request) bool {
	return strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
}

// readBody reads the request body under the configured limit; false means
// a response was written.
func (s *Server) readBody(c *gin.Context) ([]byte, bool) {
	limit := s.cfg.BodyLimitBytes
	data, err := io.ReadAll(http.MaxBytesReader(c.Writer, c.Request.Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			c.JSON(http.StatusRequestEntityTooLarge, contract.Errorf("payload_too_large", "request body is larger than %d bytes", limit))
			return nil, false
		}
		c.JSON(http.StatusBadRequest, contract.Errorf("invalid_request", "read body: %v", err))
		return nil, false
	}
	return data, true
}

// fail writes err as the contract's envelope: a *contract.Error with its
// status, a schema error as 400 invalid_request, anything else as 500.
func (s *Server) fail(c *gin.Context, err error) {
	var ce *contract.Error
	var se *decode.SchemaError
	switch {
	case errors.As(err, &ce):
		c.JSON(statusOf(ce.Code), ce)
	case errors.As(err, &se):
		c.JSON(http.StatusBadRequest, contract.Errorf("invalid_request", "%s", se.Error()))
	default:
		s.log.Error("request failed", "path", c.FullPath(), "err", err)
		c.JSON(http.StatusInternalServerError, contract.Errorf("internal_error", "%v", err))
	}
}

// statusOf maps a contract error code to its HTTP status (section 2.3).
func statusOf(code string) int {
	switch code {
	case "not_found", "unknown_app", "not_suspended", "file_not_found", "checkpoint_not_found":
		return http.StatusNotFound
	case "too_many_sessions", "too_many_watch_sessions", "not_a_watch_session", "not_running", "no_checkpoint", "file_changed":
		return http.StatusConflict
	case "terms_required":
		return http.StatusPreconditionRequired
	case "reload_rate_limited":
		return http.StatusTooManyRequests
	case "origin_not_allowed":
		return http.StatusForbidden
	case "stop_failed", "set_apps_failed", "internal_error":
		return http.StatusInternalServerError
	case "workspace_error":
		return http.StatusBadGateway
	case "payload_too_large":
		return http.StatusRequestEntityTooLarge
	}
	return http.StatusBadRequest
}

func notFound(id string) *contract.Error {
	return contract.Errorf("not_found", "session '%s' not in registry", id)
}
