package imagebuild

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// File is one bundle file: its normalized path and decoded contents.
type File struct {
	Path     string
	Contents []byte
}

// TagInput is what a run image's tag is computed over (contract 11.11
// step 1).
type TagInput struct {
	BaseImage string
	// BaseDigest is the base image's resolved digest; set only when the
	// session's pullPolicy is always and resolution succeeded.
	BaseDigest string
	// TeloRegistryURL is the session's TELO_REGISTRY_URL ("" when none).
	TeloRegistryURL string
	Files           []File
}

// Tag is the first 32 hex characters of SHA-256 over the base image, the
// optional base digest, the Telo registry URL and the bundle's dependency
// key: its sorted import sources and controller locators, or, when the
// full-content fallback applies, every file sorted by path.
func Tag(in TagInput) string {
	h := sha256.New()
	field := func(parts ...string) {
		for _, p := range parts {
			io.WriteString(h, p)
			h.Write([]byte{0})
		}
	}
	field("base", in.BaseImage)
	if in.BaseDigest != "" {
		field("base-digest", in.BaseDigest)
	}
	field("telo-registry", in.TeloRegistryURL)
	key := DependencyKeyOf(in.Files)
	for _, s := range key.Imports {
		field("import", s)
	}
	for _, c := range key.Controllers {
		field("controller", c)
	}
	if key.FullContent {
		files := slices.Clone(in.Files)
		slices.SortFunc(files, func(a, b File) int { return strings.Compare(a.Path, b.Path) })
		for _, f := range files {
			field("file", f.Path, string(f.Contents))
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// DependencyKey is what a bundle's dependency closure depends on.
type DependencyKey struct {
	Imports     []string // import sources, sorted
	Controllers []string // controller locators, sorted
	// FullContent: some file failed to parse or a Definition has a
	// local_path, so the tag covers every file's contents.
	FullContent bool
}

// DependencyKeyOf parses every YAML document of every .yaml/.yml file
// shallowly: imports: values (a string, or an object's source) of every
// Telo.Application and Telo.Library document, and controllers: string
// entries of every Telo.Definition document. Other files do not take
// part (they cannot change what telo install fetches) unless a YAML file
// fails to parse or a Definition has a local_path (anywhere in the
// document): then FullContent is set.
func DependencyKeyOf(files []File) DependencyKey {
	var k DependencyKey
	for _, f := range files {
		if !isYAML(f.Path) {
			continue
		}
		dec := yaml.NewDecoder(bytes.NewReader(f.Contents))
		for {
			var doc yaml.Node
			err := dec.Decode(&doc)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				k.FullContent = true
				break
			}
			root := &doc
			if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
				root = root.Content[0]
			}
			if root.Kind != yaml.MappingNode {
				continue
			}
			switch scalar(field(root, "kind")) {
			case "Telo.Application", "Telo.Library":
				k.Imports = append(k.Imports, importSources(field(root, "imports"))...)
			case "Telo.Definition":
				if c := field(root, "controllers"); c != nil && c.Kind == yaml.SequenceNode {
					for _, e := range c.Content {
						if e.Kind == yaml.ScalarNode {
							k.Controllers = append(k.Controllers, e.Value)
						}
					}
				}
				if hasKey(root, "local_path") {
					k.FullContent = true
				}
			}
		}
	}
	slices.Sort(k.Imports)
	slices.Sort(k.Controllers)
	return k
}

func isYAML(p string) bool { return strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml") }

// field is the value of key in mapping m (nil when absent).
func field(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

func scalar(n *yaml.Node) string {
	if n == nil || n.Kind != yaml.ScalarNode {
		return ""
	}
	return n.Value
}

// importSources reads imports: as a name-keyed map or a list whose
// entries are a source string or an object with source.
func importSources(n *yaml.Node) []string {
	if n == nil {
		return nil
	}
	var entries []*yaml.Node
	switch n.Kind {
	case yaml.MappingNode:
		for i := 1; i < len(n.Content); i += 2 {
			entries = append(entries, n.Content[i])
		}
	case yaml.SequenceNode:
		entries = n.Content
	}
	var out []string
	for _, e := range entries {
		switch e.Kind {
		case yaml.ScalarNode:
			out = append(out, e.Value)
		case yaml.MappingNode:
			if s := scalar(field(e, "source")); s != "" {
				out = append(out, s)
			}
		}
	}
	return out
}

// hasKey reports whether key is a mapping key anywhere under n.
func hasKey(n *yaml.Node, key string) bool {
	if n == nil {
		return false
	}
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == key {
				return true
			}
		}
	}
	for _, c := range n.Content {
		if hasKey(c, key) {
			return true
		}
	}
	return false
}
