package bus

import (
	"fmt"
	"slices"
)

// Roles: one bus identity (nkey) per role, each with the subject
// permissions of Permissions.
const (
	RoleEdge        = "edge"
	RoleDriver      = "driver"
	RoleSupervisor  = "supervisor"
	RoleProxy       = "workspace-proxy"
	RoleSubscriber  = "subscriber"  // read-only runner.evt.> and runner.io.> (live and replay), for other systems
	RoleProvisioner = "provisioner" // the only role that creates or updates streams, buckets, object stores and the drivers' consumer
)

// Roles lists every role, in a fixed order.
var Roles = []string{RoleEdge, RoleDriver, RoleSupervisor, RoleProxy, RoleSubscriber, RoleProvisioner}

// ServiceRole is the role a service (api-edge, pod-driver, supervisor,
// workspace-proxy) connects as; "" for an unknown name.
func ServiceRole(service string) string {
	switch service {
	case "api-edge":
		return RoleEdge
	case "pod-driver":
		return RoleDriver
	case "supervisor":
		return RoleSupervisor
	case "workspace-proxy":
		return RoleProxy
	}
	return ""
}

// InboxPrefix is the reply-subject prefix a role's connection uses
// (nats.CustomInboxPrefix), so each role may subscribe to its own replies
// only.
func InboxPrefix(role string) string { return "_INBOX_" + role }

// Permission is a NATS server config `permissions` block (the JSON the
// chart renders into the server's authorization section).
type Permission struct {
	Publish        SubjectPermission `json:"publish"`
	Subscribe      SubjectPermission `json:"subscribe"`
	AllowResponses *AllowResponses   `json:"allow_responses,omitempty"`
}

// SubjectPermission is an allow (and optional deny) list of subjects.
type SubjectPermission struct {
	Allow []string `json:"allow"`
	Deny  []string `json:"deny,omitempty"`
}

// AllowResponses lets a request/reply service answer each request it
// receives (up to Max replies within Expires) without a publish right on
// the requester's inbox.
type AllowResponses struct {
	Max     int    `json:"max"`
	Expires string `json:"expires"` // a Go duration
}

// Permissions returns the subject permissions of role. Every JetStream
// right is scoped to a named stream; no service role may create, update,
// delete or purge-by-API a stream other than the message purges of the logs
// it trims or evicts (STREAM.PURGE with a subject filter) and object
// overwrites. Push consumers created through CONSUMER.CREATE may name any
// deliver subject (NATS-CLUSTER-AND-AUTH.md §7): a role with read access can
// redirect stored messages of the streams it reads, nothing else.
func Permissions(role string) (Permission, error) {
	var g grant
	switch role {
	case RoleEdge:
		g.pub(SubjectCmdStart, SubjectCmdStartPrefix+"*", SubjectCmdAdopt, SubjectCtlPrefix+"*.*", SubjectWSPrefix+"*.*", SubjectProbe)
		g.sub(SubjectEventsPrefix + "*") // the fan-out hub and io's terminal watch
		g.log(StreamEvents, SubjectEventsPrefix+"*")
		g.log(StreamIO, "") // read, and purge on eviction
		g.kv(BucketSessions, BucketPresence, BucketAdmission, BucketCheckpoints, BucketOwners, BucketBundles)
		g.obj(ObjectBundles)
	case RoleDriver:
		g.workQueue(StreamCmd, ConsumerDrivers)
		g.micro(ServiceCtl, SubjectCtlPrefix+"*.*")
		g.sub(SubjectProbe)            // answered through allow_responses
		g.pub(SubjectWSPrefix + "*.*") // final checkpoints
		g.log(StreamEvents, SubjectEventsPrefix+"*")
		g.log(StreamIO, SubjectIOPrefix+"*.*")
		g.kv(BucketSessions, BucketOwners, BucketPresence, BucketAdmission, BucketCheckpoints, BucketBuilds, BucketBundles)
		g.obj(ObjectBundles, ObjectBlobs)
	case RoleSupervisor:
		g.pub(SubjectCmdAdopt, SubjectCtlPrefix+"*.*", SubjectWSPrefix+"*.*")
		// A queued start of a session: the last message of its start
		// subject, read by direct get (no consumer on the work queue).
		g.pub(api("STREAM.INFO", StreamCmd), api("DIRECT.GET", StreamCmd)+"."+SubjectCmdStartPrefix+"*")
		g.log(StreamEvents, SubjectEventsPrefix+"*")
		g.log(StreamIO, "") // purge on eviction
		g.kv(BucketSessions, BucketOwners, BucketPresence, BucketAdmission, BucketCheckpoints, BucketBundles)
		g.obj(ObjectBundles, ObjectBlobs)
	case RoleProxy:
		g.micro(ServiceWS, WSSubjects)
		g.kv(BucketCheckpoints)
		g.obj(ObjectBlobs)
		for _, b := range []string{BucketSessions, BucketOwners, BucketPresence, BucketAdmission} {
			g.read("KV_" + b)
		}
		g.read("KV_" + BucketBundles)
		g.read("OBJ_" + ObjectBundles)
	case RoleSubscriber:
		// Events and terminal bytes (docs/asyncapi.yaml), live and replay.
		for _, s := range []struct{ stream, prefix string }{{StreamEvents, SubjectEventsPrefix}, {StreamIO, SubjectIOPrefix}} {
			g.pub(api("STREAM.INFO", s.stream),
				api("CONSUMER.CREATE", s.stream)+".*."+s.prefix+">", // single-filter ordered consumers only
				api("CONSUMER.MSG.NEXT", s.stream)+".*",
				api("CONSUMER.DELETE", s.stream)+".*",
				api("DIRECT.GET", s.stream)+"."+s.prefix+">")
			g.sub(s.prefix + ">")
		}
	case RoleProvisioner:
		g.pub("$JS.API.INFO")
		for _, s := range ProvisionedStreams() {
			g.pub(api("STREAM.CREATE", s), api("STREAM.UPDATE", s), api("STREAM.INFO", s))
		}
		c := api("CONSUMER.CREATE", StreamCmd) + "." + ConsumerDrivers
		g.pub(c, c+".>")
	default:
		return Permission{}, fmt.Errorf("unknown bus role %q (want one of %v)", role, Roles)
	}
	if role != RoleSubscriber {
		g.pub(api("CONSUMER.INFO", StreamCmd) + "." + ConsumerDrivers) // WaitProvisioned; the provisioner reads what it made
	}
	g.sub(InboxPrefix(role) + ".>")
	return g.permission(), nil
}

// ProvisionedStreams names every stream Provision creates, including the
// streams behind buckets (KV_<bucket>) and object stores (OBJ_<store>).
func ProvisionedStreams() []string {
	var out []string
	for _, c := range StreamConfigs(Limits{}) {
		out = append(out, c.Name)
	}
	for _, c := range BucketConfigs(Limits{}) {
		out = append(out, "KV_"+c.Bucket)
	}
	for _, c := range ObjectConfigs(Limits{}) {
		out = append(out, "OBJ_"+c.Bucket)
	}
	return out
}

func api(verb, stream string) string { return "$JS.API." + verb + "." + stream }

// grant accumulates allow lists.
type grant struct {
	pubs, subs []string
	responses  bool
}

func (g *grant) pub(s ...string) { g.pubs = append(g.pubs, s...) }
func (g *grant) sub(s ...string) { g.subs = append(g.subs, s...) }

// read is what reading a stream's stored messages takes: its info, direct
// and stored-message gets, ordered consumers (created, pulled, deleted) and
// their flow-control replies.
func (g *grant) read(stream string) {
	g.pub(api("STREAM.INFO", stream),
		api("DIRECT.GET", stream), api("DIRECT.GET", stream)+".>",
		api("STREAM.MSG.GET", stream),
		api("CONSUMER.CREATE", stream)+".>",
		api("CONSUMER.INFO", stream)+".*",
		api("CONSUMER.MSG.NEXT", stream)+".*",
		api("CONSUMER.DELETE", stream)+".*",
		"$JS.FC."+stream+".>")
}

// log grants reading stream, appending to subjects ("" = no appends) and the
// subject-filtered purges of retention and eviction.
func (g *grant) log(stream, subjects string) {
	g.read(stream)
	g.pub(api("STREAM.PURGE", stream))
	if subjects != "" {
		g.pub(subjects)
	}
}

// kv grants reading and writing the keys of buckets.
func (g *grant) kv(buckets ...string) {
	for _, b := range buckets {
		g.read("KV_" + b)
		g.pub("$KV." + b + ".>")
	}
}

// obj grants reading and writing the objects of stores (an overwrite or a
// delete purges the old chunks).
func (g *grant) obj(stores ...string) {
	for _, o := range stores {
		g.read("OBJ_" + o)
		g.pub("$O."+o+".>", api("STREAM.PURGE", "OBJ_"+o))
	}
}

// workQueue grants pulling from and acknowledging a durable consumer.
func (g *grant) workQueue(stream, consumer string) {
	g.pub(api("CONSUMER.INFO", stream)+"."+consumer,
		api("CONSUMER.MSG.NEXT", stream)+"."+consumer,
		"$JS.ACK."+stream+"."+consumer+".>")
}

// micro grants serving a nats micro service on endpoints: its discovery
// subjects, its endpoint subjects, and one reply per request received.
func (g *grant) micro(name, endpoints string) {
	g.sub("$SRV.*", "$SRV.*."+name, "$SRV.*."+name+".*", endpoints)
	g.responses = true
}

func (g *grant) permission() Permission {
	p := Permission{
		Publish:   SubjectPermission{Allow: compact(g.pubs)},
		Subscribe: SubjectPermission{Allow: compact(g.subs)},
	}
	if p.Publish.Allow == nil {
		p.Publish.Allow = []string{}
	}
	if g.responses {
		p.AllowResponses = &AllowResponses{Max: 1, Expires: "1m0s"}
	}
	return p
}

func compact(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}
