package kubelet

import (
	"context"
	"fmt"
	"runtime"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// leaseNamespace holds node leases.
const leaseNamespace = "kube-node-lease"

// kubeletVersion is what the node reports; it names the stand-in.
const kubeletVersion = "v1.37.2-standin"

var capacity = v1.ResourceList{
	v1.ResourceCPU:              resource.MustParse("8"),
	v1.ResourceMemory:           resource.MustParse("16Gi"),
	v1.ResourcePods:             resource.MustParse("110"),
	v1.ResourceEphemeralStorage: resource.MustParse("100Gi"),
}

// registerNode creates the Node (or takes over an existing one) and writes
// its status once.
func (k *Kubelet) registerNode(ctx context.Context) error {
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: k.cfg.NodeName,
			Labels: map[string]string{
				"kubernetes.io/hostname": k.cfg.NodeName,
				"kubernetes.io/os":       runtime.GOOS,
				"kubernetes.io/arch":     runtime.GOARCH,
			},
		},
		Status: k.nodeStatus(nil),
	}
	_, err := k.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("register node %s: %w", k.cfg.NodeName, err)
	}
	if err := k.updateNodeStatus(ctx); err != nil {
		return fmt.Errorf("register node %s: %w", k.cfg.NodeName, err)
	}
	return nil
}

// nodeStatus is the node's status; old supplies condition transition times.
func (k *Kubelet) nodeStatus(old *v1.NodeStatus) v1.NodeStatus {
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	cond := func(t v1.NodeConditionType, s v1.ConditionStatus, reason, msg string) v1.NodeCondition {
		c := v1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg,
			LastHeartbeatTime: now, LastTransitionTime: now}
		if old != nil {
			for _, o := range old.Conditions {
				if o.Type == t && o.Status == s {
					c.LastTransitionTime = o.LastTransitionTime
				}
			}
		}
		return c
	}
	return v1.NodeStatus{
		Capacity:    capacity.DeepCopy(),
		Allocatable: capacity.DeepCopy(),
		Phase:       v1.NodeRunning,
		Conditions: []v1.NodeCondition{
			cond(v1.NodeMemoryPressure, v1.ConditionFalse, "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
			cond(v1.NodeDiskPressure, v1.ConditionFalse, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
			cond(v1.NodePIDPressure, v1.ConditionFalse, "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
			cond(v1.NodeReady, v1.ConditionTrue, "KubeletReady", "stand-in kubelet is posting ready status"),
		},
		Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: HostIP}},
		DaemonEndpoints: v1.NodeDaemonEndpoints{
			KubeletEndpoint: v1.DaemonEndpoint{Port: int32(k.port)},
		},
		NodeInfo: v1.NodeSystemInfo{
			KubeletVersion:          kubeletVersion,
			OperatingSystem:         runtime.GOOS,
			Architecture:            runtime.GOARCH,
			ContainerRuntimeVersion: "standin://1",
		},
	}
}

func (k *Kubelet) updateNodeStatus(ctx context.Context) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := k.client.CoreV1().Nodes().Get(ctx, k.cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		node.Status = k.nodeStatus(&node.Status)
		_, err = k.client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
		return err
	})
}

// renewLease creates or renews the node's Lease.
func (k *Kubelet) renewLease(ctx context.Context) error {
	leases := k.client.CoordinationV1().Leases(leaseNamespace)
	now := metav1.NewMicroTime(time.Now())
	holder, duration := k.cfg.NodeName, int32(40)
	lease, err := leases.Get(ctx, k.cfg.NodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		node, err := k.client.CoreV1().Nodes().Get(ctx, k.cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{
				Name: k.cfg.NodeName,
				OwnerReferences: []metav1.OwnerReference{{
					APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID,
				}},
			},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &duration, RenewTime: &now},
		}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	lease.Spec.HolderIdentity, lease.Spec.LeaseDurationSeconds, lease.Spec.RenewTime = &holder, &duration, &now
	_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
	return err
}

// heartbeat renews the Lease and the Node status every Heartbeat.
func (k *Kubelet) heartbeat(ctx context.Context) {
	t := time.NewTicker(k.cfg.Heartbeat)
	defer t.Stop()
	for {
		if err := k.renewLease(ctx); err != nil && ctx.Err() == nil {
			k.log.Warn("renew node lease", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := k.updateNodeStatus(ctx); err != nil && ctx.Err() == nil {
			k.log.Warn("update node status", "err", err)
		}
	}
}
