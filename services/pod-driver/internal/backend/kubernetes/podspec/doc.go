// Package podspec builds the Kubernetes objects of a session (contract 11):
// the run, app and watch pods, the run bundle's ConfigMap and the session's
// Service and Ingress. It is pure: no client calls, no clock but the one
// passed in, so every shape is unit- and property-tested without an API
// server.
package podspec
