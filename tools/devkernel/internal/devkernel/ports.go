package devkernel

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// CodePortInUse is the Kernel.RunFailed code of a declared port that cannot
// be bound.
const CodePortInUse = "ERR_PORT_IN_USE"

// portSet is the bound declared ports of one generation. It owns one
// goroutine per port; Close stops them and waits.
type portSet struct {
	wg      sync.WaitGroup
	closers []io.Closer
}

// bindPorts binds every declared port on host: tcp ports get an HTTP
// responder naming app, generation and port; udp ports echo datagrams. On a
// bind failure the ports bound so far are returned along with the error; the
// caller closes them.
func bindPorts(host, app string, gen int, ports []Port, log *slog.Logger) (*portSet, error) {
	s := &portSet{}
	for _, p := range ports {
		addr := net.JoinHostPort(host, strconv.Itoa(p.Port))
		if p.Protocol == "udp" {
			pc, err := net.ListenPacket("udp", addr)
			if err != nil {
				return s, fmt.Errorf("bind udp %s: %w", addr, err)
			}
			s.closers = append(s.closers, pc)
			s.wg.Go(func() { echoUDP(pc) })
			continue
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return s, fmt.Errorf("bind tcp %s: %w", addr, err)
		}
		body := fmt.Sprintf("devkernel %s generation %d port %d\n", app, gen, p.Port)
		srv := &http.Server{
			Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "text/plain; charset=utf-8")
				_, _ = io.WriteString(w, body) // a failed write means the client left
			}),
			ReadHeaderTimeout: 10 * time.Second,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		}
		s.closers = append(s.closers, srv)
		s.wg.Go(func() {
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				log.Warn("serve port", "addr", addr, "err", err)
			}
		})
	}
	return s, nil
}

func echoUDP(pc net.PacketConn) {
	buf := make([]byte, 64<<10)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return // closed
		}
		_, _ = pc.WriteTo(buf[:n], from) // best effort, like any UDP echo
	}
}

// Close closes every port and waits for their goroutines.
func (s *portSet) Close() {
	for _, c := range s.closers {
		_ = c.Close() // closing a listener we own; nothing to report
	}
	s.wg.Wait()
}
