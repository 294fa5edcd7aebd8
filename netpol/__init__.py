"""The NetworkPolicies: an asymmetric air-gap, by construction.

Default deny, ingress and egress, in fabrique's namespaces; then only what each pod needs:

- every fabrique pod of the build namespace: DNS, Gitea, the registry and the Kubernetes
  API (the Argo executor reports each step through it);
- the build pod (``fabrique.io/step: build``) alone: TCP 443 to the site's allowlist, as
  CIDRs (``networking.k8s.io``) or host names (``CiliumNetworkPolicy`` ``toFQDNs``);
- the EventSource: ingress from the Gitea namespace on 12000, egress to the EventBus;
- the Sensor: the EventBus, the Kubernetes API; the EventBus: its clients and its peers;
- the reconciler (control namespace): DNS, Gitea, the registry, the API; the mirror
  sync: DNS, Gitea, the API;
- the Gitea pods: DNS, the EventSource on its port, their own peers, GitHub on 443.

No rule allows a wide net: a /0 cannot be configured (the site config refuses it), and
``check_no_wide_nets`` refuses any rendered policy that would still hold one, or an
empty peer that allows everything.
"""
