// Package kubetest starts a real Kubernetes control plane for a test: an
// embedded etcd, kube-apiserver with RBAC, token authentication and
// PodSecurity admission, and (unless disabled) kube-controller-manager for
// garbage collection, namespaces and default service accounts. A stand-in
// kubelet that runs a pod's containers as local processes can be added with
// [Env.StartKubelet].
//
// The binaries come from the directory named by $TELORUNNER_KUBE_BIN, which
// `make test` sets after `make kube-bins` has built them (see tools/kubeenv).
// A missing binary fails the test; it is never skipped.
//
// Every process runs in its own process group with a parent-death signal and
// is stopped in t.Cleanup; the environment's temporary directory goes with
// it. Linux only.
package kubetest
