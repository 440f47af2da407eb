// Package kernelwire is what every backend speaks to a running kernel and
// to a watch session's workspace server, over plain TCP from the driver's
// network: the debug relay of a kernel's inspection stream (contract 10.4,
// de-duplicated across reconnects per 19 item 14), the reachability
// watcher of declared tcp ports (11.7) and the workspace-server client
// used to probe and seed a watch session's workspace (9.2, 9.5, 9.7).
//
// It knows hosts and ports, never processes or pods: the local backend
// passes 127.0.0.1, the kubernetes backend the pod IP.
package kernelwire
