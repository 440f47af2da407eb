// Package checkpoint takes and restores incremental, content-addressed
// checkpoints of a watch session's workspace (design §6; it replaces the
// whole-tree base64 snapshot of contract 13.3, see 19.1 items 3–4).
//
// A checkpoint is a manifest, path → {hash, size, mode}, plus the time it
// was taken. File contents live once each in the object store runner_blobs
// under sha256/<hex>, shared by every session; the manifest lives in the
// key-value bucket runner_checkpoints under the session id. Take moves only
// what the store lacks: it diffs the workspace tree against the session's
// last manifest, asks the store about every hash that manifest does not
// hold (another session may have uploaded it), fetches and uploads only the
// missing blobs, four at a time, and writes the manifest last with
// compare-and-set on the previous revision. A failure anywhere, or a
// concurrent Take of the same session, leaves the previous manifest intact.
//
// # Where the manifest is stored
//
// A manifest entry costs about 140 bytes of JSON (a 64-digit hash, a size
// and a path), so a 10,000-file workspace encodes to about 1.4 MB, over the
// 1 MiB a NATS message (and so a key-value value) may carry by default
// (measured by TestManifestSize). A manifest whose encoded file map fits in
// Options.InlineLimit (256 KiB by default, about 1,800 files) is stored
// inline in the key-value value, readable with `nats kv get`. A larger one
// is stored as an object manifests/<sha256 of the encoded map> in
// runner_blobs and the value keeps only that name, the file count and
// takenAt. Manifest objects are content-addressed rather than named by
// session so that writing one never overwrites the manifest the current
// value points to: the key-value write stays the single commit point.
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
// latest record under another session's id, metadata only. A periodic
// Take of an unchanged tree writes nothing.
//
// # Garbage collection
//
// CollectGarbage deletes sha256/* and manifests/* objects that no stored
// manifest — latest or kept in a history — references and that are older than Options.Grace (10 minutes by
// default). The grace period covers Takes in flight, whose uploads are not
// referenced until their manifest is written; a Take that would write its
// manifest later than Grace after it started fails instead. A Take that
// relies on a blob it did not upload and that it found older than half the
// grace period refreshes the blob's modification time first, and the
// collector re-reads an object's time just before deleting it, so a blob
// adopted by a Take is not collected under it (a window of one round trip
// remains between that re-read and the delete). Run one collector at a
// time (the supervisor's leader) with the same grace as the writers.
//
// The workspace server reports no file modes, so Entry.Mode is 0
// ("unknown") today and a restored file gets the server's default mode.
package checkpoint
