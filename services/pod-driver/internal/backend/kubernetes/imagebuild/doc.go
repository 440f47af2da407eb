// Package imagebuild is the run-session image build path of the
// Kubernetes backend (contract 11.11): the content-addressed tag of a
// bundle (Tag), the registry existence check (Exists), the cross-driver
// single-flight lock per image ref (Locks, a JetStream key-value key per
// ref) and the layer program that appends an installed bundle onto its
// base image and pushes it (Layer, run by the build Job).
package imagebuild
