// Package kubeenv pins the Kubernetes control-plane binaries that tests run
// against: kube-apiserver and kube-controller-manager from k8s.io/kubernetes,
// and a small embedded etcd (cmd/etcd, its own module). The two Kubernetes
// binaries are tool directives in go.mod. It builds only with GOWORK=off and is
// deliberately not part of go.work; `make kube-bins` builds and caches it.
package kubeenv
