package wsserver

import (
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/telorunner/telorunner/pkg/merkle"
)

// nodeCache keeps the tree nodes (merkle) of the last two walks by hash,
// so a checkpoint that asked for the root can fetch the nodes below it
// even when another walk ran in between. Nodes are content-addressed:
// an entry is never stale, only dropped.
type nodeCache struct {
	mu   sync.Mutex
	cur  map[string][]byte
	prev map[string][]byte
}

func newNodeCache() *nodeCache {
	return &nodeCache{cur: map[string][]byte{}, prev: map[string][]byte{}}
}

// add makes nodes the latest walk's; the walk before stays findable.
func (c *nodeCache) add(nodes map[string][]byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.prev, c.cur = c.cur, nodes
}

func (c *nodeCache) get(hash string) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if data, ok := c.cur[hash]; ok {
		return data, true
	}
	data, ok := c.prev[hash]
	return data, ok
}

// nodes walks the workspace (file hashes from the cache where the stamp
// allows) and returns the hash of its root node, keeping every node for
// getNode.
func (s *Server) nodes(r *http.Request) (string, error) {
	files, err := s.tree(r.Context())
	if err != nil {
		return "", walkFailure(err)
	}
	flat := make([]merkle.File, len(files))
	for i, f := range files {
		flat[i] = merkle.File{Path: f.Path, Hash: f.Hash, Size: f.size, Mode: f.mode}
	}
	b, err := merkle.Build(flat)
	if err != nil {
		return "", walkFailure(err)
	}
	s.trees.add(b.Nodes)
	return b.Root, nil
}

// getRoot is GET /workspace/node: it walks the workspace and answers the
// canonical encoding of its root node (whose SHA-256 names it).
func (s *Server) getRoot(w http.ResponseWriter, r *http.Request) error {
	root, err := s.nodes(r)
	if err != nil {
		return err
	}
	data, _ := s.trees.get(root)
	writeNode(w, data)
	return nil
}

// getNode is GET /workspace/node/{hash}: a node of one of the last two
// walks; 404 file_not_found for any other hash (walk again from the root).
func (s *Server) getNode(w http.ResponseWriter, r *http.Request) error {
	hash := strings.ToLower(r.PathValue("hash"))
	if !isSHA256Hex(hash) {
		return badRequest("node: want 64 hex digits of SHA-256")
	}
	data, ok := s.trees.get(hash)
	if !ok {
		return notFound("no tree node of a recent walk has hash " + hash)
	}
	writeNode(w, data)
	return nil
}

func writeNode(w http.ResponseWriter, data []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(data) // The client went away; nothing left to tell it.
}
