// Package local is the pod-driver backend that runs session workloads as
// process groups on this machine (ARCHITECTURE.md §5): a per-session
// directory instead of a volume, one kernel process per app (a pty for
// `io: tty`, pipes for `io: streams`), loopback ports instead of an Ingress.
//
// A session lives in <WorkRoot>/<sessionId>/: app/ holds the bundle, home/
// is the kernels' HOME, and pid lists the process group id of each app
// process. The directory is removed when the workload ends.
package local
