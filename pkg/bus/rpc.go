package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/telorunner/telorunner/pkg/contract"
)

// Request/reply over the bus (runner.ctl.*, runner.ws.*): one encoder on
// the answering side (Reply, ReplyError), one decoder on the asking side
// (Call).
//
// The wire: a success is the JSON head {"ok":true,"result":<result>},
// optionally followed by a newline and raw bytes (contract.AppendFrame). An
// error goes through micro's Request.Error, so `nats micro stats` counts
// it: the headers Nats-Service-Error-Code (the contract error code) and
// Nats-Service-Error (its message), and the contract error JSON
// {"error":code,"message":...} as the body, the form repliers of earlier
// releases sent without headers. Call understands both, so callers and
// repliers of different releases talk during a rolling upgrade.

// replyHead is the JSON head of every reply.
type replyHead struct {
	OK      bool            `json:"ok"`
	Error   string          `json:"error,omitempty"`
	Message string          `json:"message,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
}

// Call sends msg and waits for its reply, bounded by ctx. A reply that
// carries an error is returned as a *contract.Error (code and message as
// the replier gave them); a transport failure (no responders, timeout) is
// returned as nats reports it. On success it returns the reply's result
// (JSON, "null" when the replier sent none; a JSON head without "error"
// is a success, as the decoders of earlier releases took it) and the raw bytes of a framed
// reply (nil for a plain one).
func Call(ctx context.Context, nc *nats.Conn, msg *nats.Msg) (result json.RawMessage, data []byte, err error) {
	reply, err := nc.RequestMsgWithContext(ctx, msg)
	if err != nil {
		return nil, nil, err
	}
	return decodeReply(reply)
}

// CallJSON is Call with req marshalled as the body (none when nil) and the
// result decoded into result (skipped when nil).
func CallJSON(ctx context.Context, nc *nats.Conn, subject string, req, result any) error {
	msg := &nats.Msg{Subject: subject}
	if req != nil {
		b, err := json.Marshal(req)
		if err != nil {
			return err
		}
		msg.Data = b
	}
	raw, _, err := Call(ctx, nc, msg)
	if err != nil || result == nil {
		return err
	}
	if err := json.Unmarshal(raw, result); err != nil {
		return fmt.Errorf("%s: undecodable result: %w", Op(subject), err)
	}
	return nil
}

// decodeReply maps one reply to its result or error (see the wire above).
func decodeReply(reply *nats.Msg) (json.RawMessage, []byte, error) {
	if code := reply.Header.Get(micro.ErrorCodeHeader); code != "" {
		ce := &contract.Error{Code: code, Message: reply.Header.Get(micro.ErrorHeader)}
		var body contract.Error
		if json.Unmarshal(reply.Data, &body) == nil && body.Code == code {
			ce.Message = body.Message // the body keeps what a header cannot (newlines)
		}
		return nil, nil, ce
	}
	head, data := contract.SplitFrame(reply.Data)
	var h replyHead
	if err := json.Unmarshal(head, &h); err != nil {
		return nil, nil, fmt.Errorf("%s: undecodable reply: %w", Op(reply.Subject), err)
	}
	if h.Error != "" {
		return nil, nil, &contract.Error{Code: h.Error, Message: h.Message}
	}
	if len(h.Result) == 0 {
		h.Result = json.RawMessage("null")
	}
	return h.Result, data, nil
}

// Reply answers req with success, result as the reply's result. A request
// sent without a reply subject (a publish) gets nothing.
func Reply(req micro.Request, result any) error {
	head, err := successHead(result)
	if err != nil {
		return ReplyError(req, err)
	}
	if req.Reply() == "" {
		return nil
	}
	b, err := json.Marshal(head)
	if err != nil {
		return err
	}
	return req.Respond(b)
}

// ReplyFrame is Reply with data framed after the head
// (contract.AppendFrame), for results that carry raw bytes.
func ReplyFrame(req micro.Request, result any, data []byte) error {
	head, err := successHead(result)
	if err != nil {
		return ReplyError(req, err)
	}
	if req.Reply() == "" {
		return nil
	}
	b, err := contract.AppendFrame(head, data)
	if err != nil {
		return err
	}
	return req.Respond(b)
}

func successHead(result any) (replyHead, error) {
	raw, err := json.Marshal(result)
	return replyHead{OK: true, Result: raw}, err
}

// ReplyError answers req with err through micro's error headers, with the
// contract error JSON as the body, and has the service's stats count it
// (micro's Request.Error). An error that is not a *contract.Error is sent as
// internal_error with its text. Call it only on the handler's goroutine,
// before the handler returns: micro reads the error when the handler
// returns. A reply sent later, from another goroutine, goes through
// ReplyErrorLater.
func ReplyError(req micro.Request, err error) error {
	return replyError(req, err, "internal_error", true)
}

// ReplyErrorAs is ReplyError with the code of an error that is not a
// *contract.Error.
func ReplyErrorAs(req micro.Request, err error, fallback string) error {
	return replyError(req, err, fallback, true)
}

// ReplyErrorLater is ReplyErrorAs for a handler that answers on another
// goroutine after it returned (runner-ws, the slow runner-ctl verbs): the
// same headers and body, but micro's stats cannot count it (they are
// taken when the handler returns; calling Request.Error then would race
// with them).
func ReplyErrorLater(req micro.Request, err error, fallback string) error {
	return replyError(req, err, fallback, false)
}

func replyError(req micro.Request, err error, fallback string, counted bool) error {
	if req.Reply() == "" {
		return nil
	}
	var ce *contract.Error
	if !errors.As(err, &ce) || ce.Code == "" {
		ce = &contract.Error{Code: fallback, Message: err.Error()}
	}
	body, mErr := json.Marshal(ce)
	if mErr != nil {
		return mErr
	}
	// A header value is one line.
	desc := strings.NewReplacer("\r", " ", "\n", " ").Replace(ce.Message)
	if desc == "" {
		desc = ce.Code // micro refuses an empty description
	}
	if counted {
		return req.Error(ce.Code, desc, body)
	}
	return req.Respond(body, micro.WithHeaders(micro.Headers{
		micro.ErrorHeader:     []string{desc},
		micro.ErrorCodeHeader: []string{ce.Code},
	}))
}

// Op is the last token of a runner.ctl.<id>.<verb> or runner.ws.<id>.<op>
// subject ("" for any other subject).
func Op(subject string) string {
	if _, op, ok := SessionOp(subject); ok {
		return op
	}
	return ""
}

// SessionOp splits a runner.ctl.<id>.<verb> or runner.ws.<id>.<op> subject
// into its session id and operation.
func SessionOp(subject string) (id, op string, ok bool) {
	rest, found := strings.CutPrefix(subject, SubjectCtlPrefix)
	if !found {
		if rest, found = strings.CutPrefix(subject, SubjectWSPrefix); !found {
			return "", "", false
		}
	}
	id, op, found = strings.Cut(rest, ".")
	if !found || id == "" || op == "" || strings.Contains(op, ".") {
		return "", "", false
	}
	return id, op, true
}

// Commands on StreamCmd.
const (
	CmdStart = "start"
	CmdAdopt = "adopt"
)

// CommandMsgID is the Nats-Msg-Id of one attempt of a command about a
// session: every publish of the same (command, session, attempt) carries
// the same id, so JetStream keeps one within the stream's duplicate window
// and a retried publish never queues the command twice. attempt names what
// makes a new attempt (the start's startRequestedAt, the owner key's
// revision an adoption replaces).
func CommandMsgID(cmd, sessionID, attempt string) string {
	return cmd + "-" + sessionID + "-" + attempt
}

// PublishCommand publishes command cmd (CmdStart or CmdAdopt) about session
// id on StreamCmd under the Nats-Msg-Id CommandMsgID(cmd, id, attempt).
func PublishCommand(ctx context.Context, js jetstream.JetStream, cmd, id, attempt string) error {
	var subject string
	switch cmd {
	case CmdStart:
		subject = CmdStartSubject(id)
	case CmdAdopt:
		subject = SubjectCmdAdopt
	default:
		return fmt.Errorf("unknown command %q", cmd)
	}
	msg := &nats.Msg{Subject: subject, Data: []byte(id), Header: nats.Header{}}
	msg.Header.Set(HeaderSession, id)
	msg.Header.Set(jetstream.MsgIDHeader, CommandMsgID(cmd, id, attempt))
	_, err := js.PublishMsg(ctx, msg)
	return err
}
