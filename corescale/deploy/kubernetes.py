"""`corescale deploy BUNDLE --target kubernetes --out DIR`: the manifests a user applies (docs/deploy.md#kubernetes).

One pod is the bundle's whole layout (every instance, its front or fronts), not one pod per instance: that is what
was measured (one front and one queue before N pinned instances, or server.fronts of them each before its share;
the capacity in the record is that service's), the image's `corescale serve /bundle` runs it unchanged, and the
kubelet's static CPU manager hands the one container exclusive whole cores (Guaranteed QoS: integer CPU requests
equal to limits, memory too; `full-pcpus-only`: never half a core) inside which serve places the layout's blocks
again (serve/opened.placed_here: a container's CPUs are the kubelet's choice, never the measured ids). A pod per
instance would run a front per block on the block's own cores, a service nobody measured. The pod asks for the
layout's cores times the measured machine's threads per core when the layout left the siblings idle
(use_logical_cores=false): the siblings are part of the core a block held.

What is written: `corescale.yaml` (a Deployment, its Service, a HorizontalPodAutoscaler on the measured per-pod
capacity through the Prometheus metric `corescale_inputs_per_second` — inputs computed per second, from
/metrics' `corescale_inputs_total` — not CPU %), `kubelet-config.yaml` (the nodes' kubelet settings),
`prometheus-adapter-rules.yaml` (the metric for the autoscaler) and a README.md saying what each figure came from.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corescale.analysis.fleet import UTILISATION
from corescale.deploy import DeployOptions
from corescale.deploy.source import CheckedBundle, read_bundle, write_folder
from corescale.errors import UserError
from corescale.measure.http.contract import API_KEY_ENV, STOP_S
from corescale.serve.examples import pip_pins

MANIFESTS, KUBELET, ADAPTER, README = "corescale.yaml", "kubelet-config.yaml", "prometheus-adapter-rules.yaml", \
    "README.md"
PORT = 8080
PRESTOP_S = 10  # the pod keeps serving while its endpoint is removed from the Service, then SIGTERM drains
METRIC = "corescale_inputs_per_second"  # the autoscaler's: rate(corescale_inputs_total) per pod
SERIES = "corescale_inputs_total"
FRONT_BYTES = 512 * 2**20  # the front (HTTP server, tokenizer, metrics) assumed on top of the instances
MEMORY_MARGIN = 1.25  # over the measured peak resident memory
MEMORY_STEP = 64 * 2**20
SCRATCH_MARGIN = 512 * 2**20  # the pod's /tmp beyond the bundle's copy: the instances' logs, compiled models
MAX_REPLICAS = 10
NODE_LABEL = "corescale.io/cpu-manager"  # the label of nodes whose kubelet runs kubelet-config.yaml's policies
NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")  # a DNS-1035 label: a Service's name
IMAGE = re.compile(r"[a-z0-9][a-z0-9._/:@-]{0,254}")
NFD_PREFIX = "feature.node.kubernetes.io/cpu-cpuid."  # node-feature-discovery's labels of CPU features


@dataclass(frozen=True)
class PodPlan:
    """What one pod is and carries, each figure with where it came from."""

    name: str
    image: str
    namespace: str | None
    instances: int
    cores: int  # physical cores of the whole layout
    threads_per_core: int  # the nodes' (--threads-per-core), else the measured machine's: whole cores
    cpus: int  # the pod's CPU request and limit: cores x threads_per_core
    memory_bytes: int
    memory_basis: str
    capacity_qps: float  # inputs per second one pod carries under the SLO (or offline, when no SLO was measured)
    capacity_basis: str
    single_node: bool  # every instance on one NUMA node: the topology manager can keep the pod on one
    cpu_features: tuple[str, ...]
    arch: str  # the nodes' kubernetes.io/arch
    measured_on: str
    pins: str = ""  # the measured library versions serve requires, as pip pins ("onnxruntime==1.32.0 ...")
    fronts: int = 1  # the bundle's server.fronts: front processes, each before its share of the instances
    served_model_names: tuple[str, ...] = ()  # --served-model-name, passed to the pod's corescale serve
    protection_words: tuple[str, ...] = ()  # serve's bounds given to deploy (--max-queue 64 ...), passed on likewise
    scratch_bytes: int = 0  # the pod's /tmp: serve's verified copy of the bundle, its logs and compiled models
    api_key: bool = True  # the pods need the key Secret (--no-api-key: they serve without one)

    @property
    def fronts_words(self) -> str:
        return "one front" if self.fronts == 1 else f"{self.fronts} fronts (each before its share of them)"

    @property
    def target_qps(self) -> float:
        return self.capacity_qps * UTILISATION

    @property
    def grace_s(self) -> int:
        return PRESTOP_S + STOP_S


def deploy(path: Path, options: DeployOptions) -> int:
    """Checks the options and the bundle, writes the manifests into --out whole, says where and what."""
    name = object_name(options.name)
    image = options.image or None
    if image is not None and not IMAGE.fullmatch(image):
        raise UserError(f"--image '{image[:80]}': expected an image reference such as registry/name:tag (lower case)")
    if options.namespace is not None and not NAME.fullmatch(options.namespace):
        raise UserError(f"--namespace '{options.namespace[:80]}': expected a DNS label (a-z, 0-9, '-', at most 63)")
    checked = read_bundle(path, options.trust, options.key)
    plan = dataclasses.replace(pod_plan(checked, name or default_name(checked), image, options.namespace,
                                        options.threads_per_core), served_model_names=options.served_model_names,
                               protection_words=options.protection_words,
                               scratch_bytes=scratch_bytes(checked.size_bytes), api_key=not options.no_api_key)
    files = manifests(plan)
    assert options.out is not None  # the command checked it (the target writes files)
    write_folder(options.out, files)
    print(f"corescale deploy: wrote {', '.join(files)} into {options.out}: pods of {plan.cpus} CPU(s) and "
          f"{plan.memory_bytes // 2**20} MiB (Guaranteed), scaled at {plan.target_qps:.4g} inputs/s per pod "
          f"({UTILISATION:.0%} of {plan.capacity_qps:.4g}); build the image first: docker build -f "
          f"Dockerfile.example -t {plan.image} {shlex.quote(str(path))}")
    if "offline" in plan.capacity_basis:
        print(f"corescale deploy: warning: {plan.capacity_basis}", file=sys.stderr)
    return 0


def object_name(given: str | None) -> str | None:
    if given is not None and not NAME.fullmatch(given):
        raise UserError(f"--name '{given[:80]}': expected a DNS label (a-z, 0-9 and '-', starting with a letter, at "
                        "most 63 characters)")
    return given


def default_name(checked: CheckedBundle) -> str:
    """corescale-MODEL, the model's last path part in DNS-label letters."""
    model = re.sub(r"[^a-z0-9]+", "-", Path(checked.manifest.model or "model").name.lower()).strip("-")
    return f"corescale-{model}"[:63].rstrip("-")


def pod_plan(checked: CheckedBundle, name: str, image: str | None, namespace: str | None,
             node_threads: int | None = None) -> PodPlan:
    """The pod of the bundle's layout; `node_threads`: the nodes' threads per core when not the measuring
    machine's (a pod asks for whole cores, so for each core all its threads)."""
    record, manifest = checked.record, checked.manifest
    cfg = manifest.serving_config
    topology = record.environment.topology
    smt = max(1, (topology.logical_cpus or 1) // max(1, topology.physical_cores or 1))
    instances = manifest.layout.instances
    if cfg.use_logical_cores:  # the blocks hold the siblings already
        cores = sum(math.ceil(len(i.cpus) / smt) for i in instances)
    else:
        cores = sum(len(i.cpus) for i in instances)
    memory, memory_basis = pod_memory(checked)
    capacity, capacity_basis = pod_capacity(checked)
    nodes = {node for i in instances for node in i.numa_nodes}
    isa = record.environment.cpu.isa
    per_core = node_threads or smt
    return PodPlan(name, image or f"{name}:{manifest_digest(checked)}", namespace, len(instances), cores, per_core,
                   cores * per_core, memory, memory_basis, capacity, capacity_basis, len(nodes) <= 1,
                   tuple(manifest.requires.cpu_features), "arm64" if isa.get("asimd") else "amd64",
                   f"{record.environment.cpu.model or 'an unnamed CPU'} ({record.started_at or 'undated'})",
                   pip_pins(manifest.requires.libraries),
                   cfg.server.fronts)


def manifest_digest(checked: CheckedBundle) -> str:
    """The image tag: the first 12 hex digits of the manifest's sha256 (which holds every file's)."""
    from corescale.serve.manifest import MANIFEST

    return hashlib.sha256((checked.root / MANIFEST).read_bytes()).hexdigest()[:12]


def pod_memory(checked: CheckedBundle) -> tuple[int, str]:
    """Requests = limits: the instances' measured peak resident memory and the front, with a margin; without a
    measured figure, twice the bundle's size per instance (the model loaded and its working memory)."""
    metrics, count = checked.record.metrics, len(checked.manifest.layout.instances)
    fronts = checked.manifest.serving_config.server.fronts  # each front a process of its own (serve --fronts)
    if metrics is not None and metrics.per_instance:
        measured = sum(i.peak_rss_bytes for i in metrics.per_instance)
        basis = f"the instances' measured peak resident memory ({measured / 2**20:.0f} MiB together)"
    else:
        measured = 2 * checked.size_bytes * count
        basis = (f"no resident memory in the record: twice the bundle's {checked.size_bytes / 2**20:.0f} MiB per "
                 f"instance ({count})")
    total = (measured + fronts * FRONT_BYTES) * MEMORY_MARGIN
    rounded = math.ceil(total / MEMORY_STEP) * MEMORY_STEP
    each = f"{fronts} x {FRONT_BYTES // 2**20} MiB for the fronts" if fronts > 1 else \
        f"{FRONT_BYTES // 2**20} MiB for the front"
    return rounded, f"{basis} + {each}, x{MEMORY_MARGIN:g}, rounded up to {MEMORY_STEP // 2**20} MiB"


def pod_capacity(checked: CheckedBundle) -> tuple[float, str]:
    """Inputs per second one pod carries: the highest rate whose p99 met the SLO (LoadGen's server scenario),
    else the offline throughput (no latency bound: said)."""
    server, metrics = checked.record.server, checked.record.metrics
    if server is not None and server.max_valid_qps:
        knee = f"; the load curve's knee at {server.knee_qps:.4g}" if server.knee_qps else ""
        return float(server.max_valid_qps), (f"the highest rate whose p99 met {server.slo_p99_ms:g} ms (LoadGen's "
                                             f"server scenario): {server.max_valid_qps:.4g} inputs/s{knee}")
    if metrics is not None and metrics.throughput_samples_per_s > 0:
        return float(metrics.throughput_samples_per_s), (
            f"the offline throughput, {metrics.throughput_samples_per_s:.4g} inputs/s, with no latency bound: the "
            "bundle measured no SLO (measure it with scenario=server target_qps=auto slo_p99_ms=MS --bundle DIR "
            "for a capacity under one)")
    raise UserError(f"bundle '{checked.root}': its record holds no throughput to size the autoscaler with")


def labels(plan: PodPlan) -> dict[str, str]:
    return {"app.kubernetes.io/name": "corescale-serve", "app.kubernetes.io/instance": plan.name}


def metadata(plan: PodPlan, **more: Any) -> dict[str, Any]:
    found: dict[str, Any] = {"name": plan.name, "labels": labels(plan), **more}
    if plan.namespace:
        found["namespace"] = plan.namespace
    return found


def probe(period_s: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": period_s, "timeoutSeconds": 2,
            "failureThreshold": failures}


def node_affinity(plan: PodPlan) -> dict[str, Any]:
    """The nodes that may run the pod: this architecture, the CPU features the bundle's precision computes with
    (node-feature-discovery's labels), the kubelet policies (NODE_LABEL, set by whoever applied them)."""
    terms = [{"key": "kubernetes.io/arch", "operator": "In", "values": [plan.arch]},
             {"key": NODE_LABEL, "operator": "In", "values": ["static"]}]
    terms += [{"key": NFD_PREFIX + nfd_name(flag), "operator": "In", "values": ["true"]}
              for flag in plan.cpu_features if re.fullmatch(r"[a-z0-9_]+", flag)]
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": terms}]}}}


def nfd_name(flag: str) -> str:
    """node-feature-discovery's name of a /proc/cpuinfo flag: upper case without '_' (avx512_vnni -> AVX512VNNI),
    fma its FMA3."""
    return "FMA3" if flag == "fma" else flag.replace("_", "").upper()


def scratch_bytes(bundle_bytes: int) -> int:
    """The pod's /tmp: serve copies the bundle there (verified), plus its instances' logs and compiled models."""
    return 2 * bundle_bytes + SCRATCH_MARGIN


def deployment(plan: PodPlan) -> dict[str, Any]:
    scratch = f"{-(-plan.scratch_bytes // 2**20)}Mi"
    resources = {"cpu": str(plan.cpus), "memory": f"{plan.memory_bytes // 2**20}Mi", "ephemeral-storage": scratch}
    key = [{"name": API_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": f"{plan.name}-api-key", "key": "key"}}}]
    container = {
        "name": "serve",
        "image": plan.image,
        "command": ["corescale", "serve", "/bundle", "--host", "0.0.0.0", "--port", str(PORT),
                    *(["--served-model-name", *plan.served_model_names] if plan.served_model_names else []),
                    *plan.protection_words],
        "ports": [{"name": "http", "containerPort": PORT}],
        "env": [*(key if plan.api_key else []),  # required: a missing Secret must not serve the cluster unkeyed
                {"name": "HOME", "value": "/tmp"}, {"name": "TMPDIR", "value": "/tmp"}],
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "startupProbe": probe(5, 120),  # loading and warming every instance: up to 10 minutes
        "readinessProbe": probe(5, 1),
        "livenessProbe": probe(10, 6),  # the supervisor restarts a dead instance itself: a minute before this
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_S)]}}},
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "allowPrivilegeEscalation": False,
                            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    annotations = {"prometheus.io/scrape": "true", "prometheus.io/port": str(PORT), "prometheus.io/path": "/metrics"}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": metadata(plan, annotations={
            "corescale.io/layout": f"{plan.instances} instance(s) on {plan.cores} whole core(s)",
            "corescale.io/capacity": plan.capacity_basis[:250]}),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels(plan)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": labels(plan), "annotations": annotations},
                "spec": {
                    "terminationGracePeriodSeconds": plan.grace_s,
                    "automountServiceAccountToken": False,  # it runs third-party graphs: no API token in reach
                    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},  # Pod Security "restricted"
                    "affinity": node_affinity(plan),
                    "containers": [container],
                    "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": scratch}}],
                },
            },
        },
    }


def service(plan: PodPlan) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata(plan),
            "spec": {"selector": labels(plan), "ports": [{"name": "http", "port": PORT, "targetPort": "http"}]}}


def autoscaler(plan: PodPlan) -> dict[str, Any]:
    target = f"{math.floor(plan.target_qps * 1000)}m"  # a quantity in thousandths: no float in YAML
    return {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": metadata(plan),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": plan.name},
            "minReplicas": 1, "maxReplicas": MAX_REPLICAS,
            "metrics": [{"type": "Pods", "pods": {"metric": {"name": METRIC},
                                                  "target": {"type": "AverageValue", "averageValue": target}}}],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}},
        },
    }


def documents(plan: PodPlan) -> list[dict[str, Any]]:
    """The objects `kubectl apply -f corescale.yaml` creates (tests validate each against the schemas)."""
    return [deployment(plan), service(plan), autoscaler(plan)]


def kubelet_config(plan: PodPlan) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "cpuManagerPolicy": "static",
        "cpuManagerPolicyOptions": {"full-pcpus-only": "true"},
        "topologyManagerPolicy": "single-numa-node" if plan.single_node else "best-effort",
        "topologyManagerScope": "pod",
        "reservedSystemCPUs": "0",
    }


def adapter_rules() -> dict[str, Any]:
    return {"rules": [{
        "seriesQuery": f'{SERIES}{{namespace!="",pod!=""}}',
        "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
        "name": {"matches": f"^{SERIES}$", "as": METRIC},
        "metricsQuery": "sum(rate(<<.Series>>{<<.LabelMatchers>>}[1m])) by (<<.GroupBy>>)",
    }]}


def manifests(plan: PodPlan) -> dict[str, str]:
    import yaml

    def dump(doc: dict[str, Any]) -> str:
        return yaml.safe_dump(doc, sort_keys=False, width=120)

    head = f"# corescale deploy --target kubernetes: {plan.instances} instance(s) measured on {plan.measured_on}\n"
    kubelet_head = (
        "# The kubelet settings of the nodes that run these pods (merge into the kubelet's --config file). The\n"
        "# static CPU manager gives a Guaranteed pod's integer CPUs to it alone; full-pcpus-only only whole\n"
        "# physical cores (never one sibling of a core another pod uses); the topology manager keeps them\n"
        f"# {'on one NUMA node' if plan.single_node else 'near (the layout spans NUMA nodes)'}. reservedSystemCPUs:\n"
        "# the system's and the kubelet's CPUs (the static policy needs some; on an SMT machine reserve a whole\n"
        "# core: its siblings). A policy change needs: drain the node, stop the kubelet, remove\n"
        "# /var/lib/kubelet/cpu_manager_state, start it; then label the node: kubectl label node NODE "
        f"{NODE_LABEL}=static\n")
    return {
        MANIFESTS: head + "---\n".join(dump(doc) for doc in documents(plan)),
        KUBELET: kubelet_head + dump(kubelet_config(plan)),
        ADAPTER: ("# prometheus-adapter's rule (its config file, or the Helm chart's `rules.custom`): the pods' "
                  f"{METRIC},\n# the per-second rate of /metrics' {SERIES}, for the HorizontalPodAutoscaler\n"
                  + dump(adapter_rules())),
        README: readme(plan),
    }


def api_key_line(plan: PodPlan) -> str:
    if not plan.api_key:
        return ("No API key (deploy --no-api-key): whoever reaches the Service uses it; keep it to a namespace no one "
                "else reaches (a NetworkPolicy).")
    return (f"The API key: create the Secret `{plan.name}-api-key` with the key under `key` (`kubectl create secret "
            f"generic {plan.name}-api-key --from-literal=key=...`) before applying; a pod does not start without "
            f"it (`{API_KEY_ENV}`). /metrics needs it too (Prometheus' bearer token).")


def readme(plan: PodPlan) -> str:
    return f"""# corescale on Kubernetes

`kubectl apply -f {MANIFESTS}` after three steps (docs/deploy.md#kubernetes):

1. Build and push the image from the bundle's own Dockerfile: `docker build -f Dockerfile.example -t {plan.image}
   BUNDLE` (edit the Deployment's image to where you push it). `corescale serve` refuses other versions of the
   libraries the bundle was measured with: {plan.pins or 'none listed'}; pin them in the Dockerfile's pip line
   (`pip install ... {plan.pins}`) when corescale[all] installs others.
2. On the nodes: the kubelet settings in `{KUBELET}` (static CPU manager, full-pcpus-only, topology manager), then
   `kubectl label node NODE {NODE_LABEL}=static`. The pods also require kubernetes.io/arch={plan.arch} and
   node-feature-discovery's labels for the CPU features the bundle was measured with
   ({', '.join(plan.cpu_features) or 'none'}); without node-feature-discovery, remove those terms.
3. The autoscaler's metric: Prometheus scraping the pods (the `prometheus.io/*` annotations, or a PodMonitor)
   and prometheus-adapter with the rule in `{ADAPTER}`.

What each figure is:

- One pod = the bundle's layout: {plan.instances} pinned instance(s) and {plan.fronts_words} on {plan.cores} whole
  core(s) ({plan.threads_per_core} thread(s) per core, the nodes' as given or the measured machine's: {plan.cpus}
  CPU(s); on nodes with another count, deploy again with --threads-per-core N). Requests = limits
  (Guaranteed QoS), so the static CPU manager gives the container exclusive CPUs; `corescale serve` places the
  blocks on the CPUs it was given (never outside them).
- Memory {plan.memory_bytes // 2**20} MiB: {plan.memory_basis}.
- Capacity per pod: {plan.capacity_basis}; measured on {plan.measured_on}. The autoscaler keeps each pod at
  most at {UTILISATION:.0%} of it: {plan.target_qps:.4g} inputs/s ({METRIC}), from 1 to {MAX_REPLICAS} pods;
  not CPU %, which a pinned, batching service shows high long before it is slow. On another CPU the capacity
  differs: measure there.
- Readiness and liveness on GET /health (200 once an instance is ready); SIGTERM drains every accepted request
  within {STOP_S} s; the pod first keeps serving {PRESTOP_S} s (preStop) while the Service stops routing to it:
  terminationGracePeriodSeconds {plan.grace_s}.
- {api_key_line(plan)}
"""
