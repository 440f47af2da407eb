// Package merkle is the Merkle tree of a workspace's directories that
// checkpoints are taken and stored with (design §6): each directory is a
// node listing its children, and a node is named by the SHA-256 of its
// canonical encoding, so two trees share every node whose subtree is
// equal and one changed file changes only the nodes on its path.
//
// The workspace server builds the nodes of the live tree (Build) and the
// checkpoint store keeps them, content-addressed, beside the file blobs.
// Only directories holding at least one file (at any depth) are nodes:
// an empty directory is not part of the tree, as it is not part of the
// flat listing. It has no dependencies beyond the standard library, so
// the workspace-server binary can use it.
package merkle

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/telorunner/telorunner/pkg/parallel"
)

// Kinds of an Entry.
const (
	KindFile = "file"
	KindDir  = "dir"
)

// MaxMode is the largest file mode a node records: the permission bits.
const MaxMode = 0o777

// Entry is one child of a directory node.
type Entry struct {
	Name string `json:"name"` // Base name: UTF-8, no "/" or NUL, not "", "." or "..".
	Kind string `json:"kind"` // KindFile or KindDir.
	// Hash is the lowercase hex SHA-256 of a file's bytes, or of a
	// directory's node encoding.
	Hash string `json:"hash"`
	// Size is a file's bytes, or the bytes of every file below a directory.
	Size int64 `json:"size"`
	// Mode is a file's permission bits (0 for a directory).
	Mode uint32 `json:"mode,omitempty"`
	// Files counts the files below a directory (0 for a file).
	Files int `json:"files,omitempty"`
}

// Node is one directory: its children sorted by name in byte order.
type Node struct {
	Entries []Entry `json:"entries"`
}

// Encode returns the canonical encoding of n (JSON, entries in name
// order), whose SHA-256 is the node's hash.
func (n Node) Encode() []byte {
	if n.Entries == nil {
		n.Entries = []Entry{}
	}
	n.Entries = slices.Clone(n.Entries)
	slices.SortFunc(n.Entries, func(a, b Entry) int { return strings.Compare(a.Name, b.Name) })
	data, err := json.Marshal(n)
	if err != nil {
		panic(fmt.Sprintf("merkle: encode node: %v", err)) // Strings and integers only.
	}
	return data
}

// Totals returns the files and bytes below n.
func (n Node) Totals() (files int, bytes int64) {
	for _, e := range n.Entries {
		if e.Kind == KindDir {
			files += e.Files
		} else {
			files++
		}
		bytes += e.Size
	}
	return files, bytes
}

// Lookup returns the entry named name.
func (n Node) Lookup(name string) (Entry, bool) {
	i, ok := slices.BinarySearchFunc(n.Entries, name, func(e Entry, name string) int { return strings.Compare(e.Name, name) })
	if !ok {
		return Entry{}, false
	}
	return n.Entries[i], true
}

// Hash returns the lowercase hex SHA-256 of data.
func Hash(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// Decode parses a node encoding and checks that it is one: hashes of 64
// lowercase hex digits, plain names in strictly increasing order, known
// kinds, no negative sizes, a mode only within MaxMode. It does not check
// the encoding's hash; the caller compares Hash(data) with the name it
// asked for.
func Decode(data []byte) (Node, error) {
	var n Node
	if err := json.Unmarshal(data, &n); err != nil {
		return Node{}, fmt.Errorf("decode tree node: %w", err)
	}
	for i, e := range n.Entries {
		if err := e.check(); err != nil {
			return Node{}, fmt.Errorf("tree node entry %d: %w", i, err)
		}
		if i > 0 && n.Entries[i-1].Name >= e.Name {
			return Node{}, fmt.Errorf("tree node entry %d: %q out of order", i, e.Name)
		}
	}
	return n, nil
}

func (e Entry) check() error {
	switch {
	case e.Name == "" || e.Name == "." || e.Name == ".." || strings.ContainsAny(e.Name, "/\x00"):
		return fmt.Errorf("name %q: not a plain file name", e.Name)
	case !utf8.ValidString(e.Name):
		return fmt.Errorf("name %q: not UTF-8 (JSON cannot carry it)", e.Name)
	case e.Kind != KindFile && e.Kind != KindDir:
		return fmt.Errorf("%q: kind %q: want %s or %s", e.Name, e.Kind, KindFile, KindDir)
	case !ValidHash(e.Hash):
		return fmt.Errorf("%q: hash %q: want 64 lowercase hex digits", e.Name, e.Hash)
	case e.Size < 0 || e.Files < 0:
		return fmt.Errorf("%q: negative size or count", e.Name)
	case e.Mode > MaxMode:
		return fmt.Errorf("%q: mode %o: only permission bits", e.Name, e.Mode)
	}
	return nil
}

// ValidHash reports whether h is 64 lowercase hex digits.
func ValidHash(h string) bool {
	if len(h) != 64 {
		return false
	}
	for i := range len(h) {
		if c := h[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// File is one regular file of a flat listing.
type File struct {
	Path string // Relative, "/"-separated, normalized.
	Hash string // Lowercase hex SHA-256 of the bytes.
	Size int64
	Mode uint32 // Permission bits.
}

// Built is the tree of a flat listing: its root node's hash and every
// node's encoding by hash.
type Built struct {
	Root  string
	Nodes map[string][]byte
}

// Build returns the tree of files. A path listed twice, or both as a file
// and as a directory, is an error. No files give the empty root node.
func Build(files []File) (Built, error) {
	b := Built{Nodes: map[string][]byte{}}
	type dir struct {
		files map[string]File
		dirs  map[string]*dir
	}
	newDir := func() *dir { return &dir{files: map[string]File{}, dirs: map[string]*dir{}} }
	root := newDir()
	for _, f := range files {
		if f.Mode > MaxMode {
			return Built{}, fmt.Errorf("build tree: %q: mode %o: only permission bits", f.Path, f.Mode)
		}
		parts := strings.Split(f.Path, "/")
		d := root
		for _, seg := range parts[:len(parts)-1] {
			if _, clash := d.files[seg]; clash {
				return Built{}, fmt.Errorf("build tree: %q: %q is a file", f.Path, seg)
			}
			next, ok := d.dirs[seg]
			if !ok {
				next = newDir()
				d.dirs[seg] = next
			}
			d = next
		}
		base := parts[len(parts)-1]
		if _, dup := d.files[base]; dup {
			return Built{}, fmt.Errorf("build tree: %q listed twice", f.Path)
		}
		if _, clash := d.dirs[base]; clash {
			return Built{}, fmt.Errorf("build tree: %q is a directory", f.Path)
		}
		d.files[base] = f
	}
	var encode func(d *dir) (Entry, error)
	encode = func(d *dir) (Entry, error) {
		var n Node
		for name, f := range d.files {
			n.Entries = append(n.Entries, Entry{Name: name, Kind: KindFile, Hash: f.Hash, Size: f.Size, Mode: f.Mode})
		}
		for name, sub := range d.dirs {
			e, err := encode(sub)
			if err != nil {
				return Entry{}, err
			}
			e.Name = name
			n.Entries = append(n.Entries, e)
		}
		for _, e := range n.Entries {
			if err := e.check(); err != nil {
				return Entry{}, fmt.Errorf("build tree: %w", err)
			}
		}
		data := n.Encode()
		h := Hash(data)
		b.Nodes[h] = data
		files, bytes := n.Totals()
		return Entry{Kind: KindDir, Hash: h, Size: bytes, Files: files}, nil
	}
	e, err := encode(root)
	if err != nil {
		return Built{}, err
	}
	b.Root = e.Hash
	return b, nil
}

// ErrNodeMismatch is returned when a node's bytes do not hash to its name.
var ErrNodeMismatch = errors.New("tree node does not match its hash")

// DecodeAs decodes data as the node named hash, checking the name.
func DecodeAs(hash string, data []byte) (Node, error) {
	if Hash(data) != hash {
		return Node{}, fmt.Errorf("node %s: %w", hash, ErrNodeMismatch)
	}
	return Decode(data)
}

// Getter returns the node named hash (checked against it).
type Getter func(ctx context.Context, hash string) (Node, error)

// Flatten returns every file of the tree rooted at root, in no particular
// order, fetching the nodes of one level at a time with at most workers
// fetches in flight.
func Flatten(ctx context.Context, root string, get Getter, workers int) ([]File, error) {
	type dir struct{ path, hash string }
	level := []dir{{"", root}}
	var files []File
	for len(level) > 0 {
		nodes := make([]Node, len(level))
		err := parallel.Do(ctx, len(level), workers, func(ctx context.Context, i int) error {
			var err error
			nodes[i], err = get(ctx, level[i].hash)
			return err
		})
		if err != nil {
			return nil, err
		}
		var next []dir
		for i, n := range nodes {
			for _, e := range n.Entries {
				p := e.Name
				if level[i].path != "" {
					p = level[i].path + "/" + e.Name
				}
				if e.Kind == KindDir {
					next = append(next, dir{p, e.Hash})
				} else {
					files = append(files, File{Path: p, Hash: e.Hash, Size: e.Size, Mode: e.Mode})
				}
			}
		}
		level = next
	}
	return files, nil
}
