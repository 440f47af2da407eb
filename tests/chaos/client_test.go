package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// The editor-shaped client. Each watch session has an SSE reader that
// resumes with Last-Event-ID across the edges, one io WebSocket per app
// that resumes with lastSeq, and an editor loop that writes and deletes
// files, edits app manifests (watch reloads), asks for reloads and types
// into the apps' stdin. Everything it sees is recorded for the checks.

// appSpec is one app of a chaos watch session: devkernel on a manifest in
// Telo's form (`ports:` omitted: the apps declare none, so a workload that
// moves between drivers never collides with its own ports).
type appSpec struct {
	name, entry, io string
}

var chaosApps = []appSpec{{"web", "web/telo.yaml", "tty"}, {"worker", "worker/telo.yaml", "streams"}}

// appManifest is the entry manifest of an app; rev varies the bytes so a
// write is a real edit.
func appManifest(name string, rev int) string {
	return fmt.Sprintf("kind: Telo.Application\nmetadata:\n  name: %s\n  description: chaos revision %d\n", name, rev)
}

// sseEvent is one frame of the events stream.
type sseEvent struct {
	ID   int
	Type string
	Data string
}

// ioChan is the client side of one app's byte channel.
type ioChan struct {
	app string

	mu     sync.Mutex
	conn   *websocket.Conn
	wmu    sync.Mutex // one writer at a time on conn
	maxSeq uint64     // the highest seq received
	dups   []string
	gaps   []string
	errs   errLog
	out    []byte // the last bytes received, for probes
	frames int
	ended  bool // closed 1000/4410: the session ended
}

func (c *ioChan) send(data []byte) error {
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()
	if conn == nil {
		return errors.New("not connected")
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
	return conn.WriteMessage(websocket.BinaryMessage, data)
}

func (c *ioChan) sawOutput(s string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Contains(c.out, []byte(s))
}

// session is one watch session as the client knows it.
type session struct {
	id    string
	edges []string

	mu        sync.Mutex
	events    []sseEvent
	maxID     int // the highest event id received
	dups      []string
	gaps      []string
	errs      errLog // missing, failed, unexpected responses
	terminal  string // the terminal status seen, if any
	deleted   bool   // the suite deleted it: terminal is expected
	missing   bool   // an edge answered 404 not_found for it
	io        map[string]*ioChan
	files     map[string]string // the workspace as the client wrote it
	pending   []wsOp            // writes not yet confirmed
	revs      map[string]int    // manifest revision per app
	genBroken map[string]bool   // a generation break already reported
	accepted  map[string]string // path → hash found by a check that reported it ("" absent)
	notes     int

	pause  chan chan struct{} // editor loop: pause request, answered when idle
	resume chan struct{}
	stop   context.CancelFunc // ends the session's readers and editor loop
}

func (s *session) errorf(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.errs = s.errs.add(fmt.Sprintf(format, args...))
}

// errLog keeps distinct messages in order, each with its first time and
// how often it recurred (a retry loop must not flood the report).
type errLog []errEntry

type errEntry struct {
	first time.Time
	msg   string
	n     int
}

func (l errLog) add(msg string) errLog {
	for i := range l {
		if l[i].msg == msg {
			l[i].n++
			return l
		}
	}
	if len(l) >= 20 {
		return l
	}
	return append(l, errEntry{time.Now().UTC(), msg, 1})
}

func (l errLog) strings() []string {
	var out []string
	for _, e := range l {
		x := e.first.Format("15:04:05.000 ") + e.msg
		if e.n > 1 {
			x += fmt.Sprintf(" (×%d)", e.n)
		}
		out = append(out, x)
	}
	return out
}

// edge picks an edge for the n-th request: requests alternate, so resumes
// and edits cross edges all the time.
func (s *session) edge(n int) string { return s.edges[n%len(s.edges)] }

// --- HTTP ---

type response struct {
	Status int
	Body   []byte
}

func doJSON(ctx context.Context, method, u string, body any) (response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return response{}, err
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return response{}, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return response{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	return response{resp.StatusCode, b}, err
}

func createBody() map[string]any {
	var files, apps []map[string]any
	for _, a := range chaosApps {
		files = append(files, map[string]any{"relativePath": a.entry, "contents": appManifest(a.name, 0)})
		apps = append(apps, map[string]any{"name": a.name, "entryRelativePath": a.entry, "ports": []any{}, "io": a.io})
	}
	files = append(files, map[string]any{"relativePath": "README.md", "contents": "chaos\n"})
	return map[string]any{
		"mode":    "watch",
		"bundle":  map[string]any{"entryRelativePath": chaosApps[0].entry, "files": files},
		"env":     map[string]any{},
		"config":  map[string]any{"image": "telorun/node:latest-slim", "pullPolicy": "missing"},
		"inspect": true,
		"apps":    apps,
	}
}

// createSession creates a watch session through edge and starts its readers.
func createSession(ctx context.Context, edges []string, n int) (*session, error) {
	resp, err := doJSON(ctx, "POST", edges[n%len(edges)]+"/v1/sessions", createBody())
	if err != nil {
		return nil, err
	}
	if resp.Status != 201 && resp.Status != 200 {
		return nil, fmt.Errorf("POST /v1/sessions = %d %s", resp.Status, resp.Body)
	}
	var c struct {
		SessionID string `json:"sessionId"`
	}
	if err := json.Unmarshal(resp.Body, &c); err != nil || c.SessionID == "" {
		return nil, fmt.Errorf("POST /v1/sessions: no sessionId in %s", resp.Body)
	}
	s := &session{
		id: c.SessionID, edges: edges, io: map[string]*ioChan{},
		files: map[string]string{"README.md": "chaos\n"}, revs: map[string]int{}, genBroken: map[string]bool{}, accepted: map[string]string{},
		pause: make(chan chan struct{}), resume: make(chan struct{}, 1),
	}
	for _, a := range chaosApps {
		s.files[a.entry] = appManifest(a.name, 0)
		s.io[a.name] = &ioChan{app: a.name}
	}
	return s, nil
}

// editor opens sessions and runs each one's readers and editing loop.
type editor struct {
	ctx   context.Context
	edges []string
	wg    sync.WaitGroup
	n     int
}

// open creates a session and starts following and editing it.
func (e *editor) open(ctx context.Context) (*session, error) {
	s, err := createSession(ctx, e.edges, e.n)
	e.n++
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(e.ctx)
	s.stop = cancel
	e.wg.Go(func() { s.readEvents(sctx) })
	for _, c := range s.io {
		e.wg.Go(func() { s.readIO(sctx, c) })
	}
	e.wg.Go(func() { s.edit(sctx) })
	return s, nil
}

// --- SSE ---

// readEvents follows the session's event stream until ctx ends or the
// stream ends after a terminal status, reconnecting (to the other edge)
// with Last-Event-ID. Every connection is also cut after a few seconds on
// purpose, so resumes happen all the time.
func (s *session) readEvents(ctx context.Context) {
	for n := 0; ctx.Err() == nil; n++ {
		done := s.followEvents(ctx, s.edge(n), 3*time.Second+time.Duration(rand.IntN(4000))*time.Millisecond)
		if done {
			return
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
}

func (s *session) followEvents(ctx context.Context, edge string, life time.Duration) (ended bool) {
	ctx, cancel := context.WithTimeout(ctx, life)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", edge+"/v1/sessions/"+s.id+"/events", nil)
	s.mu.Lock()
	last := s.maxID
	s.mu.Unlock()
	if last > 0 {
		req.Header.Set("Last-Event-ID", strconv.Itoa(last))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		s.mu.Lock()
		deleted := s.deleted
		s.mu.Unlock()
		if !deleted || resp.StatusCode != 404 {
			s.errorf("GET events on %s = %d %s", edge, resp.StatusCode, bytes.TrimSpace(b))
		}
		return deleted && resp.StatusCode == 404
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	var ev sseEvent
	hasID := false
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if ev.Type != "" || hasID {
				if s.record(ev, hasID, edge) {
					return true
				}
			}
			ev, hasID = sseEvent{}, false
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "id: "):
			ev.ID, _ = strconv.Atoi(strings.TrimPrefix(line, "id: "))
			hasID = true
		case strings.HasPrefix(line, "event: "):
			ev.Type = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			ev.Data = strings.TrimPrefix(line, "data: ")
		}
	}
	return false
}

// record files one event; it reports a terminal status (the stream ends).
func (s *session) record(ev sseEvent, hasID bool, edge string) (terminal bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !hasID {
		if ev.Type == "gap" {
			s.gaps = append(s.gaps, fmt.Sprintf("gap frame after id %d on %s: %s", s.maxID, edge, ev.Data))
		}
		return false
	}
	switch {
	case ev.ID <= s.maxID:
		s.dups = append(s.dups, fmt.Sprintf("id %d again after %d (%s on %s)", ev.ID, s.maxID, ev.Type, edge))
		return false
	case ev.ID > s.maxID+1:
		s.gaps = append(s.gaps, fmt.Sprintf("ids %d..%d never sent: got %d after %d on %s", s.maxID+1, ev.ID-1, ev.ID, s.maxID, edge))
	}
	s.maxID = ev.ID
	s.events = append(s.events, ev)
	if ev.Type == "status" {
		var st struct {
			Status struct {
				Kind    string `json:"kind"`
				Message string `json:"message"`
			} `json:"status"`
		}
		_ = json.Unmarshal([]byte(ev.Data), &st)
		switch st.Status.Kind {
		case "failed", "stopped", "exited":
			s.terminal = st.Status.Kind + " " + st.Status.Message
			if !s.deleted {
				s.errs = s.errs.add(fmt.Sprintf("session ended: status %s (event %d)", ev.Data, ev.ID))
			}
			return true
		}
	}
	return false
}

// runStarts is the generation of every `run started` event of app, in order.
func (s *session) runStarts(app string) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var gens []int
	for _, e := range s.events {
		if e.Type != "run" {
			continue
		}
		var r struct {
			App        string `json:"app"`
			Phase      string `json:"phase"`
			Generation int    `json:"generation"`
		}
		if json.Unmarshal([]byte(e.Data), &r) == nil && r.App == app && r.Phase == "started" {
			gens = append(gens, r.Generation)
		}
	}
	return gens
}

// --- io ---

// readIO follows one app's byte channel until ctx ends or the session
// ended, reconnecting (to the other edge) with lastSeq.
func (s *session) readIO(ctx context.Context, c *ioChan) {
	for n := 1; ctx.Err() == nil; n++ {
		if c.follow(ctx, s, s.edge(n), 4*time.Second+time.Duration(rand.IntN(4000))*time.Millisecond) {
			return
		}
		sleepCtx(ctx, 150*time.Millisecond)
	}
}

func (c *ioChan) follow(ctx context.Context, s *session, edge string, life time.Duration) (ended bool) {
	c.mu.Lock()
	last := c.maxSeq
	c.mu.Unlock()
	u := "ws" + strings.TrimPrefix(edge, "http") + "/v1/sessions/" + s.id + "/io?" +
		url.Values{"app": {c.app}, "lastSeq": {strconv.FormatUint(last, 10)}}.Encode()
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	conn, _, err := websocket.DefaultDialer.DialContext(dctx, u, nil)
	cancel()
	if err != nil {
		return false
	}
	c.mu.Lock()
	c.conn = conn
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.conn = nil
		c.mu.Unlock()
		_ = conn.Close()
	}()
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	timer := time.AfterFunc(life, func() { _ = conn.Close() })
	defer timer.Stop()
	first := true
	for {
		kind, data, err := conn.ReadMessage()
		if err != nil {
			var ce *websocket.CloseError
			if errors.As(err, &ce) {
				s.mu.Lock()
				deleted := s.deleted
				s.mu.Unlock()
				switch ce.Code {
				case websocket.CloseNormalClosure, 4410:
					c.mu.Lock()
					c.ended = true
					c.mu.Unlock()
					if !deleted {
						c.errorf("io closed %d %q on %s: the session ended", ce.Code, ce.Text, edge)
					}
					return true
				case 4404:
					if !deleted {
						c.errorf("io closed 4404 %q on %s", ce.Text, edge)
					}
					return deleted
				}
			}
			return false
		}
		if kind == websocket.TextMessage {
			var f struct {
				Type, Reason, App string
				Seq               uint64
			}
			_ = json.Unmarshal(data, &f)
			switch {
			case first && f.Type != "seq":
				c.errorf("first io frame on %s is %s, want seq", edge, data)
			case f.Type == "seq" && f.Seq != last:
				c.errorf("io seq frame on %s echoes %d, asked for lastSeq %d", edge, f.Seq, last)
			case f.Type == "gap":
				c.mu.Lock()
				c.gaps = append(c.gaps, fmt.Sprintf("gap frame after seq %d on %s: %s", c.maxSeq, edge, data))
				c.mu.Unlock()
			}
			first = false
			continue
		}
		first = false
		if len(data) < 5 {
			c.errorf("short io frame (%d bytes) on %s", len(data), edge)
			continue
		}
		seq := uint64(binary.BigEndian.Uint32(data[:4]))
		c.mu.Lock()
		c.frames++
		switch {
		case seq <= c.maxSeq:
			c.dups = append(c.dups, fmt.Sprintf("seq %d again after %d on %s", seq, c.maxSeq, edge))
		default:
			if seq > c.maxSeq+1 {
				c.gaps = append(c.gaps, fmt.Sprintf("seqs %d..%d never sent: got %d after %d on %s", c.maxSeq+1, seq-1, seq, c.maxSeq, edge))
			}
			c.maxSeq = seq
			c.out = append(c.out, data[5:]...)
			if len(c.out) > 1<<16 {
				c.out = append([]byte(nil), c.out[len(c.out)-1<<15:]...)
			}
		}
		c.mu.Unlock()
	}
}

func (c *ioChan) errorf(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.errs = c.errs.add(fmt.Sprintf(format, args...))
}

// --- the editor loop ---

// wsOp is one workspace change: a write (content) or a delete.
type wsOp struct {
	path    string
	content string
	del     bool
}

// edit runs editor actions every few hundred milliseconds until ctx ends.
// A workspace change is retried until an edge confirms it (200); pause
// returns once no change is in flight.
func (s *session) edit(ctx context.Context) {
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case ack := <-s.pause:
			close(ack)
			select {
			case <-s.resume:
			case <-ctx.Done():
				return
			}
		case <-time.After(time.Duration(400+rand.IntN(500)) * time.Millisecond):
		}
		switch n % 6 {
		case 0, 3: // a new note
			s.mu.Lock()
			s.notes++
			p := fmt.Sprintf("notes/n%03d.txt", s.notes)
			s.mu.Unlock()
			s.apply(ctx, n, wsOp{path: p, content: fmt.Sprintf("note %d of %s\n", n, s.id)})
		case 1: // an app edit: a watch reload
			a := chaosApps[(n/6)%len(chaosApps)]
			s.mu.Lock()
			s.revs[a.name]++
			rev := s.revs[a.name]
			s.mu.Unlock()
			s.apply(ctx, n, wsOp{path: a.entry, content: appManifest(a.name, rev)})
		case 2: // typing into an app
			a := chaosApps[(n/6)%len(chaosApps)]
			_ = s.io[a.name].send(fmt.Appendf(nil, "typed %d\n", n))
		case 4: // a reload
			_, _ = doJSON(ctx, "POST", s.edge(n)+"/v1/sessions/"+s.id+"/reload?app="+chaosApps[(n/6)%len(chaosApps)].name, nil)
		case 5: // delete an older note
			s.mu.Lock()
			k := s.notes - 2
			s.mu.Unlock()
			if k > 0 && k%3 == 0 {
				s.apply(ctx, n, wsOp{path: fmt.Sprintf("notes/n%03d.txt", k), del: true})
			}
		}
	}
}

// apply sends one change until an edge confirms it, for up to 20 s;
// unconfirmed, it stays pending and settle sends it again.
func (s *session) apply(ctx context.Context, n int, op wsOp) {
	s.mu.Lock()
	s.pending = append(s.pending, op)
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for i := n; ctx.Err() == nil && !s.gone(); i++ {
		if s.send(ctx, s.edge(i), op) {
			return
		}
		sleepCtx(ctx, 250*time.Millisecond)
	}
}

// gone reports a session the runner ended or lost (and the suite did not
// delete): nothing more can be asked of it.
func (s *session) gone() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.deleted && (s.terminal != "" || s.missing)
}

// send posts op once; true when it was confirmed (and is now expected).
func (s *session) send(ctx context.Context, edge string, op wsOp) bool {
	body := map[string]any{"write": []map[string]any{{"path": op.path, "content": op.content}}}
	want := `{"written":1,"deleted":0}`
	if op.del {
		body, want = map[string]any{"delete": []string{op.path}}, `{"written":0,"deleted":1}`
	}
	resp, err := doJSON(ctx, "POST", edge+"/v1/sessions/"+s.id+"/workspace", body)
	if err != nil {
		return false
	}
	switch {
	case resp.Status == 200 && string(resp.Body) == want:
	case resp.Status == 200:
		s.errorf("POST workspace %s = 200 %s, want %s", op.path, resp.Body, want)
	case resp.Status == 404 || resp.Status == 400:
		s.errorf("POST workspace %s = %d %s", op.path, resp.Status, resp.Body)
		if resp.Status == 404 && strings.Contains(string(resp.Body), `"not_found"`) {
			s.mu.Lock()
			s.missing = true
			s.mu.Unlock()
		}
		return false
	default: // 409 not_running, 429, 5xx while a fault heals: retried
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if op.del {
		delete(s.files, op.path)
	} else {
		s.files[op.path] = op.content
	}
	delete(s.accepted, op.path)
	for i, p := range s.pending {
		if p == op {
			s.pending = append(s.pending[:i], s.pending[i+1:]...)
			break
		}
	}
	return true
}

// quiesce pauses the editor loop (it finishes the change in flight).
func (s *session) quiesce(ctx context.Context) {
	ack := make(chan struct{})
	select {
	case s.pause <- ack:
		<-ack
	case <-ctx.Done():
	}
}

func (s *session) unquiesce() { s.resume <- struct{}{} }

// settle sends every change left unconfirmed again, so the expected tree
// is known, until ctx ends.
func (s *session) settle(ctx context.Context) error {
	for {
		s.mu.Lock()
		if len(s.pending) == 0 {
			s.mu.Unlock()
			return nil
		}
		op := s.pending[0]
		s.mu.Unlock()
		for i := 0; !s.send(ctx, s.edge(i), op); i++ {
			if s.gone() {
				return fmt.Errorf("workspace change to %s never confirmed: the session is gone", op.path)
			}
			if ctx.Err() != nil {
				return fmt.Errorf("workspace change to %s never confirmed: %w", op.path, ctx.Err())
			}
			sleepCtx(ctx, 250*time.Millisecond)
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
