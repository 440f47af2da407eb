package wsserver

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/telorunner/telorunner/pkg/merkle"
)

// nodeWalks is how many walks a tree node outlives once no walk produces
// it: a checkpoint that asked for the root finds the nodes below it even
// when a few other walks (another checkpoint, a restore) ran meanwhile.
const nodeWalks = 8

// nodeCache keeps the tree nodes (merkle) of the last nodeWalks walks by
// hash. Nodes are content-addressed: an entry is never stale, only
// dropped, and a node several walks share is kept once.
type nodeCache struct {
	mu    sync.Mutex
	walk  uint64
	nodes map[string]walkNode
}

type walkNode struct {
	data []byte
	walk uint64 // The last walk that produced it.
}

func newNodeCache() *nodeCache { return &nodeCache{nodes: map[string]walkNode{}} }

// add records the nodes of a new walk and drops those no walk of the
// last nodeWalks produced.
func (c *nodeCache) add(nodes map[string][]byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.walk++
	for h, data := range nodes {
		if n, ok := c.nodes[h]; ok {
			data = n.data
		}
		c.nodes[h] = walkNode{data: data, walk: c.walk}
	}
	for h, n := range c.nodes {
		if c.walk-n.walk >= nodeWalks {
			delete(c.nodes, h)
		}
	}
}

func (c *nodeCache) get(hash string) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, ok := c.nodes[hash]
	return n.data, ok
}

// nodes walks the workspace (file hashes from the cache where the stamp
// allows) and returns the encoding of its root node, keeping every node
// for getNode.
func (s *Server) nodes(r *http.Request) ([]byte, error) {
	files, err := s.tree(r.Context())
	if err != nil {
		return nil, walkFailure(err)
	}
	flat := make([]merkle.File, 0, len(files))
	skipped := 0
	for _, f := range files {
		if !utf8.ValidString(f.Path) {
			skipped++ // JSON (the tree, the change set) cannot name it either.
			continue
		}
		flat = append(flat, merkle.File{Path: f.Path, Hash: f.Hash, Size: f.size, Mode: f.mode})
	}
	if skipped > 0 {
		s.log.Warn("files left out of the tree: their paths are not UTF-8", "files", skipped)
	}
	b, err := merkle.Build(flat)
	if err != nil {
		return nil, walkFailure(err)
	}
	s.trees.add(b.Nodes)
	return b.Nodes[b.Root], nil
}

// getRoot is GET /workspace/node: it walks the workspace and answers the
// canonical encoding of its root node (whose SHA-256 names it).
func (s *Server) getRoot(w http.ResponseWriter, r *http.Request) error {
	data, err := s.nodes(r)
	if err != nil {
		return err
	}
	writeNode(w, data)
	return nil
}

// getNode is GET /workspace/node/{hash}: a node one of the last
// nodeWalks walks produced; 404 file_not_found for any other hash (walk
// again from the root).
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
