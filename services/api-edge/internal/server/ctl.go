package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
)

// ctl sends a control request to the session's owning driver and maps its
// answer: {ok:true} is nil, {error,message} is a *contract.Error.
func (s *Server) ctl(ctx context.Context, id, verb string, hdr nats.Header, timeout time.Duration) error {
	return s.ctlData(ctx, id, verb, nil, hdr, timeout)
}

// ctlData is ctl with a request body.
func (s *Server) ctlData(ctx context.Context, id, verb string, data []byte, hdr nats.Header, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	msg := &nats.Msg{Subject: bus.CtlSubject(id, verb), Data: data, Header: hdr}
	reply, err := s.nc.RequestMsgWithContext(ctx, msg)
	if err != nil {
		return err
	}
	var ans struct {
		OK      bool   `json:"ok"`
		Error   string `json:"error"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(reply.Data, &ans); err != nil {
		return fmt.Errorf("decode %s reply: %w", verb, err)
	}
	if !ans.OK {
		if ans.Error == "" {
			return errors.New("control request failed without a code")
		}
		return &contract.Error{Code: ans.Error, Message: ans.Message}
	}
	return nil
}
