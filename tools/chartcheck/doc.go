// Package chartcheck holds the tests of the Helm chart in
// deploy/helm/telorunner; it has no code of its own.
//
// The tests render the chart with the Helm v3 library (as `helm install`
// and `helm lint` do), decode every manifest, check the objects against the
// values and against deploy/kubernetes/role.yaml, and then apply every
// object to a real kube-apiserver (services/pod-driver/kubetest) with a
// server-side dry run and strict field validation, so the API server's
// schemas and admission (Pod Security "restricted") judge them. Finally the
// chart is applied for real and SubjectAccessReviews prove that the pod
// driver's ServiceAccount holds exactly the Role's grants in the session
// namespace.
//
// This is a module of its own, outside go.work (Helm's dependency tree stays
// out of the services): build and test it with GOWORK=off, with
// TELORUNNER_KUBE_BIN naming the control-plane binaries (`make kube-bins`).
package chartcheck
