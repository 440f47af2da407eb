package devkernel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// HeartbeatInterval is the period of the `: ping` SSE comment.
const HeartbeatInterval = 25 * time.Second

// InspectHandler serves the debug wire of hub: GET /events (SSE, replay then
// live) and GET /json/version (handshake naming selfURL). Everything else is
// 404.
type InspectHandler struct {
	Hub       *Hub
	SelfURL   string        // "http://host:port" reported by /json/version
	Heartbeat time.Duration // 0 means HeartbeatInterval
}

func (h *InspectHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/events":
		h.serveEvents(w, r)
	case r.Method == http.MethodGet && r.URL.Path == "/json/version":
		h.serveVersion(w)
	default:
		http.NotFound(w, r)
	}
}

type versionJSON struct {
	Protocol        string         `json:"protocol"`
	ProtocolVersion int            `json:"protocolVersion"`
	URL             string         `json:"url"`
	Events          string         `json:"events"`
	EventsLog       string         `json:"eventsLog"`
	Blobs           string         `json:"blobs"`
	AppEndpoints    []endpointJSON `json:"appEndpoints"`
}

type endpointJSON struct {
	Host     string `json:"host"`
	Port     int    `json:"port"`
	Protocol string `json:"protocol"`
}

func (h *InspectHandler) serveVersion(w http.ResponseWriter) {
	v := versionJSON{
		Protocol: "telo-debug", ProtocolVersion: 1, URL: h.SelfURL,
		Events: "/events", EventsLog: "/events.jsonl", Blobs: "/blobs/",
		AppEndpoints: []endpointJSON{},
	}
	for _, p := range h.Hub.Ports() {
		v.AppEndpoints = append(v.AppEndpoints, endpointJSON{Port: p.Port, Protocol: p.Protocol})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Access-Control-Allow-Origin", "*")
	_ = json.NewEncoder(w).Encode(v) // a failed write means the client left
}

// serveEvents writes the replay, then live frames and heartbeats, until the
// client leaves, is dropped for being slow, or the hub closes.
func (h *InspectHandler) serveEvents(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	hdr.Set("Content-Type", "text/event-stream")
	hdr.Set("Cache-Control", "no-cache")
	hdr.Set("Access-Control-Allow-Origin", "*")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)

	replay, sub := h.Hub.subscribe()
	if sub != nil {
		defer h.Hub.unsubscribe(sub)
	}
	for _, f := range replay {
		if writeFrame(w, f) != nil {
			return
		}
	}
	if rc.Flush() != nil || sub == nil {
		return
	}
	every := h.Heartbeat
	if every <= 0 {
		every = HeartbeatInterval
	}
	ping := time.NewTicker(every)
	defer ping.Stop()
	for {
		var err error
		select {
		case <-r.Context().Done():
			return
		case f, ok := <-sub.ch:
			if !ok {
				return
			}
			err = writeFrame(w, f)
		case <-ping.C:
			_, err = w.Write([]byte(": ping\n\n"))
		}
		if err != nil || rc.Flush() != nil {
			return
		}
	}
}

func writeFrame(w http.ResponseWriter, frame []byte) error {
	buf := make([]byte, 0, len(frame)+8)
	buf = append(buf, "data: "...)
	buf = append(buf, frame...)
	buf = append(buf, "\n\n"...)
	_, err := w.Write(buf)
	return err
}

// InspectServer is the per-process inspection endpoint. It owns its serving
// goroutine; Shutdown stops it and waits.
type InspectServer struct {
	ln   net.Listener
	srv  *http.Server
	done chan struct{}
}

// StartInspect listens on addr (failing if the port is taken) and serves
// hub until Shutdown.
func StartInspect(addr string, hub *Hub, log *slog.Logger) (*InspectServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen inspect %s: %w", addr, err)
	}
	s := &InspectServer{ln: ln, done: make(chan struct{})}
	s.srv = &http.Server{
		Handler:           &InspectHandler{Hub: hub, SelfURL: "http://" + ln.Addr().String()},
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.Error("serve inspect", "addr", addr, "err", err)
		}
	}()
	return s, nil
}

// Addr is the bound address.
func (s *InspectServer) Addr() net.Addr { return s.ln.Addr() }

// Shutdown waits (bounded by ctx) for in-flight responses — close the hub
// first so /events streams finish — then closes what is left and waits for
// the serving goroutine.
func (s *InspectServer) Shutdown(ctx context.Context) {
	if s.srv.Shutdown(ctx) != nil {
		_ = s.srv.Close() // hard stop; connections are gone either way
	}
	<-s.done
}
