package contract

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
