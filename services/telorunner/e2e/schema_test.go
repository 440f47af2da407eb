package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"sigs.k8s.io/yaml"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/testkit"
	"github.com/telorunner/telorunner/services/telorunner/allinone"
)

// The published event schema, docs/asyncapi.yaml, is checked against the
// real bus: every runner an end-to-end test starts on its embedded NATS
// gets a busWatch, which reads everything RUNNER_EVENTS and RUNNER_IO
// store (as the subscriber role, with ordered consumers, the way the
// document tells other systems to) and fails the test on any message the
// document does not describe: an event type it does not list, a header or
// payload its schemas refuse, a Runner-Terminal on the wrong status, a
// Runner-Seq that does not grow, an io chunk with an
// unknown tag or a size out of bounds. TestEventSchema runs a
// representative set of sessions and checks every documented event type
// appeared.

// asyncAPIFile is the document, relative to this package.
const asyncAPIFile = "../../../docs/asyncapi.yaml"

// docSchemas is docs/asyncapi.yaml compiled.
type docSchemas struct {
	doc     map[string]any
	events  map[string]docMessage // the events channel's messages by their Runner-Type
	chunk   docMessage            // the io channel's message
	tags    map[byte]string       // chunk stream tags
	minData int                   // chunk output bytes after the tag
	maxData int
}

type docMessage struct {
	name             string
	headers, payload *jsonschema.Schema
}

var (
	schemaOnce sync.Once
	schemas    *docSchemas
	schemaErr  error
)

// loadSchemas compiles docs/asyncapi.yaml once per test binary.
func loadSchemas(t testing.TB) *docSchemas {
	t.Helper()
	schemaOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		b, err := os.ReadFile(filepath.Join(filepath.Dir(file), asyncAPIFile))
		if err == nil {
			schemas, err = compileSchemas(b)
		}
		schemaErr = err
	})
	if schemaErr != nil {
		t.Fatalf("docs/asyncapi.yaml: %v", schemaErr)
	}
	return schemas
}

// compileSchemas compiles the header and payload schema of every message
// of the events and io channels (JSON Schema draft 7, which AsyncAPI 3.0's
// schema format extends), with the whole document as the resource their
// $refs point into.
func compileSchemas(yamlDoc []byte) (*docSchemas, error) {
	js, err := yaml.YAMLToJSON(yamlDoc)
	if err != nil {
		return nil, err
	}
	docAny, err := jsonschema.UnmarshalJSON(bytes.NewReader(js))
	if err != nil {
		return nil, err
	}
	doc, ok := docAny.(map[string]any)
	if !ok || doc["asyncapi"] != "3.0.0" {
		return nil, fmt.Errorf("not an AsyncAPI 3.0.0 document")
	}
	const base = "file:///asyncapi.json"
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft7)
	if err := c.AddResource(base, doc); err != nil {
		return nil, err
	}
	s := &docSchemas{doc: doc, events: map[string]docMessage{}}
	message := func(channel, key string) (docMessage, map[string]any, error) {
		ref, _ := lookup(doc, "/channels/"+channel+"/messages/"+key+"/$ref").(string)
		if !strings.HasPrefix(ref, "#/components/messages/") {
			return docMessage{}, nil, fmt.Errorf("channel %s message %s: $ref %q, want #/components/messages/…", channel, key, ref)
		}
		m, _ := lookup(doc, ref[1:]).(map[string]any)
		if m == nil {
			return docMessage{}, nil, fmt.Errorf("%s: not in the document", ref)
		}
		h, err := c.Compile(base + ref + "/headers")
		if err != nil {
			return docMessage{}, nil, err
		}
		dm := docMessage{name: key, headers: h}
		if channel == "events" {
			if dm.payload, err = c.Compile(base + ref + "/payload"); err != nil {
				return docMessage{}, nil, err
			}
		}
		return dm, m, nil
	}
	evMsgs, _ := lookup(doc, "/channels/events/messages").(map[string]any)
	for key := range evMsgs {
		dm, m, err := message("events", key)
		if err != nil {
			return nil, err
		}
		// The Runner-Type this message is for: the const of its headers schema.
		href, _ := lookup(m, "/headers/$ref").(string)
		typ, _ := lookup(doc, strings.TrimPrefix(href, "#")+"/properties/Runner-Type/const").(string)
		if typ == "" {
			return nil, fmt.Errorf("message %s: its headers schema has no Runner-Type const", key)
		}
		if _, dup := s.events[typ]; dup {
			return nil, fmt.Errorf("two messages for Runner-Type %s", typ)
		}
		s.events[typ] = dm
	}
	if len(s.events) == 0 {
		return nil, fmt.Errorf("the events channel lists no message")
	}
	dm, m, err := message("io", "chunk")
	if err != nil {
		return nil, err
	}
	s.chunk = dm
	frame, _ := m["x-telorunner-frame"].(map[string]any)
	tags, _ := frame["tags"].(map[string]any)
	s.tags = map[byte]string{}
	for k, v := range tags {
		n, err := strconv.ParseUint(k, 10, 8)
		if err != nil {
			return nil, fmt.Errorf("x-telorunner-frame tag %q: %v", k, err)
		}
		s.tags[byte(n)], _ = v.(string)
	}
	if s.minData, err = intOf(frame["minPayloadBytes"]); err != nil {
		return nil, fmt.Errorf("x-telorunner-frame minPayloadBytes: %v", err)
	}
	if s.maxData, err = intOf(frame["maxPayloadBytes"]); err != nil {
		return nil, fmt.Errorf("x-telorunner-frame maxPayloadBytes: %v", err)
	}
	if len(s.tags) == 0 || s.maxData < s.minData {
		return nil, fmt.Errorf("x-telorunner-frame incomplete: %v", frame)
	}
	return s, nil
}

func intOf(v any) (int, error) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, fmt.Errorf("%v is not a number", v)
	}
	i, err := n.Int64()
	return int(i), err
}

// lookup follows a JSON pointer (no escapes needed in our keys beyond ~1).
func lookup(v any, ptr string) any {
	for _, tok := range strings.Split(strings.TrimPrefix(ptr, "/"), "/") {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[strings.ReplaceAll(tok, "~1", "/")]
	}
	return v
}

// headerDoc is a message's headers as the JSON object header schemas
// validate: each name with its (first) value.
func headerDoc(h nats.Header) map[string]any {
	out := map[string]any{}
	for k, v := range h {
		if len(v) > 0 {
			out[k] = v[0]
		}
	}
	return out
}

// checkEvent validates one stored message of runner.evt.<id>; it returns
// the event's type and its status kind, run phase or reachability state
// ("" for other types).
func (s *docSchemas) checkEvent(m *nats.Msg) (typ, sub string, err error) {
	typ = m.Header.Get(bus.HeaderType)
	dm, ok := s.events[typ]
	if !ok {
		return typ, "", fmt.Errorf("event type %q (Runner-Type) is not described in docs/asyncapi.yaml: %s", typ, m.Data)
	}
	if err := dm.headers.Validate(headerDoc(m.Header)); err != nil {
		return typ, "", fmt.Errorf("%s headers %v: %v", typ, m.Header, err)
	}
	payload, err := jsonschema.UnmarshalJSON(bytes.NewReader(m.Data))
	if err != nil {
		return typ, "", fmt.Errorf("%s payload is not JSON: %v: %s", typ, err, m.Data)
	}
	if err := dm.payload.Validate(payload); err != nil {
		return typ, "", fmt.Errorf("%s payload %s: %v", typ, m.Data, err)
	}
	if got, _ := payload.(map[string]any)["type"].(string); got != typ {
		return typ, "", fmt.Errorf("payload type %q under Runner-Type %q", got, typ)
	}
	switch typ {
	case contract.EventStatus:
		sub, _ = lookup(payload, "/status/kind").(string)
		if terminal := m.Header.Get(bus.HeaderTerminal) == "1"; terminal != contract.IsTerminal(sub) {
			return typ, sub, fmt.Errorf("status %s with Runner-Terminal %q", sub, m.Header.Get(bus.HeaderTerminal))
		}
	case contract.EventRun:
		sub, _ = lookup(payload, "/phase").(string)
	case contract.EventReachability:
		sub, _ = lookup(payload, "/state").(string)
	}
	return typ, sub, nil
}

// checkChunk validates one stored message of runner.io.<id>.<app>.
func (s *docSchemas) checkChunk(m *nats.Msg) error {
	if err := s.chunk.headers.Validate(headerDoc(m.Header)); err != nil {
		return fmt.Errorf("io chunk headers %v: %v", m.Header, err)
	}
	if len(m.Data) == 0 {
		return fmt.Errorf("io chunk without its tag byte")
	}
	if _, ok := s.tags[m.Data[0]]; !ok {
		return fmt.Errorf("io chunk tag %d is not described (%v)", m.Data[0], s.tags)
	}
	if n := len(m.Data) - 1; n < s.minData || n > s.maxData {
		return fmt.Errorf("io chunk of %d output bytes, want %d..%d", n, s.minData, s.maxData)
	}
	return nil
}

// busWatch validates everything a runner's bus stores (see the top of
// this file).
type busWatch struct {
	s    *docSchemas
	nc   *nats.Conn
	stop []func()

	mu     sync.Mutex
	errs   []string
	counts map[string]int // event type, and type:sub (checkEvent) -> count
	chunks int
	seqs   map[string]uint64 // subject -> last Runner-Seq seen
}

// watchBus starts a busWatch on r's embedded NATS as the subscriber role.
func watchBus(t *testing.T, r *runner) *busWatch {
	t.Helper()
	w := &busWatch{s: loadSchemas(t), counts: map[string]int{}, seqs: map[string]uint64{}}
	kp, err := bus.LoadSeed(bus.SeedFile(allinone.CredentialsDir(r.DataDir), bus.RoleSubscriber))
	if err != nil {
		t.Fatalf("schema watch: %v", err)
	}
	auth, err := bus.ClientOptions(bus.RoleSubscriber, kp, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Its own connection, closed by close (the runner's stop), not by a
	// cleanup that could run before the runner stops.
	if w.nc, err = nats.Connect(r.NATSURL, auth...); err != nil {
		t.Fatalf("schema watch: connect as subscriber: %v", err)
	}
	ok := false
	defer func() {
		if !ok {
			w.nc.Close()
		}
	}()
	js, err := jetstream.New(w.nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range []struct{ stream, filter string }{
		{bus.StreamEvents, bus.SubjectEventsPrefix + ">"},
		{bus.StreamIO, bus.SubjectIOPrefix + ">"},
	} {
		cons, err := js.OrderedConsumer(ctx, c.stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{c.filter}})
		if err != nil {
			t.Fatalf("schema watch: ordered consumer on %s as subscriber: %v", c.stream, err)
		}
		cc, err := cons.Consume(func(m jetstream.Msg) {
			w.check(&nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
		})
		if err != nil {
			t.Fatalf("schema watch: consume %s: %v", c.stream, err)
		}
		w.stop = append(w.stop, cc.Stop)
	}
	ok = true
	return w
}

func (w *busWatch) check(m *nats.Msg) {
	w.mu.Lock()
	defer w.mu.Unlock()
	seq, _ := strconv.ParseUint(m.Header.Get(bus.HeaderSeq), 10, 64)
	// Runner-Seq grows per subject; it may skip (the window evicted
	// entries before they were read) and restarts at 1 only where a
	// channel was deleted and made again (an app dropped and re-added).
	if last, ok := w.seqs[m.Subject]; ok && seq <= last && seq != 1 {
		w.fail("%s: Runner-Seq %d after %d", m.Subject, seq, last)
	}
	w.seqs[m.Subject] = seq
	if strings.HasPrefix(m.Subject, bus.SubjectIOPrefix) {
		w.chunks++
		if err := w.s.checkChunk(m); err != nil {
			w.fail("%s: %v", m.Subject, err)
		}
		return
	}
	typ, sub, err := w.s.checkEvent(m)
	w.counts[typ]++
	if sub != "" {
		w.counts[typ+":"+sub]++
	}
	if err != nil {
		w.fail("%s: %v", m.Subject, err)
	}
}

func (w *busWatch) fail(format string, args ...any) {
	if len(w.errs) < 20 {
		w.errs = append(w.errs, fmt.Sprintf(format, args...))
	}
}

// close stops reading after what the stream holds was read (best effort:
// a runner being stopped stores nothing more) and fails t on every
// mismatch found.
func (w *busWatch) close(t *testing.T) {
	t.Helper()
	w.settle(2 * time.Second)
	for _, stop := range w.stop {
		stop()
	}
	w.stop = nil
	w.nc.Close()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range w.errs {
		t.Errorf("docs/asyncapi.yaml: %s", e)
	}
}

// settle waits until no message arrived for 200 ms (at most d).
func (w *busWatch) settle(d time.Duration) {
	last, since := w.count(), time.Now()
	testkit.Poll(context.Background(), d, func() bool {
		if n := w.count(); n != last {
			last, since = n, time.Now()
		}
		return time.Since(since) >= 200*time.Millisecond
	})
}

func (w *busWatch) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := w.chunks
	for k, c := range w.counts {
		if !strings.Contains(k, ":") {
			n += c
		}
	}
	return n
}

// saw reports how many events of key (a type, or type:sub) were read.
func (w *busWatch) saw(key string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.counts[key]
}

// seen reports the keys (types and type:sub) read so far, sorted, and
// the number of io chunks.
func (w *busWatch) seen() (keys []string, chunks int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for k := range w.counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys, w.chunks
}
