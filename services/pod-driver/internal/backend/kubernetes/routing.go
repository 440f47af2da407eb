package kubernetes

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/telorunner/telorunner/pkg/contract"
	"github.com/telorunner/telorunner/services/pod-driver/internal/backend/kubernetes/podspec"
)

// publish makes the session's Service and Ingress route exactly ports to
// pod (contract 11.8) with create-or-replace: create; on 409 read and
// replace, carrying resourceVersion and the Service's cluster IPs. An
// object with nothing to route is deleted. Logs-only (no base domain):
// nothing.
func (b *Backend) publish(ctx context.Context, sessionID string, pod *corev1.Pod, ports []contract.PortMapping) error {
	if b.params.BaseDomain == "" {
		return nil
	}
	name := podspec.RunPodName(sessionID)
	svcs := b.client.CoreV1().Services(b.opts.Namespace)
	if svc := podspec.Service(b.params, sessionID, pod, ports); svc != nil {
		_, err := svcs.Create(ctx, svc, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			var cur *corev1.Service
			if cur, err = svcs.Get(ctx, name, metav1.GetOptions{}); err == nil {
				svc.ResourceVersion = cur.ResourceVersion
				svc.Spec.ClusterIP, svc.Spec.ClusterIPs = cur.Spec.ClusterIP, cur.Spec.ClusterIPs
				svc.Spec.IPFamilies, svc.Spec.IPFamilyPolicy = cur.Spec.IPFamilies, cur.Spec.IPFamilyPolicy
				_, err = svcs.Update(ctx, svc, metav1.UpdateOptions{})
			}
		}
		if err != nil {
			return fmt.Errorf("publish service %s: %w", name, err)
		}
	} else if err := svcs.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete service %s: %w", name, err)
	}

	ings := b.client.NetworkingV1().Ingresses(b.opts.Namespace)
	if ing := podspec.Ingress(b.params, sessionID, pod, ports); ing != nil {
		_, err := ings.Create(ctx, ing, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			cur, gerr := ings.Get(ctx, name, metav1.GetOptions{})
			if err = gerr; err == nil {
				ing.ResourceVersion = cur.ResourceVersion
				_, err = ings.Update(ctx, ing, metav1.UpdateOptions{})
			}
		}
		if err != nil {
			return fmt.Errorf("publish ingress %s: %w", name, err)
		}
	} else if err := ings.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete ingress %s: %w", name, err)
	}
	return nil
}
