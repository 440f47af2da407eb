package kubernetes

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kernelwire"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kubernetes/podspec"
)

// Workload is a run or app session: one pod, container "session". It
// implements backend.Workload. Exit: Succeeded → Code (first container's
// exit code); Failed → Err (podFailureMessage); pod gone → Err "pod
// disappeared"; Stop → Stopped.
type Workload struct {
	*core
}

var _ backend.Workload = (*Workload)(nil)

func (b *Backend) startRun(ctx context.Context, spec backend.Spec, sink backend.Sink) (*Workload, error) {
	var (
		pod *corev1.Pod
		cm  *corev1.ConfigMap
		err error
	)
	app := spec.Apps
	if len(app) == 0 {
		app = []backend.App{{Name: contract.DefaultApp, IO: contract.IOTTY}}
	}
	switch {
	case spec.SelfContained:
		pod, err = podspec.App(b.params, spec)
	case b.opts.ImageRepository != "":
		// The per-app image (11.11): built, or found in the registry.
		var ref string
		if ref, err = b.runImage(ctx, spec, app[0].Name, sink); err == nil {
			pod, cm, err = podspec.RunBuilt(b.params, spec, ref)
		}
	default:
		pod, cm, err = podspec.Run(b.params, spec)
	}
	if err != nil {
		return nil, &backend.StartError{Stage: "create", Message: err.Error()}
	}
	sink.Progress(contract.PhaseProvision, "Creating pod", false, "")
	if cm != nil {
		if err := b.putConfigMap(ctx, cm); err != nil {
			return nil, &backend.StartError{Stage: "create", Message: "failed to create bundle: " + err.Error()}
		}
	}
	created, err := b.client.CoreV1().Pods(b.opts.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		if cm != nil {
			b.deleteConfigMap(cm.Name)
		}
		return nil, &backend.StartError{Stage: "create", Message: "failed to create pod: " + err.Error()}
	}
	if cm != nil {
		b.ownConfigMap(ctx, cm.Name, created)
	}
	running, err := b.waitRunning(ctx, created.Name, false, sink)
	if err != nil {
		if derr := b.deletePod(context.WithoutCancel(ctx), created.Name); derr != nil {
			b.log.Warn("delete pod after failed start", "session", spec.SessionID, "err", derr)
		}
		return nil, &backend.StartError{Stage: "start", Message: "pod failed to start: " + err.Error()}
	}

	w := &Workload{core: b.newCore(spec.SessionID, running, sink)}
	a := app[0]
	w.atts[a.Name] = newAttachment(a.Name, podspec.ContainerSession, a.IO != contract.IOStreams)
	if running.Status.Phase == corev1.PodRunning {
		w.attach(false)
	}
	sink.Running(podspec.Endpoints(b.params, spec.SessionID, a.Ports), nil)
	if err := b.publish(ctx, spec.SessionID, running, a.Ports); err != nil {
		w.log.Warn("publish routing", "err", err)
		sink.Output(a.Name, diagnosticTag(a), []byte("\r\n[runner] failed to create ingress: "+err.Error()+"\r\n"))
	}
	if spec.Inspect && !spec.SelfContained {
		w.relay(w.ctx, a.Name, podspec.FirstInspectPort, kernelwire.RelayOptions{})
	}
	w.reach(a.Name, a.Ports)
	b.wg.Go(w.monitor)
	w.log.Info("session workload started")
	return w, nil
}

// monitor maps the pod's end to the workload's Exit (11.13).
func (w *Workload) monitor() {
	var exit backend.Exit
	_ = w.b.observe(context.Background(), w.pod, func(pod *corev1.Pod) bool {
		switch {
		case pod == nil:
			exit = backend.Exit{Err: errors.New("pod disappeared")}
			return true
		case w.stopping.Load() && pod.DeletionTimestamp != nil:
			return false // wait for it to go
		case pod.Status.Phase == corev1.PodSucceeded:
			exit = backend.Exit{Code: contract.IntPtr(firstExitCode(pod))}
			return true
		case pod.Status.Phase == corev1.PodFailed:
			exit = backend.Exit{Err: errors.New(podFailureMessage(pod))}
			return true
		}
		return false
	})
	w.finish(exit)
}

// putConfigMap creates cm, replacing a stale one of the same name.
func (b *Backend) putConfigMap(ctx context.Context, cm *corev1.ConfigMap) error {
	cms := b.client.CoreV1().ConfigMaps(b.opts.Namespace)
	_, err := cms.Create(ctx, cm, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		if err = cms.Delete(ctx, cm.Name, metav1.DeleteOptions{}); err == nil || apierrors.IsNotFound(err) {
			_, err = cms.Create(ctx, cm, metav1.CreateOptions{})
		}
	}
	if err != nil {
		return fmt.Errorf("create configmap %s: %w", cm.Name, err)
	}
	return nil
}

// ownConfigMap makes pod the controller of the bundle ConfigMap, so the
// garbage collector removes it with the pod. A failure is logged: the
// orphan reap only covers pods.
func (b *Backend) ownConfigMap(ctx context.Context, name string, pod *corev1.Pod) {
	cms := b.client.CoreV1().ConfigMaps(b.opts.Namespace)
	cm, err := cms.Get(ctx, name, metav1.GetOptions{})
	if err == nil {
		cm = cm.DeepCopy()
		cm.OwnerReferences = []metav1.OwnerReference{podspec.OwnerRef(pod)}
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	}
	if err != nil {
		b.log.Warn("own bundle configmap", "configmap", name, "err", err)
	}
}

func (b *Backend) deleteConfigMap(name string) {
	err := b.client.CoreV1().ConfigMaps(b.opts.Namespace).Delete(context.Background(), name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		b.log.Warn("delete bundle configmap", "configmap", name, "err", err)
	}
}

// diagnosticTag is the stream tag of a runner diagnostic line on app's
// byte channel: tty on a tty app, stderr on a streams app (7.4).
func diagnosticTag(a backend.App) byte {
	if a.IO == contract.IOStreams {
		return contract.TagStderr
	}
	return contract.TagTTY
}
