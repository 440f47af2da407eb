// Package chartcheck holds the tests of the Helm chart in
// deploy/helm/telorunner; it has no code of its own.
//
// The tests render the chart with the Helm v3 library (as `helm install`
// and `helm lint` do) with the defaults, testdata/values-full.yaml (every
// value overridden) and an external-NATS install, hooks included, decode
// every manifest, and check the objects against the values and against
// deploy/kubernetes/role.yaml: each bus client mounts only its own role's
// nkey seed, probes, resources, disruption budgets, the session and NATS
// NetworkPolicies. The rendered nats.conf is loaded with nats-server's own
// parser (an nkey user per role with its permissions from
// files/nats-permissions.json) and served: a role's seed connects, an
// anonymous client is refused. Every variable of the README's
// configuration tables must be set by some install. Then every object is
// applied to a real kube-apiserver (tools/kubetest) with a
// server-side dry run and strict field validation, so the API server's
// schemas and admission (Pod Security "restricted") judge them; finally
// the chart is applied for real, the session NetworkPolicy is evaluated
// against the release namespace's labels and its Services' ClusterIPs,
// and SubjectAccessReviews prove that the pod driver's ServiceAccount
// holds exactly the Role's grants in the session namespace. The stand-in
// kubelet does not enforce NetworkPolicy: the policies are checked as
// rules, not as packets.
//
// This is a module of its own, outside go.work (Helm's dependency tree stays
// out of the services): build and test it with GOWORK=off, with
// TELORUNNER_KUBE_BIN naming the control-plane binaries (`make kube-bins`).
package chartcheck
