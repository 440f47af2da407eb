// Package checkpoint takes and restores incremental, content-addressed
// checkpoints of a watch session's workspace (design §6; it replaces the
// whole-tree base64 snapshot of contract 13.3, see 19.1 items 3–4).
//
// # Trees, nodes and blobs
//
// A checkpoint is a Merkle tree of directories (package merkle): each
// directory holding files is a node listing its children (name, kind file
// or dir, hash, size, and a file's permission bits), named by the SHA-256
// of its canonical encoding. File contents live once each in the object
// store runner_blobs under sha256/<hex>, nodes under trees/<hex>, both
// shared by every session; the key-value bucket runner_checkpoints holds,
// under the session id, the root's hash with the file count, bytes, time,
// id, reason and history. Manifest is the flat view, path → {hash, size,
// mode}, that Load and LoadCheckpoint build by walking the nodes.
//
// Take moves only what the store lacks. It asks the workspace (the
// workspace server's GET /workspace/node) for its root node and compares
// it with the previous checkpoint's root, descending level by level only
// into directories whose hash differs: one changed file reads and writes
// the nodes on its path and its blob, nothing else, and an unchanged tree
// reads the root and writes nothing. Nodes of the previous checkpoint come
// from a bounded in-memory cache of the Store or from the store. A blob
// the previous tree does not hold is looked up in the store (another
// session may have uploaded it) and fetched and uploaded only when
// missing, four at a time; new nodes are written after the blobs, and
// the key-value value last, with compare-and-set on the previous
// revision. A failure anywhere, or a concurrent Take of the same session,
// leaves the previous checkpoint intact. A mode change alone is a change
// (a new node, no blob).
//
// Checkpoints stored before trees hold the file map itself, inline in
// the value or in an object manifests/<sha256 of the encoded map> the
// value names. They still load, fork and are collected correctly; a Take
// over one builds the previous tree in memory and writes every node of
// the new one (its blobs are known). Their entries have Mode 0
// ("unknown"), which a restore leaves to the workspace server's default.
//
// # History
//
// Each checkpoint has an id (a per-session sequence from 1) and a reason
// (ReasonPeriodic, ReasonSuspend, ReasonManual, ReasonRestore,
// ReasonFork). The session's key also holds the history index, newest
// first, bounded by Options.History (RUNNER_CHECKPOINT_HISTORY, 64 by
// default); entry n's record is also stored under HistoryKey(session,
// n mod history), so the entry that falls out of the history is
// overwritten rather than deleted. LoadCheckpoint reads a kept entry;
// History (the edge: bucket only) lists them; Fork copies a session's
// latest record under another session's id, metadata only (the root
// hash). A periodic Take of an unchanged tree writes nothing.
//
// # Garbage collection
//
// CollectGarbage deletes sha256/*, trees/* and manifests/* objects that no
// stored checkpoint — latest or kept in a history — references and that
// are older than Options.Grace (10 minutes by default); it walks every
// checkpoint's tree, each distinct node once. The grace period covers
// Takes in flight, whose uploads are not referenced until their record is
// written; a Take that would write its record later than Grace after it
// started fails instead. A Take that relies on a blob or node it did not
// upload and that it found older than half the grace period refreshes its
// modification time first, and the collector re-reads an object's time
// just before deleting it, so an object adopted by a Take is not
// collected under it (a window of one round trip remains between that
// re-read and the delete). What a Take relies on without looking (the
// previous checkpoint's unchanged subtrees and blobs) is referenced by
// the session's latest record until the Take replaces it. Run one
// collector at a time (the supervisor's leader) with the same grace as
// the writers.
package checkpoint
