{{- /* The servers' policy, for the pods of one component (server; with `scheduler.separate`, the
     scheduler's too): a dict of `root`, `name` and `component`. */ -}}
{{- define "gpufed.serverNetworkPolicy" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $np := $v.networkPolicy -}}
# The servers: in only on the gRPC and HTTP ports; out only to DNS, etcd, the history database,
# member clusters' API servers and the object stores (docs/deploy.md, "Network").
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: {{ .name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpufed.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
spec:
  podSelector:
    matchLabels:
      {{- include "gpufed.componentSelector" (dict "root" $root "component" .component) | nindent 6 }}
  policyTypes: [Ingress, Egress]
  ingress:
    - ports:
        - port: grpc
          protocol: TCP
        - port: http
          protocol: TCP
      {{- with $np.ingressFrom }}
      from:
        {{- toYaml . | nindent 8 }}
      {{- end }}
  egress:
    - to:
        - namespaceSelector:
            matchLabels:
              kubernetes.io/metadata.name: kube-system
      ports:
        - port: 53
          protocol: UDP
        - port: 53
          protocol: TCP
    {{- if eq $v.etcd.mode "statefulset" }}
    - to:
        - podSelector:
            matchLabels:
              {{- include "gpufed.etcdSelector" $root | nindent 14 }}
      ports:
        - port: 2379
          protocol: TCP
    {{- else }}
    - to:
        {{- range $v.etcd.external.cidrs }}
        - ipBlock:
            cidr: {{ . }}
        {{- end }}
      ports:
        - port: {{ $v.etcd.external.port }}
          protocol: TCP
    {{- end }}
    {{- if eq $v.history.backend "postgresql" }}
    - to:
        {{- range $np.postgresql.cidrs }}
        - ipBlock:
            cidr: {{ . }}
        {{- end }}
      ports:
        - port: {{ $np.postgresql.port }}
          protocol: TCP
    {{- end }}
    {{- with $np.memberApiServers.cidrs }}
    - to:
        {{- range . }}
        - ipBlock:
            cidr: {{ . }}
        {{- end }}
      ports:
        {{- range $np.memberApiServers.ports }}
        - port: {{ . }}
          protocol: TCP
        {{- end }}
    {{- end }}
    {{- with $np.objectStores.cidrs }}
    - to:
        {{- range . }}
        - ipBlock:
            cidr: {{ . }}
        {{- end }}
      ports:
        {{- range $np.objectStores.ports }}
        - port: {{ . }}
          protocol: TCP
        {{- end }}
    {{- end }}
{{- end -}}
