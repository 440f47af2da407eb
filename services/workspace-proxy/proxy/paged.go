package proxy

import (
	"context"
	"encoding/json"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/pkg/wsapi"
)

// replyOverhead is room left in a reply for its envelope and fields
// besides a page's data.
const replyOverhead = 4 << 10

// paged relays the paged operations (bus.WSTreePage, WSReadRange,
// WSStage): the caller sizes each page so that its reply fits one bus
// message; a page that could not is refused as invalid_request rather
// than left to fail in transit.
func (p *proxy) paged(ctx context.Context, c *wsapi.Client, op string, data []byte) (any, error) {
	switch op {
	case bus.WSTreePage:
		var r contract.WSTreePage
		if err := json.Unmarshal(data, &r); err != nil {
			return nil, contract.Errorf("invalid_request", "treepage: %v", err)
		}
		if budget := p.maxPayload - replyOverhead; r.Bytes <= 0 || int64(r.Bytes) > budget/2 {
			r.Bytes = int(budget / 2) // JSON escapes may grow what the server counted
		}
		return c.TreePage(ctx, r.After, r.Limit, r.Bytes)
	case bus.WSReadRange:
		var r contract.WSReadRange
		if err := json.Unmarshal(data, &r); err != nil {
			return nil, contract.Errorf("invalid_request", "readrange: %v", err)
		}
		path, err := contract.NormalizePath(r.Path)
		if err != nil {
			return nil, contract.Errorf("invalid_path", "%v", err)
		}
		if max := maxRange(p.maxPayload); r.Length <= 0 || r.Length > max || r.Offset < 0 {
			return nil, contract.Errorf("invalid_request", "readrange: length must be 1 to %d bytes and offset not negative", max)
		}
		rg, err := c.ReadRange(ctx, path, r.Offset, r.Length)
		if err != nil {
			return nil, err
		}
		return framed{result: contract.FileRange{Size: rg.Size, Stamp: rg.Stamp}, data: rg.Data}, nil
	default: // bus.WSStage
		var r contract.WSStage
		head, raw := contract.SplitFrame(data)
		if err := json.Unmarshal(head, &r); err != nil {
			return nil, contract.Errorf("invalid_request", "stage: %v", err)
		}
		r.Data = raw
		if r.Discard {
			return contract.StageResult{}, c.Discard(ctx, r.Upload)
		}
		path, err := contract.NormalizePath(r.Path)
		if err != nil {
			return nil, contract.Errorf("invalid_path", "%v", err)
		}
		n, err := c.Stage(ctx, r.Upload, path, r.Offset, r.Data)
		return contract.StageResult{Size: n}, err
	}
}

// framed is a result whose bytes travel raw after the JSON envelope
// (contract.AppendFrame).
type framed struct {
	result any
	data   []byte
}

// maxRange is the largest range whose reply fits a bus message of
// maxPayload bytes.
func maxRange(maxPayload int64) int {
	return int(maxPayload - replyOverhead)
}
