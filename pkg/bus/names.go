// Package bus holds every NATS JetStream name telorunner uses (streams,
// buckets, object stores, subjects, headers) and the plumbing on top of them:
// idempotent provisioning, the per-subject log with contiguous sequences, and
// compare-and-set helpers for key-value records.
//
// Names live in this file and nowhere else.
package bus

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"time"
)

// Streams.
const (
	StreamEvents = "RUNNER_EVENTS" // runner.evt.<sessionId>
	StreamIO     = "RUNNER_IO"     // runner.io.<sessionId>.<app>
	StreamCmd    = "RUNNER_CMD"    // runner.cmd.start.<sessionId>, runner.cmd.adopt (work queue)
)

// Key-value buckets.
const (
	BucketSessions    = "runner_sessions"    // <sessionId> -> session record
	BucketOwners      = "runner_owners"      // <sessionId> -> driver id (TTL)
	BucketPresence    = "runner_presence"    // <sessionId>.<edgeId> -> live client count (TTL)
	BucketAdmission   = "runner_admission"   // ledger -> admission counts; reclaim.<class>.<sessionId> -> reclaim index
	BucketCheckpoints = "runner_checkpoints" // <sessionId> -> checkpoint manifest
	BucketBuilds      = "runner_builds"      // <BuildKey(ref)> -> driver id building ref (TTL)
	BucketBundles     = "runner_bundles_kv"  // <sessionId> -> a bundle of at most BundleKVMax bytes (larger: ObjectBundles)
)

// BuildLockTTL is how long a run-image build lock (BucketBuilds) lives
// without renewal: a holder renews it every third of this.
const BuildLockTTL = 30 * time.Second

// BuildKey is the BucketBuilds key of an image ref: "ref-" and the first 32
// hex characters of its SHA-256 (a ref's ':' and '/' are not key
// characters).
func BuildKey(ref string) string {
	sum := sha256.Sum256([]byte(ref))
	return "ref-" + hex.EncodeToString(sum[:16])
}

// BundleKVMax is the largest encoded bundle stored in BucketBundles (one
// publish); a larger one goes to ObjectBundles in chunks. Well under the
// server's default max_payload (1 MiB).
const BundleKVMax = 256 << 10

// Object stores.
const (
	ObjectBundles = "runner_bundles" // <sessionId>: bundles larger than BundleKVMax, and every bundle stored before BucketBundles
	ObjectBlobs   = "runner_blobs"   // sha256/<hex>
)

// KeyLeader is the BucketOwners key the active supervisor holds (never a
// session id's shape, so no session's owner key collides with it).
const KeyLeader = "_supervisor"

// KeyAdmissionLedger is BucketAdmission's head: the retained count, live
// watch sessions, admissions and evictions in flight, the reclaim cursors.
const KeyAdmissionLedger = "ledger"

// KeyAdmissionSlots is the first ledger (every retained id in one value),
// read once to build KeyAdmissionLedger and then deleted.
const KeyAdmissionSlots = "slots"

// Reclaim classes of the admission index.
const (
	ReclaimEnded     = "ended"     // terminal sessions, by exitedAt
	ReclaimSuspended = "suspended" // suspended sessions, by idleSince
)

// ReclaimKey is a session's entry in the reclaim index of class.
func ReclaimKey(class, id string) string { return "reclaim." + class + "." + id }

// ReclaimSubjects is the stream subject filter of class's index entries
// (in KV_runner_admission).
func ReclaimSubjects(class string) string {
	return "$KV." + BucketAdmission + ".reclaim." + class + ".*"
}

// Subjects.
const (
	SubjectEventsPrefix = "runner.evt."
	SubjectIOPrefix     = "runner.io."
	// SubjectCmdStart is the start command subject of releases before
	// per-session start subjects; drivers still take it. Publish on
	// CmdStartSubject.
	SubjectCmdStart = "runner.cmd.start"
	// SubjectCmdStartPrefix + <sessionId> asks a driver to start a
	// session. One subject per session lets anyone see whether a start is
	// still queued (the work queue keeps it until a driver, having claimed
	// the owner key, acks it).
	SubjectCmdStartPrefix = "runner.cmd.start."
	SubjectCmdAdopt       = "runner.cmd.adopt"
	SubjectCmdAll         = "runner.cmd.>"
	SubjectCtlPrefix      = "runner.ctl."
	SubjectWSPrefix       = "runner.ws."
	// SubjectProbe is answered by one driver (queue group QueueDrivers)
	// with its backend's setup issues (contract.ProbeReply).
	SubjectProbe = "runner.probe"
)

// QueueDrivers is the queue group of the drivers' core subscriptions.
const QueueDrivers = "drivers"

// Consumers.
const (
	// ConsumerDrivers is the durable pull consumer on StreamCmd shared by
	// every pod-driver.
	ConsumerDrivers = "drivers"
)

// Request/reply service names (nats.go/micro).
const (
	ServiceCtl = "runner-ctl"
	ServiceWS  = "runner-ws"
)

// Control verbs on runner.ctl.<sessionId>.<verb>.
const (
	CtlStop    = "stop"
	CtlStdin   = "stdin"
	CtlResize  = "resize"
	CtlApps    = "apps"
	CtlSuspend = "suspend"
)

// Workspace operations on runner.ws.<sessionId>.<op>.
const (
	WSTree       = "tree"
	WSRead       = "read"
	WSApply      = "apply"
	WSTouch      = "touch"
	WSFreeze     = "freeze" // {"frozen": bool}: the workspace takes no more writes (a suspend's final checkpoint)
	WSCheckpoint = "checkpoint"
	WSRestore    = "restore"
	// Paged operations: each request and reply stays well under the NATS
	// max payload whatever the size of the file, tree or change set.
	WSTreePage  = "treepage"  // contract.WSTreePage -> contract.TreePage
	WSReadRange = "readrange" // contract.WSReadRange -> contract.FileRange
	WSStage     = "stage"     // contract.WSStage -> contract.StageResult
)

// Headers.
const (
	// HeaderSeq carries the contiguous per-subject sequence of a log entry.
	HeaderSeq = "Runner-Seq"
	// HeaderSession names the session a command is about.
	HeaderSession = "Runner-Session"
	// HeaderType carries an event's type, so relays need not parse it.
	HeaderType = "Runner-Type"
	// HeaderTerminal marks a status event whose status is terminal.
	HeaderTerminal = "Runner-Terminal"
	// HeaderApp names the app a control request is for.
	HeaderApp = "Runner-App"
	// HeaderDeadline carries the Unix time in milliseconds after which the
	// sender of a control request no longer waits for it: the receiver
	// must not act on it then (SetDeadline, Expired).
	HeaderDeadline = "Runner-Deadline"
)

// EventsSubject is the event log subject of a session.
func EventsSubject(sessionID string) string { return SubjectEventsPrefix + sessionID }

// IOSubject is the byte log subject of one app channel of a session.
func IOSubject(sessionID, app string) string { return SubjectIOPrefix + sessionID + "." + app }

// IOSubjects matches every app channel of a session.
func IOSubjects(sessionID string) string { return SubjectIOPrefix + sessionID + ".>" }

// CmdStartSubject is the start command subject of a session.
func CmdStartSubject(sessionID string) string { return SubjectCmdStartPrefix + sessionID }

// StartAttempt names the attempt of a start requested at requested (the
// record's startRequestedAt): the same for every publish of one start, so
// JetStream keeps one (CommandMsgID).
func StartAttempt(requested time.Time) string {
	return strconv.FormatInt(requested.UnixMilli(), 10)
}

// AdoptAttempt names the adoption attempt at now: one per owner-TTL window
// (ownerTTL, the owners bucket's TTL), so the adopt requests of one window
// are de-duplicated and the next window's reaches a live driver when the
// driver given the first died (an adopter claims the owner key first, so a
// late duplicate does nothing).
func AdoptAttempt(now time.Time, ownerTTL time.Duration) string {
	return strconv.FormatInt(now.UnixMilli()/max(ownerTTL.Milliseconds(), 1), 10)
}

// CtlSubject is the control subject of one verb for a session.
func CtlSubject(sessionID, verb string) string { return SubjectCtlPrefix + sessionID + "." + verb }

// CtlSubjects matches every control verb of a session.
func CtlSubjects(sessionID string) string { return SubjectCtlPrefix + sessionID + ".*" }

// WSSubject is the workspace operation subject of a session.
func WSSubject(sessionID, op string) string { return SubjectWSPrefix + sessionID + "." + op }

// WSSubjects matches every workspace operation of every session.
const WSSubjects = SubjectWSPrefix + "*.*"

// PresenceKey is the presence key of one edge for a session.
func PresenceKey(sessionID, edgeID string) string { return sessionID + "." + edgeID }

// BlobKey is the object name of a content-addressed blob.
func BlobKey(sha256hex string) string { return "sha256/" + sha256hex }

// TreeKey is the object name of a content-addressed checkpoint tree node
// (package merkle), named by the SHA-256 of its encoding.
func TreeKey(sha256hex string) string { return "trees/" + sha256hex }
