// Package local is the pod-driver backend that runs session workloads as
// process groups on this machine (ARCHITECTURE.md §5): a per-session
// directory instead of a volume, one kernel process per app (a pty for
// `io: tty`, pipes for `io: streams`), loopback ports instead of an Ingress.
//
// A run session lives in <WorkRoot>/<sessionId>/: app/ holds the bundle,
// home/ is the kernel's HOME. A watch session has the shape of the
// Kubernetes watch pod: workspace/ is the shared workspace, served by one
// workspace-server process, seeded with the bundle and the workspace marker;
// one kernel per app runs `run --watch --inspect` on its entry there and is
// restarted when it dies on its own; an optional agent works in the
// workspace with the operator env. Each of these processes has its own HOME
// under home/. In both, the file pid lists the process group id of every
// running process. The directory is removed when the workload ends.
package local
