package contract

import (
	"bytes"
	"encoding/json"
)

// Workspace shapes (section 3.10), shared by the edge, workspace-proxy and
// the workspace server.

// TreeFile is one file of a workspace tree.
type TreeFile struct {
	Path string `json:"path"`
	Hash string `json:"hash"`
}

// Tree is a workspace's content-hash tree.
type Tree struct {
	Files []TreeFile `json:"files"`
}

// WriteOp is one write of a change set.
type WriteOp struct {
	Path     string `json:"path"`
	Content  string `json:"content"`
	Encoding string `json:"encoding,omitempty"`
	// Mode, when not 0, gives the file those permission bits (a checkpoint
	// restore or a seed; internal to runner-ws and the workspace server,
	// never read from a /v1 client); 0 keeps an existing file's mode and
	// gives a new one 0644.
	Mode uint32 `json:"mode,omitempty"`
	// Staged names an upload (WSStage) holding the content instead of
	// Content; internal to runner-ws, never read from a client.
	Staged string `json:"staged,omitempty"`
}

// ChangeSet is a batch of writes and deletes.
type ChangeSet struct {
	Write  []WriteOp `json:"write,omitempty"`
	Delete []string  `json:"delete,omitempty"`
}

// ApplyResult answers a change set.
type ApplyResult struct {
	Written int `json:"written"`
	Deleted int `json:"deleted"`
}

// File is one file's content.
type File struct {
	Content string `json:"content"`
	Size    int64  `json:"size"`
}

// WSRead asks runner-ws to read one file.
type WSRead struct {
	Path     string `json:"path"`
	Encoding string `json:"encoding,omitempty"`
}

// WSTouch asks runner-ws to rewrite files with identical bytes.
type WSTouch struct {
	Paths []string `json:"paths"`
}

// Paged workspace operations. A NATS message is bounded (1 MB by default),
// so the edge moves a large file, tree or change set through runner-ws as
// pages each well under that bound, holding one page at a time.

// WSTreePage asks runner-ws for the files of the tree sorted after After
// (exclusive; "" starts at the beginning): at most Limit files and about
// Bytes bytes of JSON, whichever comes first (0 each: the workspace
// server's defaults).
type WSTreePage struct {
	After string `json:"after,omitempty"`
	Limit int    `json:"limit,omitempty"`
	Bytes int    `json:"bytes,omitempty"`
}

// TreePage is one page of a tree. More is true when files sort after the
// page's last one; the next page starts after that path.
type TreePage struct {
	Files []TreeFile `json:"files"`
	More  bool       `json:"more"`
}

// WSReadRange asks runner-ws for Length bytes of a file from Offset.
type WSReadRange struct {
	Path   string `json:"path"`
	Offset int64  `json:"offset"`
	Length int    `json:"length"`
}

// FileRange is a range of a file's bytes with the whole file's Size and
// Stamp, an opaque version of the file (identity, size and change times)
// read before the range: two ranges with the same Stamp come from the same
// unmodified file.
//
// On the bus a FileRange travels as a frame (AppendFrame): the reply's
// JSON envelope, a newline, then Data raw.
type FileRange struct {
	Data  []byte `json:"-"`
	Size  int64  `json:"size"`
	Stamp string `json:"stamp"`
}

// WSStage asks runner-ws to write Data at Offset of the upload Upload, a
// temporary file beside Path that no listing shows, until a write of the
// change set names it (WriteOp.Staged) and it is renamed into place whole.
// Discard drops the upload instead. On the bus it travels as a frame
// (AppendFrame) with Data raw.
type WSStage struct {
	Upload  string `json:"upload"`
	Path    string `json:"path"`
	Offset  int64  `json:"offset"`
	Data    []byte `json:"-"`
	Discard bool   `json:"discard,omitempty"`
}

// StageResult is an upload's size after a WSStage.
type StageResult struct {
	Size int64 `json:"size"`
}

// AppendFrame encodes a frame: head as JSON, a newline, then data raw.
// Pages of file bytes travel so, without base64 or JSON scanning. JSON
// from encoding/json holds no raw newline, so the first one ends the head.
func AppendFrame(head any, data []byte) ([]byte, error) {
	h, err := json.Marshal(head)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(h)+1+len(data))
	out = append(append(append(out, h...), '\n'), data...)
	return out, nil
}

// SplitFrame splits a frame into its JSON head and raw data; a message
// with no newline is all head (an error reply is plain JSON).
func SplitFrame(b []byte) (head, data []byte) {
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		return b[:i], b[i+1:]
	}
	return b, nil
}
