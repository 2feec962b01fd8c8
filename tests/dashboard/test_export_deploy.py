"""Deployable exports (#27 item 6) and the quality cost of a choice (#27 item 1, #25 item 1): what only
the CPU measurement needed is left out for the GPU (and said), models made on the measuring machine
come with the command that places them, k8s/helm carry requests, a sized /dev/shm and GPU placement,
and the chosen configuration's quality cost and gate are said in the project's one vocabulary."""

from __future__ import annotations

import copy
import dataclasses as dc
import json
import shlex
import shutil
import subprocess

import pytest
import yaml

from tests.dashboard.synthetic import add_measured_trial
from tests.dashboard.test_export import _validate_k8s, parse_args, unescape_dollars
from tracetune.dashboard import data
from tracetune.dashboard.export import ExportOptions, export
from tracetune.dashboard.export.notes import choice_notes
from tracetune.dashboard.export.pick import best_rule, parse_pick, select_trial
from tracetune.engine_adapter.models import tracetune_home
from tracetune.errors import InputError


@pytest.fixture(scope="module")
def study(synthetic_url):
    return data.load_study(synthetic_url, "synth")


@pytest.fixture(scope="module")
def gated(synthetic_url, tmp_path_factory):
    """The synthetic study plus trial 7: the most throughput (80 tok/s), every SLO kept, but +8.3%
    perplexity, beyond the study's gate (0.05 nats): the gate alone turned it down."""
    db = tmp_path_factory.mktemp("gated") / "study.db"
    shutil.copy(synthetic_url[len("sqlite:///"):], db)
    number = add_measured_trial(f"sqlite:///{db}", ttft=0.4, tps=80.0, loss=0.08, max_num_seqs=96)
    assert number == 7
    return data.load_study(f"sqlite:///{db}", "synth")


def trial_with(study, number=1, **changes):
    t = copy.deepcopy(study.trial(number))
    t.config.update(changes)
    return t


def header(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if line.startswith("#"))


# -- the quality cost of the choice ---------------------------------------------------------------
def test_the_cost_is_said_in_the_one_vocabulary_with_the_gates_word(study):
    notes = choice_notes(study, study.trial(1))
    # trial 1 measured +0.02 nats/token [0.019, 0.021]: perplexity +2.0% [+1.9%, +2.1%], KLD 0.010, top-1 0.90
    assert notes == ["quality cost vs vLLM's defaults: +2.0% perplexity [+1.9%, +2.1%] (KLD 0.010, top-1 0.90)",
                     "within the study's quality gate (nats<=0.05)"]
    assert header(export(study, study.trial(1), "k8s")).count("# within the study's quality gate (nats<=0.05)") == 1


def test_with_the_gate_off_the_default_gate_judges_in_words(study):
    off = dc.replace(study, quality_gate=None, max_quality_loss=None)  # a study run with --max-quality-loss none
    lossy, lossless = choice_notes(off, off.trial(1))[1], choice_notes(off, off.trial(0))[1]
    assert lossy.startswith("this study set no quality gate") and "OUTSIDE the default gate (ppl<=+1%)" in lossy
    assert "not recommended unless that loss is acceptable" in lossy
    assert lossless.endswith("it is within the default gate (ppl<=+1%)")
    assert "# this study set no quality gate" in export(off, off.trial(1), "compose")


def test_best_names_the_trade_the_gate_turned_down(gated):
    best = select_trial(gated, best=True)
    assert best.number == 1  # trial 7 has more throughput, but broke the gate
    notes = choice_notes(gated, best, parse_pick("max:output_tps"))
    assert notes[-1].startswith("outside the quality gate (nats<=0.05): trial 7 reaches output_tps 80 at "
                                "+8.3% perplexity [+8.2%, +8.4%] (KLD 0.040, top-1 0.90); not exported")
    assert "--trial 7 exports it anyway" in notes[-1]
    # a rule the turned-down trial does not meet names nothing
    assert not any("trial 7" in n for n in choice_notes(gated, best, parse_pick("max:output_tps where ttft_p99<0.35")))
    # exported by number, it says it is outside the gate
    text = header(export(gated, select_trial(gated, trial=7), "command"))
    assert "# OUTSIDE the study's quality gate (nats<=0.05): not recommended unless that loss is acceptable" in text


# -- the GPU target ------------------------------------------------------------------------------
def cpu_study(study, version="0.32.0"):
    return dc.replace(study, platform="cpu", vllm_version=version)


@pytest.mark.parametrize("fmt", ["command", "compose", "k8s", "helm-values", "json"])
def test_cpu_only_settings_are_left_out_for_the_gpu_and_said(study, fmt):
    cpu = cpu_study(study)
    trial = trial_with(cpu, enforce_eager=True, kv_cache_space_gib=4.0,
                       env={"VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_LOGGING_LEVEL": "INFO"})
    text = export(cpu, trial, fmt)
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    if fmt == "json":  # its "config" is the configuration as measured; "serve" is what the GPU runs
        doc = json.loads(text)
        body = json.dumps(doc["serve"])
        assert len(doc["left_out_for_gpu"]) == 3 and doc["config"]["enforce_eager"] is True
    for gone in ("--enforce-eager", "--kv-cache-memory-bytes", "VLLM_CPU_OMP_THREADS_BIND"):
        assert f'"{gone}"' not in body and f" {gone}" not in body and f"{gone}=" not in body, gone
    assert "VLLM_LOGGING_LEVEL" in body and "--max-num-seqs" in body
    if fmt != "json":
        said = header(text)
        assert "# left out for the GPU (measured on the CPU, only the CPU needed them): --enforce-eager (the CPU " \
               "measurement ran eager; on a GPU it would switch CUDA graphs off and slow decoding); " \
               "--kv-cache-memory-bytes of 4 GiB" in said
        assert "VLLM_CPU_OMP_THREADS_BIND (vllm-cpu's setting)" in said
    # a study measured on the GPU keeps them: they were measured there
    gpu_text = export(study, trial_with(study, enforce_eager=True, kv_cache_space_gib=4.0), fmt)
    assert "--enforce-eager" in gpu_text and "left out for the GPU" not in gpu_text


def test_the_vllm_version_is_never_a_question_mark(study):
    for view in (cpu_study(study, None), dc.replace(study, platform="unknown"), study):
        for fmt in ("command", "k8s", "json"):
            text = export(view, view.trial(1), fmt)
            assert "vLLM ?" not in text and "vLLM None" not in text and "a vLLM version the study did not record" in text


# -- placing the model ---------------------------------------------------------------------------
def made_model_trial(study):
    w8a8 = str(tracetune_home() / "quantized" / "SmolLM2-135M-Instruct-W8A8-0123456789ab")
    draft = str(tracetune_home() / "drafts" / "SmolLM2-135M-Instruct-layers-4-ba9876543210")
    return trial_with(study, model=w8a8, speculative={"method": "draft_model", "num_speculative_tokens": 3,
                                                      "draft_model": draft, "prompt_lookup_min": None,
                                                      "prompt_lookup_max": None}), w8a8, draft


@pytest.mark.parametrize("fmt", ["k8s", "helm-values"])
def test_a_model_made_here_comes_with_the_command_that_places_it_in_the_pvc(study, fmt):
    trial, w8a8, draft = made_model_trial(study)
    text = export(study, trial, fmt, ExportOptions(models_pvc="llm-models"))
    lines = header(text).splitlines()
    doc = yaml.safe_load_all(text)
    first = next(doc)
    container = first["spec"]["template"]["spec"]["containers"][0] if fmt == "k8s" else first
    model_arg, flags = parse_args(unescape_dollars(container["args"]))
    for host, kind in ((w8a8, "a quantized checkpoint tracetune made"), (draft, "a draft model tracetune derived")):
        line, = [x for x in lines if x.startswith(f"# model directory {host} ({kind}, on the measuring machine only)")]
        assert "PVC 'llm-models'" in line
        source, target = shlex.split(line.split("kubectl cp ", 1)[1])
        assert source == host  # the command copies the measured directory ...
        container_path = target.split(":", 1)[1]  # ... to where the server reads it
        assert container_path == (model_arg if host == w8a8 else
                                  json.loads(flags["--speculative-config"])["model"])
    assert flags["--served-model-name"] == "SmolLM2-135M-Instruct-W8A8-0123456789ab"
    assert "# clients request the model as 'SmolLM2-135M-Instruct-W8A8-0123456789ab' (--served-model-name" in text


def test_compose_and_vllm_cmd_say_to_copy_a_made_model_to_the_same_path(study):
    trial, w8a8, _ = made_model_trial(study)
    for fmt in ("compose", "command"):
        line, = [x for x in header(export(study, trial, fmt)).splitlines() if x.startswith(f"# model directory {w8a8}")]
        assert shlex.split(line.split("rsync -a ", 1)[1]) == [w8a8 + "/", f"GPU_HOST:{w8a8}/"]
    # a directory the user gave is not called made here, but still placed
    line, = [x for x in header(export(study, study.trial(1), "k8s")).splitlines() if x.startswith("# model directory")]
    assert "measuring machine only" not in line and "kubectl cp" in line


# -- Kubernetes: requests, /dev/shm, GPU placement -----------------------------------------------
@pytest.mark.parametrize("gpus, cpu, memory", [(1, "4", "24Gi"), (2, "8", "40Gi")])
def test_k8s_carries_requests_a_sized_shm_and_gpu_placement(study, gpus, cpu, memory):
    docs = list(yaml.safe_load_all(export(cpu_study(study), trial_with(study, enforce_eager=True), "k8s",
                                          ExportOptions(gpus=gpus))))
    _validate_k8s(docs)
    pod = docs[0]["spec"]["template"]["spec"]
    container, = pod["containers"]
    assert container["resources"] == {"requests": {"cpu": cpu, "memory": memory, "nvidia.com/gpu": gpus},
                                      "limits": {"nvidia.com/gpu": gpus}}
    shm, = [v for v in pod["volumes"] if v["name"] == "dshm"]
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert "--enforce-eager" not in container["args"]


def test_requests_and_shm_follow_the_flags_and_helm_carries_them(study):
    options = ExportOptions(cpu="12", memory="96Gi", shm_gib=16, gpus=0)
    docs = list(yaml.safe_load_all(export(study, study.trial(1), "k8s", options)))
    _validate_k8s(docs)
    pod = docs[0]["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"] == {"requests": {"cpu": "12", "memory": "96Gi"}}
    assert "nodeSelector" not in pod and "tolerations" not in pod  # no GPU: no GPU placement
    values = yaml.safe_load(export(study, study.trial(1), "helm-values", ExportOptions(shm_gib=4)))
    assert values["resources"]["requests"] == {"cpu": "4", "memory": "20Gi", "nvidia.com/gpu": 1}
    assert values["tolerations"] and values["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "4Gi"}} in values["volumes"]
    for bad, message in ((dict(cpu="lots"), "--cpu 'lots' is not a Kubernetes quantity"),
                         (dict(memory="16 GB"), "--memory"), (dict(shm_gib=0), "--shm-gib must be >= 1")):
        with pytest.raises(InputError, match=message):
            ExportOptions(**bad)


# -- docker compose validates the compose file ---------------------------------------------------
def compose_command() -> list[str] | None:
    """A real Docker Compose: the `docker compose` plugin, else Debian's docker-compose
    (scripts/install_test_system.sh installs it); `config` needs no Docker daemon."""
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return [shutil.which("docker-compose")] if shutil.which("docker-compose") else None


@pytest.mark.parametrize("platform", ["cpu", "cuda"])
def test_compose_files_pass_docker_compose_config(study, tmp_path, platform):
    command = compose_command()
    if command is None:
        pytest.skip("no docker compose here (Debian: apt-get install docker-compose; scripts/install_test_system.sh)")
    view = cpu_study(study) if platform == "cpu" else study
    trial, _, _ = made_model_trial(view)
    good = tmp_path / "compose.yaml"
    good.write_text(export(view, trial, "compose", ExportOptions(gpus=2)))
    out = subprocess.run([*command, "-f", str(good), "config"], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    (name, service), = yaml.safe_load(out.stdout)["services"].items()
    assert name.startswith("tracetune-synth-") and service["image"].startswith("vllm/vllm-openai:v")
    assert ("--enforce-eager" in service["command"]) is False
    # the validator is real: a misspelt key fails it
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("restart:", "restrat:"))
    assert subprocess.run([*command, "-f", str(bad), "config"], capture_output=True, cwd=tmp_path).returncode != 0


# -- real studies: one measured on the CPU (vllm-cpu), one on an H200 ----------------------------
@pytest.fixture(scope="module")
def real_dbs(tmp_path_factory) -> dict[str, str]:
    """docs/results/h200's knob_quality_cpu (vllm-cpu 0.32.0, eager, the prepared model) and
    study_cap (H200, vLLM 0.24.0, random weights of the 8B shape), as SQLite URLs."""
    import lzma
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "docs" / "results" / "h200"
    out = {}
    for name in ("knob_quality_cpu", "study_cap"):
        db = tmp_path_factory.mktemp(name) / "study.db"
        db.write_bytes(lzma.decompress((root / f"{name}.db.xz").read_bytes()))
        out[name] = f"sqlite:///{db}"
    return out


@pytest.mark.parametrize("name", ["knob_quality_cpu", "study_cap"])
def test_the_best_of_a_real_cpu_and_gpu_study_deploys(real_dbs, tmp_path, name):
    view = data.load_study(real_dbs[name])
    best = select_trial(view, best=True)
    options = ExportOptions(allow_dummy_weights=True, chosen_by=best_rule(view))
    k8s = export(view, best, "k8s", options)
    docs = list(yaml.safe_load_all(k8s))
    _validate_k8s(docs)
    args = docs[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    said = header(k8s)
    assert "vLLM ?" not in said and "# clients request the model as " in said and "kubectl cp " in said
    if view.platform == "cpu":
        assert best.config["enforce_eager"] and "--enforce-eager" not in args  # measured eager, deployed with graphs
        assert "# left out for the GPU (measured on the CPU, only the CPU needed them): --enforce-eager" in said
        assert "(the model as tracetune prepared it, on the measuring machine only)" in said
    else:
        assert "# measured on NVIDIA GPU with vLLM 0.24.0; flags for vLLM 0.24.0" in said
        assert "quality cost vs vLLM's defaults: not measurable (random weights" in said  # never a number
    command = compose_command()
    if command is None:
        pytest.skip("no docker compose here (Debian: apt-get install docker-compose; scripts/install_test_system.sh)")
    compose = tmp_path / "compose.yaml"
    compose.write_text(export(view, best, "compose", options))
    out = subprocess.run([*command, "-f", str(compose), "config"], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr


@pytest.mark.integration
def test_every_trial_of_the_real_mini_study_deploys_to_the_gpu(real_study, tmp_path):
    """The session's mini study (vllm-cpu; a W8A8 checkpoint tracetune made, an explicit CPU KV cache):
    each measured trial exports to manifests that pass the API server's schema and docker compose
    config, without the CPU's KV-cache size, and says where the made checkpoint must go."""
    url, name = real_study
    view = data.load_study(url, name)
    assert view.platform == "cpu"
    measured = [t for t in view.candidates if t.measured and t.config]
    assert measured
    made = 0
    for trial in measured:
        k8s = export(view, trial, "k8s")
        docs = list(yaml.safe_load_all(k8s))
        _validate_k8s(docs)
        args = docs[0]["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--kv-cache-memory-bytes" not in args and "--enforce-eager" not in args
        if trial.config.get("kv_cache_space_gib") is not None:
            assert "# left out for the GPU (measured on the CPU, only the CPU needed them):" in k8s
        made += "(a quantized checkpoint tracetune made, on the measuring machine only)" in k8s
        command = compose_command()
        if command is not None:
            compose = tmp_path / f"compose-{trial.label}.yaml"
            compose.write_text(export(view, trial, "compose"))
            out = subprocess.run([*command, "-f", str(compose), "config", "-q"], capture_output=True, text=True)
            assert out.returncode == 0, out.stderr
    assert made == sum("quantized" in str(t.config["model"]) for t in measured)
