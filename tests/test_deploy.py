"""deploy/: the Kubernetes manifests render offline (``kubectl kustomize deploy/k8s``) and every object parses
into the ``kubernetes`` client's models without losing a field; the StatefulSets, Services, ConfigMaps and
probes fit together; the Containerfile is well-formed (pinned bases, non-root user, health check on /healthz);
the configs shipped in both are valid streamd configs.

Without kubectl (Debian's kubernetes-client) or the kubernetes package these tests skip, saying so, except in
CI (``CI`` set), which installs both and where a skip would hide a broken deployment."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

DEPLOY = ROOT / "deploy"
CONTAINERFILE = DEPLOY / "Containerfile"
METRICS_PORT = 9108


def need(found: object, what: str) -> None:
    if found:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{what} is missing in CI (.ci/system-packages and the dev extra install it)")
    pytest.skip(f"{what} is not installed here (CI installs it)")


@pytest.fixture(scope="module")
def rendered() -> list[dict]:
    kubectl = shutil.which("kubectl")
    need(kubectl, "kubectl (Debian package kubernetes-client)")
    proc = subprocess.run(
        [str(kubectl), "kustomize", str(DEPLOY / "k8s")], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def by_kind(objects: list[dict], kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def test_every_object_parses_into_the_client_models(rendered) -> None:
    try:
        from kubernetes import client
    except ImportError:
        client = None
    need(client, "the kubernetes Python client (dev extra)")
    api = client.ApiClient()
    for obj in rendered:
        assert obj["apiVersion"] in ("v1", "apps/v1"), obj["apiVersion"]
        model_class = getattr(client, f"V1{obj['kind']}")
        model = model_class.from_dict(obj)  # pydantic: types, required fields
        back = api.sanitize_for_serialization(model)
        # A key the model does not know (a typo, a field of another kind) is dropped on the way: not equal.
        assert back == obj, f"{obj['kind']} {obj['metadata']['name']}: fields lost or changed by the model"
    kinds = Counter(o["kind"] for o in rendered)
    print(f"rendered and parsed: {dict(kinds)}")
    assert kinds == {"StatefulSet": 2, "Service": 2, "ConfigMap": 4}


def test_a_statefulset_per_gpu_pool_wired_to_its_service_config_and_probes(rendered) -> None:
    sets, services, maps = (by_kind(rendered, k) for k in ("StatefulSet", "Service", "ConfigMap"))
    pools = set()
    for name, sts in sets.items():
        spec, pod = sts["spec"], sts["spec"]["template"]["spec"]
        labels = sts["spec"]["template"]["metadata"]["labels"]
        pools.add((labels["streamd.io/gpu-pool"], pod["nodeSelector"]["nvidia.com/gpu.product"]))
        assert spec["selector"]["matchLabels"].items() <= labels.items()
        service = services[spec["serviceName"]]  # the headless Service that serves /metrics
        assert (
            service["spec"]["clusterIP"] == "None" and service["spec"]["selector"].items() <= labels.items()
        )
        assert service["spec"]["selector"]["streamd.io/gpu-pool"] == labels["streamd.io/gpu-pool"]
        (container,) = pod["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports == {"metrics": METRICS_PORT}
        assert [p["targetPort"] for p in service["spec"]["ports"]] == ["metrics"]
        res = container["resources"]
        assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"] == "1", name
        assert {"cpu", "memory"} <= res["requests"].keys() and "memory" in res["limits"]
        for probe in ("startupProbe", "readinessProbe"):
            assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}, probe
        liveness = " ".join(container["livenessProbe"]["exec"]["command"])
        assert f"http://127.0.0.1:{METRICS_PORT}/healthz" in liveness and "pipeline_wedged" in liveness
        volumes = {v["name"]: v for v in pod["volumes"]}
        config_map = maps[volumes["config"]["configMap"]["name"]]  # the generated name, hash included
        assert "streamd.yaml" in config_map["data"]
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert mounts["config"] == "/etc/streamd" and mounts["state"] == "/var/lib/streamd"
        assert [t["metadata"]["name"] for t in spec["volumeClaimTemplates"]] == ["state"]
        env = {e["name"]: e for e in container["env"]}
        ref = env["STREAMD_ETCD_ENDPOINTS"]["valueFrom"]["configMapKeyRef"]
        endpoints = maps[ref["name"]]["data"][ref["key"]].split(",")
        assert endpoints and all(re.fullmatch(r"https?://[\w.-]+:\d+", e) for e in endpoints), endpoints
        assert env["STREAMD_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        security = pod["securityContext"]
        assert security["runAsNonRoot"] is True and security["runAsUser"] == containerfile_user()[0]
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
    print(f"pools: {sorted(pools)}")
    assert len(pools) == len(sets) == 2  # each pool its own label and GPU type


def load_shipped(text: str, tmp_path: Path):
    """A shipped config loaded by streamd's own loader, with the image's folders pointed at this machine's."""
    from streamd.config import load_config

    state = tmp_path / "state"
    state.mkdir()
    text = text.replace("/var/lib/streamd/", f"{state}/").replace("/opt/streamd/samples/", f"{ROOT}/samples/")
    path = tmp_path / "streamd.yaml"
    path.write_text(text)
    # what the StatefulSet passes to every pod (cluster: reads it); a value, never a connection, at load time
    env = {"STREAMD_ETCD_ENDPOINTS": "http://etcd-0.etcd:2379", "STREAMD_NODE_NAME": "streamd-l4-0"}
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        return load_config(path), state


def test_the_configmap_holds_a_valid_config(rendered, tmp_path) -> None:
    texts = [
        m["data"]["streamd.yaml"]
        for m in by_kind(rendered, "ConfigMap").values()
        if "streamd.yaml" in m["data"]
    ]
    assert len(texts) == 2 and texts[0] == texts[1]  # one config for every pool
    config, state = load_shipped(texts[0], tmp_path)
    (sink,) = config.sinks
    assert sink.type == "redis" and sink.spool_dir == state / "spool"  # on the pod's volume
    assert config.metrics.enabled and config.metrics.host == "0.0.0.0" and config.metrics.port == METRICS_PORT
    assert config.cluster.enabled and config.cluster.etcd == ("http://etcd-0.etcd:2379",)  # the pod env
    assert config.cluster.node == "streamd-l4-0"


def test_the_image_default_config_is_valid(tmp_path) -> None:
    config, _ = load_shipped((DEPLOY / "container" / "streamd.yaml").read_text(), tmp_path)
    assert config.streams[0].path == ROOT / "samples" / "vtest.mp4"  # the link the Containerfile makes
    assert config.metrics.host == "0.0.0.0" and config.metrics.port == METRICS_PORT


# -- the Containerfile -------------------------------------------------------------------------------


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order: comments dropped, backslash continuations joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in CONTAINERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        word, _, args = (pending + line).partition(" ")
        out.append((word, args.strip()))
        pending = ""
    assert not pending, "the Containerfile ends inside a continued line"
    return out


def stages() -> list[list[tuple[str, str]]]:
    found: list[list[tuple[str, str]]] = []
    for word, args in instructions():
        if word == "FROM":
            found.append([])
        assert found, "the first instruction must be FROM"
        found[-1].append((word, args))
    return found


def containerfile_user() -> tuple[int, int]:
    users = [args for word, args in stages()[-1] if word == "USER"]
    assert users, "the final stage has no USER: it would run as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and gid.isdigit(), "USER numeric (uid:gid): Kubernetes' runAsNonRoot checks the id"
    return int(uid), int(gid)


def test_containerfile_parses_and_follows_the_rules() -> None:
    known = {"FROM", "RUN", "COPY", "ENV", "ARG", "WORKDIR", "USER", "EXPOSE", "VOLUME", "HEALTHCHECK"}
    known |= {"ENTRYPOINT", "CMD", "LABEL"}
    all_stages = stages()
    for word, args in instructions():
        assert word in known, f"unknown instruction {word}"
        assert args, f"{word} without arguments"
    for stage in all_stages:  # every base pinned by a tag (not latest)
        image = stage[0][1].split()[0]
        name, _, tag = image.rpartition(":")
        assert name and "/" not in tag and tag and tag != "latest", f"base image not pinned by tag: {image}"
    final = all_stages[-1]
    assert re.fullmatch(r"docker\.io/nvidia/cuda:\d+\.\d+\.\d+-runtime-ubuntu\d+\.\d+", final[0][1])
    words = [w for w, _ in final]
    uid, gid = containerfile_user()
    assert uid > 0 and gid > 0 and words.index("USER") > max(i for i, w in enumerate(words) if w == "RUN")
    (health,) = [a for w, a in final if w == "HEALTHCHECK"]
    assert f"http://127.0.0.1:{METRICS_PORT}/healthz" in health and " CMD " in f" {health}"
    assert [a for w, a in final if w == "EXPOSE"] == [str(METRICS_PORT)]
    for word in ("ENTRYPOINT", "CMD"):
        (args,) = [a for w, a in final if w == word]
        assert isinstance(json.loads(args), list), f"{word} in exec (JSON) form: signals reach streamd"
    installs = " ".join(a for w, a in final if w == "RUN")
    extras = re.search(r"streamd-\*\.whl\)\[([\w,]+)\]", installs)
    assert extras and {"gpu", "torch"} <= set(extras.group(1).split(","))
    optional = re.search(
        r"\[project\.optional-dependencies\]\n(.*?)\n\[", (ROOT / "pyproject.toml").read_text(), re.S
    )
    assert optional is not None
    assert set(extras.group(1).split(",")) <= set(re.findall(r"^(\w+) = \[", optional.group(1), re.M))
    for stage in all_stages:  # what COPY takes from the build context (the repository root) exists
        for word, args in stage:
            if word == "COPY" and not args.startswith("--from"):
                *sources, _dest = shlex.split(args)
                for source in sources:
                    assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
