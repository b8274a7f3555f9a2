// What tests/prometheus.rs evaluates: the kubernetes-mixin's Kubelet dashboard queries and
// its kubelet, storage, resource and system alert and recording rule expressions, rendered
// with kube-prometheus' selectors (every kubelet endpoint scraped as job "kubelet", told
// apart by metrics_path). See README.md for the sources and the command that renders it.
local mixin = (import 'mixin.libsonnet') + {
  _config+:: {
    cadvisorSelector: 'job="kubelet", metrics_path="/metrics/cadvisor"',
    kubeletSelector: 'job="kubelet", metrics_path="/metrics"',
  },
};
local alertGroups = ['kubernetes-resources', 'kubernetes-storage', 'kubernetes-system', 'kubernetes-system-kubelet'];
local ruleGroups = ['k8s.rules', 'node.rules', 'kubelet.rules'];
local dashboard = mixin.grafanaDashboards['kubelet.json'];
local panels = std.flattenArrays([row.panels for row in dashboard.rows]);
{
  rule_groups: [g for g in mixin.prometheusRules.groups if std.member(ruleGroups, g.name)],
  alerts: [
    { group: g.name, name: r.alert, expr: r.expr }
    for g in mixin.prometheusAlerts.groups
    if std.member(alertGroups, g.name)
    for r in g.rules
  ],
  rules: [
    { group: g.name, name: r.record, expr: r.expr }
    for g in mixin.prometheusRules.groups
    if std.member(ruleGroups, g.name)
    for r in g.rules
  ],
  dashboard: [
    { panel: p.title, expr: t.expr }
    for p in panels
    if std.objectHas(p, 'targets')
    for t in p.targets
  ],
}
