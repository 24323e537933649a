"""`corescale deploy BUNDLE --target kubernetes --out DIR`: the manifests validate against the Kubernetes schemas
(kubernetes-validate, strict, offline), the pods are Guaranteed on the layout's whole cores, the autoscaler scales
on the measured capacity, and a bad bundle is one line, exit 2, nothing in --out (no process is started here)."""

import json
import shutil
from pathlib import Path

import pytest
import yaml

from corescale.analysis.fleet import UTILISATION
from corescale.cli import main
from corescale.deploy import kubernetes
from corescale.measure.http.contract import STOP_S
from corescale.record.trial import TrialRecord
from corescale.serve import bundle

DATA = Path(__file__).parent / "data"
ONE_BY_TWO = next((DATA / "tune1").glob("*-161609-*/result.json"))  # 1 instance on CPUs 0-1
TWO_BY_ONE = next((DATA / "tune1").glob("*-161621-*/result.json"))  # 2 instances on CPUs 0 and 1
SERVER = next((DATA / "schema2").glob("*pytorch*/result.json"))  # a server-scenario search: max valid QPS 416
VERSIONS = ("1.30.0", "1.37.0")  # the oldest Kubernetes these manifests claim, and the newest schemas installed


def make_bundle(where: Path, record_file: Path, server: bool = False, fronts: int = 1) -> Path:
    """A folder shaped like a bundle of a stored record: its files with their sha256, the record's layout;
    `fronts`: its config's server.fronts (as a managed trial of that many fronts records it)."""
    root = where / "bundle"
    root.mkdir(parents=True)
    record = json.loads(record_file.read_text())
    if server:
        record["server"] = json.loads(SERVER.read_text())["server"]
    if fronts > 1:
        record["config"].setdefault("server", {})["fronts"] = fronts
    (root / bundle.RECORD).write_text(json.dumps(record))
    (root / "tokenizer").mkdir()
    (root / "tokenizer" / "tokenizer.json").write_text("{}")
    typed = TrialRecord.from_json(record)
    layout = {"instances": [{k: spec[k] for k in ("id", "cpus", "numa_nodes", "threads", "batch_size")}
                            for spec in record["specs"]]}
    manifest = {"format": bundle.FORMAT, "config": bundle.manifest_config(typed.config, None, True),
                "layout": layout, "head": {"task": "embed"}, "model": typed.config.model,
                "precision": typed.config.precision,
                "requires": {"cpu_features": ["avx512f"], "libraries": {"onnxruntime": "1.32.0", "bad lib": "1 && x"}},
                "files": {p.relative_to(root).as_posix(): bundle.sha256(p) for p in root.rglob("*") if p.is_file()}}
    (root / bundle.MANIFEST).write_text(json.dumps(manifest))
    return root


def deploy(bundle_dir: Path, out: Path, *more: str) -> int:
    return main(["deploy", str(bundle_dir), "--target", "kubernetes", "--out", str(out), *more])


def written(out: Path) -> dict:
    docs = list(yaml.safe_load_all((out / kubernetes.MANIFESTS).read_text()))
    return {doc["kind"]: doc for doc in docs}


def test_the_manifests_validate_against_the_kubernetes_schemas(tmp_path, capsys):
    validate = pytest.importorskip("kubernetes_validate")
    out = tmp_path / "k8s"
    assert deploy(make_bundle(tmp_path, TWO_BY_ONE, server=True), out) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted([kubernetes.MANIFESTS, kubernetes.KUBELET,
                                                            kubernetes.ADAPTER, kubernetes.README])
    objects = written(out)
    assert set(objects) == {"Deployment", "Service", "HorizontalPodAutoscaler"}
    for doc in objects.values():
        for version in VERSIONS:
            validate.validate(doc, version, strict=True)  # raises ValidationError naming the field
    kubelet = yaml.safe_load((out / kubernetes.KUBELET).read_text())
    assert kubelet["cpuManagerPolicy"] == "static" and kubelet["cpuManagerPolicyOptions"] == {"full-pcpus-only": "true"}
    assert kubelet["topologyManagerPolicy"] == "single-numa-node"  # the layout is on one NUMA node
    assert "wrote" in capsys.readouterr().out


def test_a_bad_object_fails_the_schema_check():
    """The check has teeth: a misspelt field or a wrong type is refused."""
    validate = pytest.importorskip("kubernetes_validate")
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}, "spec": {"portz": []}}
    with pytest.raises(validate.ValidationError):
        validate.validate(service, VERSIONS[-1], strict=True)


@pytest.mark.parametrize("record_file, cpus, more", [(ONE_BY_TWO, 2, []), (TWO_BY_ONE, 2, []),
                                                     (TWO_BY_ONE, 4, ["--threads-per-core", "2"])],
                         ids=["1x2", "2x1", "2x1-on-smt-nodes"])
def test_pods_are_guaranteed_on_the_layouts_whole_cores(tmp_path, record_file, cpus, more):
    """The measured machine has one thread per core: a pod asks for the layout's cores; on nodes of two threads
    per core, for both threads of each (full-pcpus-only admits whole cores only)."""
    out = tmp_path / "k8s"
    assert deploy(make_bundle(tmp_path, record_file), out, *more) == 0
    pod = written(out)["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    resources = container["resources"]
    assert resources["requests"] == resources["limits"]  # Guaranteed QoS: CPU and memory
    assert resources["limits"]["cpu"] == str(cpus)  # an integer: exclusive CPUs under the static policy
    record = TrialRecord.from_json(json.loads(record_file.read_text()))
    rss = sum(i.peak_rss_bytes for i in record.metrics.per_instance)
    mib = int(resources["limits"]["memory"].removesuffix("Mi"))
    assert rss / 2**20 < mib <= ((rss + kubernetes.FRONT_BYTES) * kubernetes.MEMORY_MARGIN) / 2**20 + 64
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["path"] == "/health"
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", str(kubernetes.PRESTOP_S)]
    assert pod["terminationGracePeriodSeconds"] == kubernetes.PRESTOP_S + STOP_S
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    keys = {term["key"] for term in terms[0]["matchExpressions"]}
    assert {kubernetes.NODE_LABEL, "kubernetes.io/arch", "feature.node.kubernetes.io/cpu-cpuid.AVX512F"} <= keys


def test_a_bundle_measured_with_two_fronts_runs_them_and_has_the_memory_for_them(tmp_path):
    out = tmp_path / "k8s"
    assert deploy(make_bundle(tmp_path, TWO_BY_ONE, fronts=2), out) == 0
    (container,) = written(out)["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert container["command"][:3] == ["corescale", "serve", "/bundle"]  # serve reads server.fronts from it
    record = TrialRecord.from_json(json.loads(TWO_BY_ONE.read_text()))
    rss = sum(i.peak_rss_bytes for i in record.metrics.per_instance)
    mib = int(container["resources"]["limits"]["memory"].removesuffix("Mi"))
    assert (rss + 2 * kubernetes.FRONT_BYTES) * kubernetes.MEMORY_MARGIN / 2**20 <= mib
    readme = (out / kubernetes.README).read_text()
    assert "2 fronts (each before its share of them)" in readme and "2 x 512 MiB for the fronts" in readme


def test_the_autoscaler_scales_on_the_measured_capacity_not_cpu(tmp_path):
    out = tmp_path / "k8s"
    assert deploy(make_bundle(tmp_path, TWO_BY_ONE, server=True), out) == 0
    hpa = written(out)["HorizontalPodAutoscaler"]["spec"]
    (metric,) = hpa["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] == kubernetes.METRIC
    target = metric["pods"]["target"]["averageValue"]
    assert target.endswith("m") and int(target[:-1]) == int(416.0 * UTILISATION * 1000)  # the record's max QPS
    rules = yaml.safe_load((out / kubernetes.ADAPTER).read_text())["rules"]
    assert rules[0]["name"]["as"] == kubernetes.METRIC and kubernetes.SERIES in rules[0]["seriesQuery"]


def test_the_metric_the_rule_reads_is_one_metrics_exposes():
    pytest.importorskip("prometheus_client")
    from prometheus_client import generate_latest

    from corescale.serve.metrics import Metrics

    text = generate_latest(Metrics().registry).decode()
    assert f"\n{kubernetes.SERIES} 0.0\n" in text


def test_an_offline_bundle_is_sized_on_its_throughput_and_says_so(tmp_path, capsys):
    out = tmp_path / "k8s"
    assert deploy(make_bundle(tmp_path, ONE_BY_TWO), out) == 0
    assert "no latency bound" in capsys.readouterr().err
    readme = (out / kubernetes.README).read_text()
    assert "offline throughput" in readme
    assert "onnxruntime==1.32.0" in readme and "bad lib" not in readme  # the pins, never a shell word


def tamper(root: Path) -> None:
    (root / "tokenizer" / "tokenizer.json").write_text('{"changed": true}')


def no_manifest(root: Path) -> None:
    (root / bundle.MANIFEST).unlink()


def bad_layout(root: Path) -> None:
    manifest = json.loads((root / bundle.MANIFEST).read_text())
    manifest["layout"]["instances"][0]["cpus"] = [7]
    (root / bundle.MANIFEST).write_text(json.dumps(manifest))


def asks_remote_code(root: Path) -> None:
    manifest = json.loads((root / bundle.MANIFEST).read_text())
    manifest["config"]["trust_remote_code"] = True
    (root / bundle.MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize("spoil, words", [
    (tamper, "does not match its sha256"),
    (no_manifest, "not a corescale bundle"),
    (bad_layout, "is not the one its record.json measured"),
    (asks_remote_code, "asks for trust_remote_code"),
])
def test_a_bad_bundle_is_one_line_and_nothing_in_out(tmp_path, capsys, spoil, words):
    root = make_bundle(tmp_path, TWO_BY_ONE)
    spoil(root)
    out = tmp_path / "k8s"
    out.mkdir()  # an empty --out stays empty
    assert deploy(root, out) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("corescale: error: ") and words in err[0], err
    assert list(out.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["bundle", "k8s"]


@pytest.mark.parametrize("more, words", [
    (["--name", "Not_A_Label"], "--name 'Not_A_Label': expected a DNS label"),
    (["--namespace", "x_y"], "--namespace 'x_y'"),
    (["--image", "UPPER:case"], "--image 'UPPER:case'"),
])
def test_bad_options_are_one_line(tmp_path, capsys, more, words):
    out = tmp_path / "k8s"
    assert deploy(make_bundle(tmp_path, TWO_BY_ONE), out, *more) == 2
    assert words in capsys.readouterr().err and not out.exists()


def test_out_must_be_new_or_empty(tmp_path, capsys):
    out = tmp_path / "k8s"
    out.mkdir()
    (out / "earlier.yaml").write_text("kept\n")
    assert deploy(make_bundle(tmp_path, TWO_BY_ONE), out) == 2
    assert "is not empty" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["earlier.yaml"]
    assert main(["deploy", str(tmp_path / "bundle"), "--target", "kubernetes"]) == 2
    assert "give --out DIR" in capsys.readouterr().err


def test_names_and_image_follow_the_options(tmp_path):
    out = tmp_path / "k8s"
    assert deploy(make_bundle(tmp_path, TWO_BY_ONE), out, "--name", "embedder", "--image",
                  "registry.example/embedder:1", "--namespace", "search") == 0
    objects = written(out)
    assert {doc["metadata"]["name"] for doc in objects.values()} == {"embedder"}
    assert {doc["metadata"]["namespace"] for doc in objects.values()} == {"search"}
    assert objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]["image"] == \
        "registry.example/embedder:1"
    shutil.rmtree(out)
    assert deploy(tmp_path / "bundle", out) == 0
    image = written(out)["Deployment"]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.startswith("corescale-bert-tiny:") and len(image.split(":")[1]) == 12


def test_the_pod_meets_pod_security_restricted_and_needs_its_key(tmp_path):
    """Review 0.4 L3: seccomp RuntimeDefault, no service-account token, /tmp bounded (serve copies the bundle
    there), the key Secret required (a missing one served the cluster unkeyed); --no-api-key serves without."""
    root = make_bundle(tmp_path, TWO_BY_ONE, server=True)
    assert deploy(root, tmp_path / "k8s") == 0
    pod = written(tmp_path / "k8s")["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    scratch = pod["volumes"][0]["emptyDir"]["sizeLimit"]
    assert scratch == container["resources"]["limits"]["ephemeral-storage"] == \
        container["resources"]["requests"]["ephemeral-storage"]
    assert int(scratch.removesuffix("Mi")) * 2**20 >= kubernetes.SCRATCH_MARGIN
    (key,) = [e for e in container["env"] if e["name"] == "CORESCALE_API_KEY"]
    assert "optional" not in key["valueFrom"]["secretKeyRef"]
    assert "kubectl create secret" in (tmp_path / "k8s" / kubernetes.README).read_text()
    assert deploy(root, tmp_path / "open", "--no-api-key") == 0
    (open_container,) = written(tmp_path / "open")["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert all(e["name"] != "CORESCALE_API_KEY" for e in open_container["env"])


def test_the_example_image_pins_the_measured_libraries_runs_unprivileged_and_drains():
    """Review 0.4 L5: root, unpinned libraries that serve then refuses, a 10 s stop, no init as PID 1."""
    from corescale.measure.http.contract import STOP_S
    from corescale.serve.examples import dockerfile, pip_pins

    pins = pip_pins({"onnxruntime": "1.32.0", "bad lib": "1 && x", "numpy": None})
    assert pins == "onnxruntime==1.32.0"
    text = dockerfile([0, 1], pins)
    assert "'corescale[all]' onnxruntime==1.32.0" in text and "USER 65532" in text
    assert f"--stop-timeout {STOP_S}" in text and 'ENTRYPOINT ["tini", "--"]' in text
