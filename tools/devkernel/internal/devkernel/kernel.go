package devkernel

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"
)

// Environment variables devkernel reads.
const (
	EnvBindHost   = "DEVKERNEL_BIND_HOST" // host for declared ports; default $POD_IP, else 0.0.0.0
	EnvPodIP      = "POD_IP"              // the pod's own address, when the platform gives it
	EnvNoColor    = "NO_COLOR"
	EnvColorForce = "CLICOLOR_FORCE"
)

const (
	defaultBindHost = "0.0.0.0"
	failAtMessage   = "devkernel: failAt start"
	colourOn        = "\x1b[32m"
	colourOff       = "\x1b[0m"
)

// Main runs devkernel with the process's command-line arguments (without the
// program name) and returns the exit code. Cancelling ctx is SIGTERM/SIGINT:
// the running generation stops and Main returns as the contract says.
// stdout and stderr receive unbuffered writes; stdout is checked for a TTY
// when it is an *os.File. Environment: DEVKERNEL_BIND_HOST, NO_COLOR,
// CLICOLOR_FORCE, POD_IP (bind it instead of the wildcard: pods that
// share a host network, like the stand-in kubelet's, then never collide).
func Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "install" {
		return Install(ctx, args[1:], stdout, stderr)
	}
	opts, err := ParseArgs(args)
	if err != nil {
		fmt.Fprintf(stderr, "devkernel: %v\n%s\n", err, Usage)
		return 2
	}
	if opts.Help {
		fmt.Fprintln(stdout, Usage)
		return 0
	}
	podIP := os.Getenv(EnvPodIP)
	bindHost := os.Getenv(EnvBindHost)
	if bindHost == "" {
		bindHost = cmp.Or(podIP, defaultBindHost)
	}
	if opts.Inspect {
		opts.InspectAddr = PodAddr(opts.InspectAddr, podIP)
	}
	peer, err := ParsePeerWorkload(os.Environ())
	if err != nil {
		fmt.Fprintf(stderr, "devkernel: %v\n", err)
		return 2
	}
	tty := isTerminal(stdout)
	errw := &lockedWriter{w: stderr}
	k := &kernel{
		opts:     opts,
		entry:    EntryFile(opts.Path),
		bindHost: bindHost,
		tty:      tty,
		colour:   useColour(tty, os.Getenv),
		stdout:   &lockedWriter{w: stdout},
		stderr:   errw,
		hub:      NewHub(nil),
		log:      slog.New(slog.NewTextHandler(errw, &slog.HandlerOptions{Level: slog.LevelWarn})),
		peer:     peer,
		gate:     make(chan struct{}),
	}
	return k.run(ctx, stdin)
}

type kernel struct {
	opts     Options
	entry    string
	bindHost string
	tty      bool
	colour   bool
	stdout   *lockedWriter
	stderr   *lockedWriter
	hub      *Hub
	log      *slog.Logger
	changes  chan struct{} // debounced entry changes; nil without --watch
	peer     *PeerWorkload // PEER_* keys set: the peer's workload (peer.go)
	gate     chan struct{} // closed by the first stdin byte (PEER_GATE=stdin)
	gateOnce sync.Once
}

type endKind int

const (
	endExited     endKind = iota // exitAfterMs or a start failure
	endSignal                    // ctx cancelled
	endChange                    // watched file changed
	endLoadFailed                // the manifest did not load
)

type genEnd struct {
	kind endKind
	code int
}

func (k *kernel) run(ctx context.Context, stdin io.Reader) int {
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	if k.opts.Inspect {
		srv, err := StartInspect(k.opts.InspectAddr, k.hub, k.log)
		if err != nil {
			fmt.Fprintf(k.stderr, "devkernel: %v\n", err)
			return 1
		}
		defer func() {
			k.hub.Close() // ends /events streams after their queued frames
			sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			defer scancel()
			srv.Shutdown(sctx)
		}()
	}
	if stdin != nil {
		// The echo goroutine is the one this function does not wait for: a
		// blocking read of fd 0 cannot be interrupted, so it lives until
		// stdin reaches EOF or the process exits.
		if k.peer != nil {
			rawTerminal(stdin)
			go k.peerStdin(stdin)
		} else {
			go k.echo(stdin)
		}
	}
	if k.opts.Watch {
		k.changes = make(chan struct{}, 1)
		w := NewWatcher(k.entry, 0, 0)
		wg.Go(func() { w.Run(ctx, k.changes) })
	}

	for gen := 1; ; gen++ {
		end := k.generation(ctx, gen)
		switch {
		case end.kind == endSignal:
			return 0
		case end.kind == endChange:
			continue
		case end.kind == endLoadFailed && !k.opts.Watch:
			return 1
		}
		if k.opts.Watch {
			select {
			case <-ctx.Done():
				return 0
			case <-k.changes:
				continue
			}
		}
		if k.opts.Inspect && k.peer == nil {
			<-ctx.Done() // hold open for the inspector, as the CLI does
		}
		return end.code
	}
}

// generation runs one load → start → stop cycle and reports how it ended.
func (k *kernel) generation(ctx context.Context, gen int) genEnd {
	m, err := LoadManifest(k.entry, os.LookupEnv)
	if err != nil {
		k.fail(PhaseLoad, CodeManifestInvalid, err.Error())
		return genEnd{kind: endLoadFailed, code: 1}
	}
	d := m.Dev.StartDelay
	if k.peer != nil && k.peer.StartDelay > 0 {
		d = k.peer.StartDelay
	}
	if d > 0 {
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return genEnd{kind: endSignal}
		case <-t.C:
		}
	}
	k.hub.Event(EventInitialized, nil)
	k.hub.Event(EventStarting, nil)
	k.hub.SetPorts(m.Ports)
	k.hub.Event(EventPortsResolved, portsPayload{Ports: portsJSON(m.Ports)})

	if m.Dev.FailAtStart {
		k.fail(PhaseStart, m.Dev.FailCode, failAtMessage)
		k.stop(1, nil)
		return genEnd{kind: endExited, code: 1}
	}
	ports, err := bindPorts(k.bindHost, m.Name, gen, m.Ports, k.log)
	if err != nil {
		k.fail(PhaseStart, CodePortInUse, err.Error())
		k.stop(1, ports)
		return genEnd{kind: endExited, code: 1}
	}
	k.banner(m.Name, gen)
	k.hub.Event(EventStarted, nil)
	if k.peer != nil {
		end := k.peerGeneration(ctx)
		k.stop(end.code, ports)
		return end
	}

	outCtx, stopOut := context.WithCancel(ctx)
	defer stopOut()
	outDone := make(chan struct{})
	go func() { // owned: waited for below before the generation ends
		defer close(outDone)
		if err := writePattern(outCtx, k.stdout, m.Dev.OutputBytes); err != nil && !errors.Is(err, context.Canceled) {
			k.log.Warn("write output", "err", err)
		}
	}()
	var exitAfter <-chan time.Time
	if m.Dev.ExitAfter != nil {
		t := time.NewTimer(*m.Dev.ExitAfter)
		defer t.Stop()
		exitAfter = t.C
	}
	end := genEnd{kind: endExited, code: m.Dev.ExitCode}
	select {
	case <-ctx.Done():
		end = genEnd{kind: endSignal}
	case <-k.changes:
		end = genEnd{kind: endChange}
	case <-exitAfter:
		// A one-shot ends once its output is out, unless interrupted.
		select {
		case <-outDone:
		case <-ctx.Done():
			end = genEnd{kind: endSignal}
		case <-k.changes:
			end = genEnd{kind: endChange}
		}
	}
	stopOut()
	<-outDone
	k.stop(end.code, ports)
	return end
}

// fail reports Kernel.RunFailed on the wire and on stderr. An empty code is
// omitted from the payload.
func (k *kernel) fail(phase, code, message string) {
	k.hub.Event(EventRunFailed, runFailedPayload{Phase: phase, Code: code, Message: message})
	if code != "" {
		message = code + ": " + message
	}
	fmt.Fprintf(k.stderr, "devkernel: %s failed: %s\n", phase, message)
}

// stop tears a generation down: Stopping, close the ports, Stopped.
func (k *kernel) stop(code int, ports *portSet) {
	k.hub.Event(EventStopping, nil)
	if ports != nil {
		ports.Close()
	}
	k.hub.Event(EventStopped, stoppedPayload{ExitCode: code})
}

func (k *kernel) banner(app string, gen int) {
	line := fmt.Sprintf("devkernel %s generation %d tty=%t", app, gen, k.tty)
	if k.colour {
		line = colourOn + line + colourOff
	}
	_, _ = io.WriteString(k.stdout, line+"\n") // nowhere to report a lost stdout
	k.hub.Log("stdout", line)
	ready := fmt.Sprintf("devkernel %s ready", app)
	_, _ = io.WriteString(k.stderr, ready+"\n")
	k.hub.Log("stderr", ready)
}

// echo copies stdin lines to stdout as "echo: <line>" until EOF.
func (k *kernel) echo(stdin io.Reader) {
	r := bufio.NewReader(stdin)
	for {
		line, err := r.ReadString('\n')
		if line != "" {
			line = strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r")
			_, _ = io.WriteString(k.stdout, "echo: "+line+"\n")
		}
		if err != nil {
			return
		}
	}
}

// PodAddr narrows a wildcard host:port (0.0.0.0, ::, empty host) to podIP
// when podIP is set; any other address is returned as given.
func PodAddr(addr, podIP string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || podIP == "" {
		return addr
	}
	if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
		return addr
	}
	return net.JoinHostPort(podIP, port)
}
