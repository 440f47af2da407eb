package kubelet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"

	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/podstatus"
	"github.com/telorunner/telorunner/tools/standin-kubelet/internal/sandbox"
)

// informerSet is the running pod informers.
type informerSet struct {
	factories []informers.SharedInformerFactory
	wg        sync.WaitGroup
}

// wait blocks until the informers stopped; their context must be done.
func (s *informerSet) wait() {
	for _, f := range s.factories {
		f.Shutdown()
	}
	s.wg.Wait()
}

// startInformers watches the pods bound to this node (→ the pod queue) and
// the unscheduled ones (→ binding), and waits for their first lists.
func (k *Kubelet) startInformers(ctx context.Context) (*informerSet, error) {
	set := &informerSet{}
	own := informers.NewSharedInformerFactoryWithOptions(k.client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", k.cfg.NodeName).String()
		}))
	unscheduled := informers.NewSharedInformerFactoryWithOptions(k.client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", "").String()
		}))
	set.factories = []informers.SharedInformerFactory{own, unscheduled}

	podInf := own.Core().V1().Pods().Informer()
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			k.queue.Add(key)
		}
	}
	if _, err := podInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: enqueue,
	}); err != nil {
		return nil, fmt.Errorf("watch pods: %w", err)
	}
	k.podStore = podInf.GetIndexer()

	bindInf := unscheduled.Core().V1().Pods().Informer()
	bind := func(obj any) {
		if pod, ok := obj.(*v1.Pod); ok {
			k.bindQueue.Add(cache.MetaObjectToName(pod).String())
		}
	}
	if _, err := bindInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    bind,
		UpdateFunc: func(_, obj any) { bind(obj) },
	}); err != nil {
		return nil, fmt.Errorf("watch unscheduled pods: %w", err)
	}
	k.unscheduledStore = bindInf.GetIndexer()

	own.Start(ctx.Done())
	unscheduled.Start(ctx.Done())
	set.wg.Go(func() { k.bindLoop(ctx) })
	if !cache.WaitForCacheSync(ctx.Done(), podInf.HasSynced, bindInf.HasSynced) {
		k.bindQueue.ShutDown()
		set.wait()
		return nil, errors.New("watch pods: caches did not sync")
	}
	return set, nil
}

// syncPod converges one pod key: admit it, write its status, stop it when
// it is deleted, and finish its deletion once its processes are gone.
func (k *Kubelet) syncPod(ctx context.Context, key string) error {
	obj, exists, err := k.podStore.GetByKey(key)
	if err != nil {
		return err
	}
	var pod *v1.Pod
	if exists {
		pod = obj.(*v1.Pod)
	}

	// Sandboxes of pods that are gone from the API (or were replaced by a
	// pod of the same name) stop at once and are forgotten when done.
	for uid, e := range k.entriesFor(key) {
		if pod != nil && pod.UID == uid {
			continue
		}
		e.sb.Stop(0)
		select {
		case <-e.sb.Done():
			k.forget(uid)
		default:
		}
	}
	if pod == nil {
		return nil
	}

	e := k.entry(pod.UID)
	if pod.DeletionTimestamp != nil {
		if e == nil {
			// Not run by this process: deleted while the kubelet was down,
			// or never admitted.
			return k.finishDeletion(ctx, pod)
		}
		e.sb.Stop(deletionGrace(pod))
		select {
		case <-e.sb.Done():
		default:
			return k.writeStatus(ctx, pod, e)
		}
		if err := k.writeStatus(ctx, pod, e); err != nil {
			if !apierrors.IsInvalid(err) {
				return err
			}
			// A status the API refuses must not keep the pod around.
			k.log.Warn("write final status", "pod", key, "err", err)
		}
		if err := k.finishDeletion(ctx, pod); err != nil {
			return err
		}
		k.forget(pod.UID)
		return nil
	}
	if e == nil {
		switch {
		case pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed:
			return nil
		case pod.Status.StartTime != nil:
			// Started by an earlier run of the kubelet; its processes are gone.
			return k.putStatus(ctx, pod, func(p *v1.Pod) v1.PodStatus { return podstatus.Lost(p, time.Now()) })
		}
		if e, err = k.admit(ctx, pod); err != nil {
			return err
		}
	}
	return k.writeStatus(ctx, pod, e)
}

// deletionGrace is the grace period the API server granted, capped.
func deletionGrace(pod *v1.Pod) time.Duration {
	g := sandbox.MaxGrace
	if s := pod.DeletionGracePeriodSeconds; s != nil {
		g = time.Duration(*s) * time.Second
	}
	return min(g, sandbox.MaxGrace)
}

// admit starts a sandbox for pod.
func (k *Kubelet) admit(ctx context.Context, pod *v1.Pod) (*entry, error) {
	e := &entry{key: cache.MetaObjectToName(pod).String(), dir: filepath.Join(k.podsDir, string(pod.UID))}
	ip := HostIP
	if !pod.Spec.HostNetwork {
		addr, err := k.ips.Allocate()
		if err != nil {
			return nil, fmt.Errorf("admit pod %s: %w", e.key, err)
		}
		e.ip, ip = addr, addr.String()
	}
	release := func() {
		if e.ip.IsValid() {
			k.ips.Release(e.ip)
		}
	}
	// The pod directory is the working directory of containers without
	// an existing workingDir, whatever user they run as.
	if err := mkdirMode(e.dir); err != nil {
		release()
		return nil, fmt.Errorf("admit pod %s: %w", e.key, err)
	}
	key := e.key
	sb, err := sandbox.New(sandbox.Config{
		Pod: pod, NodeName: k.cfg.NodeName, IP: ip, HostIP: HostIP, Dir: e.dir,
		Images: k.cfg.Images, Volumes: k.cfg.Volumes, Helper: k.cfg.Helper,
		ApplyIdentity: k.applyIdentity, Objects: objects{k.client}, Log: k.log,
		OnChange: func() { k.queue.Add(key) },
	})
	if err != nil {
		release()
		return nil, fmt.Errorf("admit pod %s: %w", e.key, err)
	}
	e.sb = sb
	k.mu.Lock()
	k.pods[pod.UID] = e
	k.sandboxes.Go(func() { sb.Run(ctx) })
	k.mu.Unlock()
	k.log.Info("pod admitted", "pod", e.key, "ip", ip)
	return e, nil
}

func (k *Kubelet) entry(uid types.UID) *entry {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.pods[uid]
}

func (k *Kubelet) entriesFor(key string) map[types.UID]*entry {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := map[types.UID]*entry{}
	for uid, e := range k.pods {
		if e.key == key {
			out[uid] = e
		}
	}
	return out
}

// entryByName finds the admitted pod namespace/name (and uid, if given).
func (k *Kubelet) entryByName(key string, uid types.UID) *entry {
	k.mu.Lock()
	defer k.mu.Unlock()
	var found *entry
	for u, e := range k.pods {
		if e.key != key || (uid != "" && u != uid) {
			continue
		}
		// Prefer a pod that still runs over a finished one of the same name.
		if found == nil || isDone(found.sb) {
			found = e
		}
	}
	return found
}

func isDone(sb *sandbox.Sandbox) bool {
	select {
	case <-sb.Done():
		return true
	default:
		return false
	}
}

// forget drops a finished pod: its IP and its directory.
func (k *Kubelet) forget(uid types.UID) {
	k.mu.Lock()
	e, ok := k.pods[uid]
	delete(k.pods, uid)
	k.mu.Unlock()
	if !ok {
		return
	}
	if e.ip.IsValid() {
		k.ips.Release(e.ip)
	}
	if err := os.RemoveAll(e.dir); err != nil {
		k.log.Warn("remove pod directory", "pod", e.key, "err", err)
	}
	k.log.Info("pod removed", "pod", e.key)
}

// writeStatus writes the sandbox's status when it differs from pod's.
func (k *Kubelet) writeStatus(ctx context.Context, pod *v1.Pod, e *entry) error {
	return k.putStatus(ctx, pod, func(p *v1.Pod) v1.PodStatus {
		return podstatus.Compute(p, e.sb.Snapshot(), time.Now())
	})
}

// putStatus updates pod's status to compute(pod) unless it is already so,
// re-reading the pod on conflict.
func (k *Kubelet) putStatus(ctx context.Context, pod *v1.Pod, compute func(*v1.Pod) v1.PodStatus) error {
	pods := k.client.CoreV1().Pods(pod.Namespace)
	current := pod
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		st := compute(current)
		if equality.Semantic.DeepEqual(st, current.Status) {
			return nil
		}
		next := current.DeepCopy()
		next.Status = st
		_, err := pods.UpdateStatus(ctx, next, metav1.UpdateOptions{})
		if err == nil {
			k.log.Debug("pod status written", "pod", pod.Namespace+"/"+pod.Name, "phase", st.Phase)
		}
		if apierrors.IsConflict(err) {
			fresh, gerr := pods.Get(ctx, pod.Name, metav1.GetOptions{})
			if gerr != nil {
				return gerr
			}
			if fresh.UID != pod.UID {
				return nil
			}
			current = fresh
		}
		return err
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("update status of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// finishDeletion removes the pod object now that nothing of it runs.
func (k *Kubelet) finishDeletion(ctx context.Context, pod *v1.Pod) error {
	zero := int64(0)
	err := k.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero,
		Preconditions:      metav1.NewUIDPreconditions(string(pod.UID)),
	})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	k.log.Info("pod deleted", "pod", pod.Namespace+"/"+pod.Name)
	return nil
}

// bindLoop binds unscheduled pods to this node until the bind queue shuts
// down (when ctx ends).
func (k *Kubelet) bindLoop(ctx context.Context) {
	stop := context.AfterFunc(ctx, k.bindQueue.ShutDown)
	defer stop()
	for {
		key, quit := k.bindQueue.Get()
		if quit {
			return
		}
		if err := k.bind(ctx, key); err != nil && ctx.Err() == nil {
			k.log.Debug("bind pod, will retry", "pod", key, "err", err)
			k.bindQueue.AddRateLimited(key)
		} else {
			k.bindQueue.Forget(key)
		}
		k.bindQueue.Done(key)
	}
}

func (k *Kubelet) bind(ctx context.Context, key string) error {
	obj, exists, err := k.unscheduledStore.GetByKey(key)
	if err != nil || !exists {
		return err
	}
	pod := obj.(*v1.Pod)
	if pod.Spec.NodeName != "" || pod.DeletionTimestamp != nil ||
		(pod.Spec.SchedulerName != "" && pod.Spec.SchedulerName != v1.DefaultSchedulerName) {
		return nil
	}
	err = k.client.CoreV1().Pods(pod.Namespace).Bind(ctx, &v1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID},
		Target:     v1.ObjectReference{Kind: "Node", Name: k.cfg.NodeName},
	}, metav1.CreateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) || apierrors.IsAlreadyExists(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("bind pod %s: %w", key, err)
	}
	k.log.Debug("pod bound", "pod", key)
	return nil
}

// objects reads ConfigMaps and Secrets straight from the API server.
type objects struct{ client kubernetes.Interface }

func (o objects) ConfigMap(ctx context.Context, namespace, name string) (*v1.ConfigMap, error) {
	return o.client.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
}

func (o objects) Secret(ctx context.Context, namespace, name string) (*v1.Secret, error) {
	return o.client.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
}
