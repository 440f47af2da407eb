// Command telorunner-events follows sessions' events straight from the
// runner's NATS JetStream bus, as another system would: it connects as the
// `subscriber` role, reads RUNNER_EVENTS with an ordered consumer (what the
// stream stored: replay, then live, without gap or duplicate) and prints
// one JSON line per event. The subjects, headers and payloads it reads are
// described by docs/asyncapi.yaml. It uses nothing but nats.go, so it is
// an example to copy.
//
//	telorunner-events --nats nats://127.0.0.1:4222 --nkey subscriber.nk [--session ID|all] [--from-seq N]
//
// Each line is {"session","seq","type","terminal","event"}: the session id
// (from the subject), the event's Runner-Seq (the SSE id), its Runner-Type,
// whether it is the session's terminal status (Runner-Terminal), and the
// event object itself.
//
// --from-seq N prints each session's events from Runner-Seq N on (default
// 1: everything the window still holds; 0: only events appended after the
// command started). With --session ID the command exits 0 once the
// session's terminal status was read (even when it lies before N: nothing
// follows it); with --session all it follows every session until
// interrupted.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The bus names this command relies on (docs/asyncapi.yaml).
const (
	stream         = "RUNNER_EVENTS"
	subjectPrefix  = "runner.evt."
	headerSeq      = "Runner-Seq"
	headerType     = "Runner-Type"
	headerTerminal = "Runner-Terminal"
)

// line is one output line.
type line struct {
	Session  string          `json:"session"`
	Seq      uint64          `json:"seq"`
	Type     string          `json:"type"`
	Terminal bool            `json:"terminal"`
	Event    json.RawMessage `json:"event"`
}

func main() {
	url := flag.String("nats", "nats://127.0.0.1:4222", "NATS server URL(s), comma separated")
	nkey := flag.String("nkey", os.Getenv("RUNNER_NATS_NKEY_FILE"), "file holding the subscriber role's nkey seed (default $RUNNER_NATS_NKEY_FILE; all-in-one: $RUNNER_DATA_DIR/credentials/subscriber.nk)")
	creds := flag.String("creds", "", "a NATS .creds file instead of --nkey (JWT-based installs)")
	inbox := flag.String("inbox-prefix", "_INBOX_subscriber", "reply subject prefix the role may receive on")
	session := flag.String("session", "all", "session id, or all")
	fromSeq := flag.Uint64("from-seq", 1, "first Runner-Seq to print, per session (0: only new events)")
	flag.Parse()
	if flag.NArg() != 0 || (*session != "all" && !validID(*session)) {
		fmt.Fprintln(os.Stderr, "usage: telorunner-events --nats URL --nkey FILE [--session ID|all] [--from-seq N]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *url, *nkey, *creds, *inbox, *session, *fromSeq); err != nil {
		fmt.Fprintln(os.Stderr, "telorunner-events:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, url, nkey, creds, inbox, session string, fromSeq uint64) error {
	opts := []nats.Option{nats.Name("telorunner-events"), nats.CustomInboxPrefix(inbox), nats.MaxReconnects(-1)}
	switch {
	case creds != "":
		opts = append(opts, nats.UserCredentials(creds))
	case nkey != "":
		o, err := nats.NkeyOptionFromSeed(nkey)
		if err != nil {
			return fmt.Errorf("nkey seed: %w", err)
		}
		opts = append(opts, o)
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}

	// One ordered consumer, filtered to one session's subject or to all of
	// them: JetStream replays what the stream holds and then delivers new
	// entries, and recreates the consumer by itself after a disconnect,
	// resuming where it was.
	filter := subjectPrefix + ">"
	if session != "all" {
		filter = subjectPrefix + session
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverAllPolicy}
	if fromSeq == 0 {
		cfg.DeliverPolicy = jetstream.DeliverNewPolicy
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	cons, err := js.OrderedConsumer(cctx, stream, cfg)
	cancel()
	if err != nil {
		return fmt.Errorf("follow %s: %w", filter, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return err
	}
	defer it.Stop()
	go func() { <-ctx.Done(); it.Stop() }()

	out := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(out)
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil // interrupted
			}
			return err
		}
		h := m.Headers()
		seq, _ := strconv.ParseUint(h.Get(headerSeq), 10, 64)
		l := line{
			Session:  strings.TrimPrefix(m.Subject(), subjectPrefix),
			Seq:      seq,
			Type:     h.Get(headerType),
			Terminal: h.Get(headerTerminal) != "",
			Event:    json.RawMessage(m.Data()),
		}
		if seq >= fromSeq {
			if err := enc.Encode(l); err != nil {
				return err
			}
			if err := out.Flush(); err != nil {
				return err
			}
		}
		if l.Terminal && session != "all" {
			return nil // nothing follows a session's terminal status
		}
	}
}

// validID reports whether s has a session id's shape, ^[a-z2-7]{12}$ (an
// id becomes a subject: `*`, `>` and `.` must not slip in).
func validID(s string) bool {
	if len(s) != 12 {
		return false
	}
	for _, c := range s {
		if (c < 'a' || c > 'z') && (c < '2' || c > '7') {
			return false
		}
	}
	return true
}
