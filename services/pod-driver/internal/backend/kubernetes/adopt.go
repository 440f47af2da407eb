package kubernetes

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kernelwire"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kubernetes/podspec"
)

// Adopt takes over the running pod of spec's session (found by label,
// newest live pod) after another driver stopped: it re-attaches every app
// container, re-opens the debug relays and resumes the pod watch,
// restarting nothing. It does not call sink.Running or re-seed, and does
// not re-run reachability (already reported by the previous owner).
//
// What is lost: output the apps wrote while nobody was attached, and
// debug frames stamped before the adoption (the relays drop the
// inspection servers' replayed history, RelayOptions.After, because the
// previous owner's de-dup state is gone). spec must carry the session's
// current apps and ports (the record's), since routing state is rebuilt
// from it rather than read back from the Service.
func (b *Backend) Adopt(ctx context.Context, spec backend.Spec, sink backend.Sink) (backend.Workload, error) {
	pod, err := b.sessionPod(ctx, spec.SessionID)
	if err != nil {
		return nil, err
	}
	if pod.Status.Phase != corev1.PodRunning || pod.Status.PodIP == "" {
		return nil, fmt.Errorf("adopt session %s: pod %s is %s", spec.SessionID, pod.Name, pod.Status.Phase)
	}
	now := time.Now()
	if pod.Labels[podspec.LabelMode] == podspec.ModeWatch {
		w, err := b.newWatchWorkload(spec, pod, sink)
		if err != nil {
			return nil, fmt.Errorf("adopt session %s: %w", spec.SessionID, err)
		}
		for _, a := range w.apps {
			for _, p := range w.ports[a.Name] {
				w.watched[a.Name+"/"+p.Key()] = true // reported by the previous owner
			}
		}
		w.attach(true)
		for i, a := range w.apps {
			w.startRelay(i, a.Name, now)
		}
		b.wg.Go(w.monitor)
		return w, nil
	}
	w := &Workload{core: b.newCore(spec.SessionID, pod, sink)}
	app := backend.App{Name: contract.DefaultApp, IO: contract.IOTTY}
	if len(spec.Apps) > 0 {
		app = spec.Apps[0]
	}
	w.atts[app.Name] = newAttachment(app.Name, podspec.ContainerSession, app.IO != contract.IOStreams)
	w.attach(false)
	if spec.Inspect && !spec.SelfContained {
		w.relay(w.ctx, app.Name, podspec.FirstInspectPort, kernelwire.RelayOptions{After: now})
	}
	b.wg.Go(w.monitor)
	return w, nil
}
