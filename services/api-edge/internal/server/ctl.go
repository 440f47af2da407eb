package server

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/telorunner/telorunner/pkg/bus"
)

// ctl sends a control request to the session's owning driver: nil when
// it is done, a *contract.Error when the driver refused (bus.Call).
func (s *Server) ctl(ctx context.Context, id, verb string, hdr nats.Header, timeout time.Duration) error {
	return s.ctlData(ctx, id, verb, nil, hdr, timeout)
}

// ctlData is ctl with a request body.
func (s *Server) ctlData(ctx context.Context, id, verb string, data []byte, hdr nats.Header, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, _, err := bus.Call(ctx, s.nc, &nats.Msg{Subject: bus.CtlSubject(id, verb), Data: data, Header: hdr})
	return err
}
