package podspec

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/telorunner/telorunner/pkg/contract"
)

// OwnerRef is the controller reference of an object that dies with pod.
func OwnerRef(pod *corev1.Pod) metav1.OwnerReference {
	return metav1.OwnerReference{
		APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID,
		Controller: new(true), BlockOwnerDeletion: new(true),
	}
}

func routeMeta(p Params, sessionID string, owner *corev1.Pod) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:            RunPodName(sessionID),
		Namespace:       p.Namespace,
		Labels:          map[string]string{LabelManagedBy: p.ManagedBy, LabelSession: sessionID},
		OwnerReferences: []metav1.OwnerReference{OwnerRef(owner)},
	}
}

// Dedupe returns ports without repeats of one protocol/port, in order.
func Dedupe(ports []contract.PortMapping) []contract.PortMapping {
	seen := make(map[string]bool)
	out := make([]contract.PortMapping, 0, len(ports))
	for _, pm := range ports {
		pm.Protocol = protocol(pm)
		if !seen[pm.Key()] {
			seen[pm.Key()] = true
			out = append(out, pm)
		}
	}
	return out
}

// Service is the session Service routing every port to the pods of the
// session (contract 11.8, port names per 19 item 27). Nil when ports is
// empty.
func Service(p Params, sessionID string, owner *corev1.Pod, ports []contract.PortMapping) *corev1.Service {
	ports = Dedupe(ports)
	if len(ports) == 0 {
		return nil
	}
	svc := &corev1.Service{ObjectMeta: routeMeta(p, sessionID, owner)}
	svc.Spec.Selector = map[string]string{LabelSession: sessionID}
	for _, pm := range ports {
		proto := corev1.ProtocolTCP
		if pm.Protocol == "udp" {
			proto = corev1.ProtocolUDP
		}
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{
			Name: PortName(pm), Port: int32(pm.Port), TargetPort: intstr.FromInt32(int32(pm.Port)), Protocol: proto,
		})
	}
	return svc
}

// Ingress has one rule per tcp port, host <port>-<id>.<domain> (11.8).
// Nil when there is no tcp port.
func Ingress(p Params, sessionID string, owner *corev1.Pod, ports []contract.PortMapping) *networkingv1.Ingress {
	ing := &networkingv1.Ingress{ObjectMeta: routeMeta(p, sessionID, owner)}
	if p.IngressClass != "" {
		ing.Spec.IngressClassName = new(p.IngressClass)
	}
	var hosts []string
	prefix := networkingv1.PathTypePrefix
	for _, pm := range Dedupe(ports) {
		if pm.Protocol != "tcp" {
			continue
		}
		host := Host(pm.Port, sessionID, p.BaseDomain)
		hosts = append(hosts, host)
		ing.Spec.Rules = append(ing.Spec.Rules, networkingv1.IngressRule{
			Host: host,
			IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{
				Paths: []networkingv1.HTTPIngressPath{{
					Path: "/", PathType: &prefix,
					Backend: networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{
						Name: RunPodName(sessionID), Port: networkingv1.ServiceBackendPort{Number: int32(pm.Port)},
					}},
				}},
			}},
		})
	}
	if len(hosts) == 0 {
		return nil
	}
	if p.TLSSecret != "" {
		ing.Spec.TLS = []networkingv1.IngressTLS{{Hosts: hosts, SecretName: p.TLSSecret}}
	}
	return ing
}

// Endpoints are the announced endpoints of ports (contract 11.8): tcp
// ports get the Ingress host and an https URL when a base domain is set.
func Endpoints(p Params, sessionID string, ports []contract.PortMapping) []contract.Endpoint {
	out := make([]contract.Endpoint, 0, len(ports))
	for _, pm := range ports {
		e := contract.Endpoint{Port: pm.Port, Protocol: protocol(pm)}
		if p.BaseDomain != "" && e.Protocol == "tcp" {
			e.Host = Host(pm.Port, sessionID, p.BaseDomain)
			e.URL = "https://" + e.Host
		}
		out = append(out, e)
	}
	return out
}
