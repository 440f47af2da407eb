// Package kubernetes is the pod-driver backend that runs sessions as pods
// through client-go (contract 11, ARCHITECTURE.md §5). podspec builds the
// objects; this package creates them, follows the pod, attaches to app
// containers through pods/attach (WebSocket executor), relays each
// kernel's debug wire and probes reachability by pod IP (kernelwire), and
// publishes the session's Service and Ingress.
//
// Decisions, and where they depart from the contract:
//
//   - Run bundles reach the pod as a ConfigMap (telo-bundle-<id>), one
//     binaryData key per file (f0, f1, …: valid keys whatever the path)
//     mapped by items to the file's normalized path, mounted read-only at
//     /app — not the init container fetching a tarball from
//     /internal/bundles (11.10), which this runner does not serve. Binary
//     files survive (19 item 31). The ConfigMap is created before the pod
//     (so the volume resolves at once), then updated to carry a controller
//     reference to the pod, so the garbage collector deletes it with the
//     pod. Limit: the API server refuses objects over 1 MiB, so bundles
//     over podspec.MaxBundleBytes fail the start (stage create).
//   - Run images (11.11, build.go, imagebuild): with ImageRepository set a
//     run pod runs its per-app image; without it, the session's base
//     image (the contract makes RUNNER_IMAGE_REPOSITORY required; here
//     unset means no build). Single-flight is across drivers (a
//     runner_builds key per ref), not per process (19.38). The default
//     builder (layer) is daemonless and unprivileged: the base image runs
//     telo install, our telo-layer appends /app and /telo-cache as one
//     layer and pushes; kaniko is the reference's Job. The build context
//     reaches the Job as a ConfigMap, like run bundles. A failed build's
//     log tail falls back to the container's exit code and reason when
//     pods/log cannot be read.
//   - Watch pods use restartPolicy Always (19 item 16): a dead app
//     container restarts; each termination is reported once through
//     RunEnded (tracked by restartCount) and its debug relay restarts
//     against the new inspection server. App containers run 10.1's
//     sh -c entry wait, then exec telo with the flags before the path
//     (podspec.WatchAppCommand): a kernel started before the workspace is
//     seeded would report a failed first run.
//   - The workspace container is telorunner's workspace-server image with
//     env exactly PORT=8099 and WORKSPACE_DIR=/workspace, so there is no
//     workspace-app ConfigMap (11.9).
//   - App-session pods set pod-level runAsNonRoot (19 item 23).
//   - Port names are <proto>-<port> (19 item 27).
//   - Live port changes: the driver calls WatchWorkload.SetPorts with an
//     app's new accepted set; it re-publishes the Service and Ingress and
//     rolls back on failure (19 item 19), then watches the reachability
//     of newly routed tcp ports. Endpoints carry the ingress hosts.
//   - Client throttling: WithThrottle sets QPS 50 / Burst 100 (see
//     ClientQPS).
//
// Goroutines: each workload owns its attach loops, relays and watchers
// (its wait group, ended by finish); its monitor runs in the Backend's
// wait group and calls finish. Lock order in WatchWorkload: routeMu, then
// mu; mu is never held over I/O or a sink call.
package kubernetes
