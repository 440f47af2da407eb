package checkpoint

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telorunner/telorunner/pkg/bus"
	"github.com/telorunner/telorunner/pkg/merkle"
)

// nodeCacheBytes bounds the encoded size of the tree nodes a Store keeps
// in memory (about 60,000 file entries).
const nodeCacheBytes = 8 << 20

// nodeCache is a least-recently-used set of tree nodes by hash. Nodes are
// content-addressed, so an entry is never stale; holding one says nothing
// about whether the store has it.
type nodeCache struct {
	mu    sync.Mutex
	max   int
	bytes int
	order *list.List // Of *cached, most recent first.
	byKey map[string]*list.Element
}

type cached struct {
	hash string
	node merkle.Node
	size int
}

func newNodeCache(maxBytes int) *nodeCache {
	return &nodeCache{max: maxBytes, order: list.New(), byKey: map[string]*list.Element{}}
}

func (c *nodeCache) get(hash string) (merkle.Node, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.byKey[hash]
	if !ok {
		return merkle.Node{}, false
	}
	c.order.MoveToFront(el)
	return el.Value.(*cached).node, true
}

// add keeps n (its encoding is size bytes), dropping the least recently
// used nodes beyond the bound.
func (c *nodeCache) add(hash string, n merkle.Node, size int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.byKey[hash]; ok || size > c.max {
		return
	}
	c.byKey[hash] = c.order.PushFront(&cached{hash: hash, node: n, size: size})
	c.bytes += size
	for c.bytes > c.max {
		old := c.order.Remove(c.order.Back()).(*cached)
		delete(c.byKey, old.hash)
		c.bytes -= old.size
	}
}

// node returns the stored tree node hash, from memory when it was seen
// recently; ErrMissingBlob when the store does not hold it.
func (s *Store) node(ctx context.Context, hash string) (merkle.Node, error) {
	if n, ok := s.nodes.get(hash); ok {
		return n, nil
	}
	name := bus.TreeKey(hash)
	ctx, cancel := bus.ObjectContext(ctx)
	defer cancel()
	data, err := s.blobs.GetBytes(ctx, name)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return merkle.Node{}, fmt.Errorf("tree node %s: %w", hash, ErrMissingBlob)
	}
	if err != nil {
		return merkle.Node{}, fmt.Errorf("get %s: %w", name, err)
	}
	n, err := merkle.DecodeAs(hash, data)
	if err != nil {
		return merkle.Node{}, fmt.Errorf("get %s: %w", name, err)
	}
	s.nodes.add(hash, n, len(data))
	return n, nil
}

// treeFiles returns the file map of the stored tree rooted at root.
func (s *Store) treeFiles(ctx context.Context, root string) (map[string]Entry, error) {
	flat, err := merkle.Flatten(ctx, root, s.node, s.opts.Concurrency)
	if err != nil {
		return nil, err
	}
	files := make(map[string]Entry, len(flat))
	for _, f := range flat {
		files[f.Path] = Entry{Hash: f.Hash, Size: f.Size, Mode: f.Mode}
	}
	return files, nil
}
