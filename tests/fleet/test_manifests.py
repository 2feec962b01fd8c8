"""`tune fleet`'s manifests: valid against the pinned Kubernetes schema, an Indexed Job of one worker per
pod whose `tune` command is the user's study, no secret written, the trace in a ConfigMap or on a claim
by its size, the database from a Secret."""

from __future__ import annotations

import re

import pytest

from tests.fleet.conftest import STORAGE, TRACE, write_trace
from tracetune.fleet.plan import CONFIGMAP_MAX_BYTES, CONNECTIONS_PER_WORKER, FleetOptions, place_inputs

# name of the variant -> tune fleet's flags, then the study's
VARIANTS = {
    "defaults": ["--workers", "4", "--", "--trace", str(TRACE), "--storage", STORAGE],
    "everything": ["--workers", "16", "--gpus-per-worker", "2", "--with-postgres", "--namespace", "tuning",
                   "--runs-pvc", "runs", "--trace-pvc", "traces", "--name", "nightly", "--cpu", "12",
                   "--memory", "64Gi", "--image", "registry.example.com/tw:1", "--",
                   "--trace", str(TRACE), "--model", str(TRACE.parent), "--trials", "64"],
    "cpu": ["--workers", "2", "--base-image", "python:3.11-slim", "--", "--trace", str(TRACE),
            "--storage", STORAGE, "--engine", "sim"],
}


def _validate_k8s(docs):
    import kubernetes_validate

    for doc in docs:
        kubernetes_validate.validate(doc, "1.37.0", strict=True)


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_manifest_validates_against_the_pinned_schema(fleet, variant):
    run = fleet(*VARIANTS[variant])
    assert run.code == 0, run.stderr
    assert run.docs and {"ConfigMap", "Job"} <= {d["kind"] for d in run.docs}
    _validate_k8s(run.docs)


def test_the_job_runs_one_worker_per_pod_on_its_gpus_and_survives_preemption(fleet):
    run = fleet(*VARIANTS["everything"])
    job = run.kind("Job")
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert spec["completionMode"] == "Indexed" and spec["parallelism"] == spec["completions"] == 16
    assert spec["backoffLimitPerIndex"] == 3 and pod["restartPolicy"] == "Never"
    assert {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]} \
        in spec["podFailurePolicy"]["rules"]
    worker = run.worker
    assert worker["resources"]["requests"]["nvidia.com/gpu"] == 2 == worker["resources"]["limits"]["nvidia.com/gpu"]
    assert worker["resources"]["requests"]["cpu"] == "12" and worker["resources"]["requests"]["memory"] == "64Gi"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"} and pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert worker["image"] == "registry.example.com/tw:1" and worker["command"] == ["tune"]
    env = {e["name"]: e for e in worker["env"]}
    assert env["TRACETUNE_WORKER"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert "job-completion-index" in env["TRACETUNE_WORKER_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
    mounts = {m["name"]: m for m in worker["volumeMounts"]}
    assert mounts["work"]["subPathExpr"] == "worker-$(TRACETUNE_WORKER_INDEX)"  # a run folder per worker
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
    assert claims == {"traces": "traces", "work": "runs", "models": "models"}
    assert all(d["metadata"]["namespace"] == "tuning" for d in run.docs)


def test_a_cpu_engine_asks_for_no_gpu_and_builds_on_the_image_named(fleet):
    run = fleet(*VARIANTS["cpu"])
    pod = run.kind("Job")["spec"]["template"]["spec"]
    assert "nvidia.com/gpu" not in run.worker["resources"]["requests"] and "nodeSelector" not in pod
    assert "FROM python:3.11-slim\n" in run.files["Dockerfile"]


def test_the_dockerfile_builds_on_the_engines_image_with_tracetune(fleet):
    from tracetune.engine_adapter.platform import GPU_VLLM_VERSION

    run = fleet(*VARIANTS["defaults"])
    assert f"FROM vllm/vllm-openai:v{GPU_VLLM_VERSION}\n" in run.files["Dockerfile"]
    assert "pip install" in run.files["Dockerfile"] and "Dockerfile" in run.stderr  # said in the output
    assert run.worker["image"].startswith("tracetune-worker:") and f"v{GPU_VLLM_VERSION}" in run.worker["image"]
    ignored = run.files["Dockerfile.dockerignore"].split()
    assert ".venv" in ignored and ".git" in ignored
    kept = ["pyproject.toml", "README.md", "cli", "fleet", "tracetune", "engine_adapter"]  # what pip install reads
    assert not [name for name in kept if any(re.fullmatch(p.replace("*", ".*"), name) for p in ignored)]


PASSWORD = "hunter2-Zq7vX"


@pytest.mark.parametrize("storage", [f"postgresql://user:{PASSWORD}@db.internal:5432/tracetune",
                                     f"postgresql+psycopg://user@db.internal/tracetune?password={PASSWORD}"])
def test_no_secret_is_written_and_the_url_comes_from_the_secret(fleet, storage):
    run = fleet("--workers", "3", "--db-secret", "study-db", "--", "--trace", str(TRACE), "--storage", storage)
    assert run.code == 0, run.stderr
    for text in [*run.files.values(), run.stdout, run.stderr]:
        assert PASSWORD not in text and "postgresql://user:" not in text
    env = {e["name"]: e for e in run.worker["env"]}
    assert env["TRACETUNE_STORAGE"]["valueFrom"]["secretKeyRef"] == {"name": "study-db", "key": "url"}
    assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "study-db"
    assert not [e for e in run.worker["env"] if "postgresql" in str(e.get("value", ""))]
    assert "--storage=$(TRACETUNE_STORAGE)" in run.worker["args"]
    assert "kubectl create secret generic study-db --from-literal=url=" in run.stderr  # how to make it
    assert "password is left out" in run.stderr


def test_with_postgres_the_database_reads_the_same_secret_and_takes_every_worker(fleet):
    run = fleet("--workers", "40", "--with-postgres", "--", "--trace", str(TRACE))
    assert run.code == 0, run.stderr
    statefulset = run.kind("StatefulSet")
    postgres = statefulset["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in postgres["env"]}
    assert env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "tracetune-db", "key": "password"}
    connections = int(postgres["args"][postgres["args"].index("-c") + 1].split("=")[1])
    assert connections >= 40 * CONNECTIONS_PER_WORKER
    assert run.kind("Service")["spec"]["clusterIP"] == "None"
    wait = run.kind("Job")["spec"]["template"]["spec"]["initContainers"][0]
    assert statefulset["metadata"]["name"] in wait["args"][0]  # workers start once the database answers


def test_the_trace_goes_in_the_configmap_when_it_fits(fleet):
    run = fleet(*VARIANTS["defaults"])
    assert run.kind("ConfigMap")["data"]["traffic.jsonl"] == TRACE.read_text()
    assert "--trace=/etc/tracetune/inputs/traffic.jsonl" in run.worker["args"]
    assert "ConfigMap" in run.stderr  # which was chosen, and why


def test_a_trace_past_1_mib_needs_a_claim(fleet, tmp_path):
    big = write_trace(tmp_path / "big.jsonl", 300, 4000)
    assert big.stat().st_size > CONFIGMAP_MAX_BYTES
    refused = fleet("--workers", "2", "--", "--trace", str(big), "--storage", STORAGE)
    assert refused.code == 2 and "--trace-pvc" in refused.stderr and "1 MiB" in refused.stderr
    run = fleet("--workers", "2", "--trace-pvc", "traces", "--", "--trace", str(big), "--storage", STORAGE)
    assert run.code == 0, run.stderr
    assert "big.jsonl" not in run.kind("ConfigMap").get("data", {})
    assert "--trace=/data/traces/big.jsonl" in run.worker["args"]
    _validate_k8s(run.docs)


def test_the_configmap_limit_is_kubernetes_count_to_the_byte(tmp_path):
    options = FleetOptions(workers=1, gpus_per_worker=1, name="t", image="i", base_image="b")
    key = "trace.jsonl"
    fits = tmp_path / key
    fits.write_bytes(b"x" * (CONFIGMAP_MAX_BYTES - len(key)))
    assert place_inputs(fits, None, options).trace_pvc is None
    fits.write_bytes(b"x" * (CONFIGMAP_MAX_BYTES - len(key) + 1))
    with pytest.raises(Exception, match="--trace-pvc"):
        place_inputs(fits, None, options)
