// Command images builds the OCI images of telorunner's binaries without a
// container daemon, and pushes them.
//
//	images build [-root ../..] [-out dist/oci] [-revision R] [-created UNIX] [-arch GOARCH]
//	images push  [-root ../..] [-out dist/oci] -registry host/path [-insecure]
//
// build compiles each binary from Go (CGO_ENABLED=0, -trimpath, a stamped
// pkg/version) and assembles one image per binary from two layers written
// here, nothing pulled: a base (/etc/passwd and /etc/group with the numeric
// non-root user 1000, the CA roots of golang.org/x/crypto/x509roots/fallback
// as /etc/ssl/certs/ca-certificates.crt, /tmp and the user's home) and the
// binary at /usr/local/bin/<name>, the entrypoint. No shell, no package
// manager. Every tar entry has the same fixed time (-created, default the
// Unix epoch; `make images` passes the commit time), entries are sorted and
// owned by numeric ids, so the same sources give the same digests.
//
// The image names and tag come from the Helm chart: image.repository of
// deploy/helm/telorunner/values.yaml and the chart's appVersion, so the
// chart's defaults name exactly these images. Each image is written as an
// OCI image layout under <out>/<name>, its index entry annotated with the
// full reference (org.opencontainers.image.ref.name, as containerd's
// import reads it); <out>/images.txt lists reference@digest.
//
// push sends each layout's image to <registry>/<name>:<tag> with the
// credentials of the Docker config (~/.docker/config.json), as crane does.
package main
