"""Exports of llama.cpp trials (#34 item 6), validated as vLLM's are (tests/dashboard/test_export.py,
test_export_deploy.py): the shell command run by a real bash against a fake `llama-server` and parsed
back, compose through `docker compose config`, the k8s manifests and a Deployment rendered from the
Helm values against the Kubernetes API schema (strict). The study databases are written the way the
tuner writes them: a llama.cpp study, and a study choosing between vLLM and llama.cpp trial by trial,
whose trials export on the engine each ran on. GGUF files tracetune made are placed and their
making said as the commands tracetune itself runs."""

from __future__ import annotations

import json
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.dashboard.synthetic import PROBE, quality, summary
from tests.dashboard.synthetic import config as vllm_config
from tests.dashboard.test_export import _validate_k8s, unescape_dollars
from tests.dashboard.test_export_deploy import compose_command
from tracetune.dashboard import data
from tracetune.dashboard.export import FORMATS, ExportOptions, export

IMAGE = "ghcr.io/ggml-org/llama.cpp:server-b11312"
SECRET = "sk-live-0123456789abcdefSECRET"
NASTY_GGUF = "/m/a b/c\"d'e;f$(touch x)`g`\\h $HOME.gguf"


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    """A model directory, tracetune's home, and a llama.cpp build (its programs are never run: exports
    only name the GGUF files the build made), in place for the module."""
    from tracetune.engine_adapter.llamacpp.binaries import llamacpp_dir

    root = tmp_path_factory.mktemp("export-engines")
    model = root / "SmolLM2-135M-Instruct"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "tokenizer.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    build = root / "build"
    (build / "bin").mkdir(parents=True)
    for name in ("SOURCE", "bin/llama-server", "bin/llama-quantize"):
        (build / name).write_text("")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACETUNE_HOME", str(root / "home"))
        mp.setenv("TRACETUNE_LLAMACPP_DIR", str(build))
        llamacpp_dir.cache_clear()
        yield model
    llamacpp_dir.cache_clear()


def llama_config(model: Path, **changes) -> dict:
    """A llama.cpp trial's config as the tuner stores it (LlamaCppConfig, dumped to JSON)."""
    from tracetune.engine_adapter.llamacpp.server import LlamaCppConfig

    return LlamaCppConfig.model_validate({"model": model, **changes}).model_dump(mode="json")


def write_study(path: Path, engine: str, reference: dict, trials: dict[int, dict]) -> str:
    """A study database holding `trials` (number -> config), measured on the CPU, as the tuner writes it."""
    import optuna
    from optuna.distributions import IntDistribution
    from optuna.trial import TrialState, create_trial

    from tracetune.tuner.storage import ResultStore

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    url = f"sqlite:///{path}"
    study = optuna.create_study(study_name="choice", storage=url, directions=["minimize", "maximize", "minimize"])
    for key, value in (("objectives", ["ttft_p99", "output_tps", "quality_loss"]), ("slos", ["ttft:p99<2s"]),
                       ("max_quality_loss", 0.05), ("platform", "cpu"), ("rules", {"engine": engine}),
                       ("vllm_version", "0.32.0")):
        study.set_user_attr(key, value)
    store = ResultStore(url)
    store.save_reference("choice", config=reference, probe=PROBE, summary=summary(0.5, 50.0))
    store.save_trial("choice", -1, "measured", config=reference, summary=summary(0.5, 50.0), quality=quality(0.0))
    for number, cfg in trials.items():
        params = {"x": number}
        study.add_trial(create_trial(
            state=TrialState.COMPLETE, values=[0.2, 150.0 - number, 0.008], params=params,
            distributions={"x": IntDistribution(0, 9)},
            user_attrs={"values": params, "status": "measured", "constraints": [-1.0, -0.04], "feasible": True,
                        "config": cfg}))
        store.save_trial("choice", number, "measured", values=params, config=cfg, summary=summary(0.2, 150.0 - number),
                         quality=quality(0.008))
    return url


def q8_trial(model: Path) -> dict:
    """The issue's winner: Q8_0 weights, 8 slots, a q8_0 KV cache, a derived 4-bit draft, and a key."""
    return llama_config(model, weights="Q8_0", parallel=8, threads=2, threads_batch=2, ctx_size=8192,
                        batch_size=512, ubatch_size=256, cache_type_k="q8_0", cache_type_v="q8_0", flash_attn="on",
                        draft_model="derived:Q4_K_M", draft_max=8, draft_min=1, cache_reuse=256,
                        extra_args=["--api-key", SECRET, "--seed", "1"],
                        env={"LLAMA_API_KEY": SECRET, "LLAMA_LOG_COLORS": "off"})


@pytest.fixture(scope="module")
def llama_study(machine, tmp_path_factory):
    """A llama.cpp study: its reference is llama.cpp's defaults; trial 0 Q8_0 with a draft; trial 1 a GGUF
    file the user gave, at a path made to break quoting."""
    url = write_study(tmp_path_factory.mktemp("llama") / "study.db", "llamacpp", llama_config(machine),
                      {0: q8_trial(machine), 1: llama_config(machine, gguf=NASTY_GGUF, parallel=4)})
    return data.load_study(url, "choice")


@pytest.fixture(scope="module")
def choice_study(machine, tmp_path_factory):
    """A study choosing between vLLM (its reference) and llama.cpp: trial 0 ran on llama.cpp, trial 1 on
    vLLM (measured on the CPU)."""
    vllm = vllm_config(model=str(machine), max_num_seqs=16, enforce_eager=True, kv_cache_space_gib=2.0)
    url = write_study(tmp_path_factory.mktemp("choice") / "study.db", "vllm+llamacpp", vllm_config(model=str(machine)),
                      {0: q8_trial(machine), 1: vllm})
    return data.load_study(url, "choice")


def made(model: Path, weights: str) -> str:
    from tracetune.engine_adapter.llamacpp.gguf import gguf_path

    return str(gguf_path(model, weights))


def flags_of(args: list[str]) -> dict[str, str | bool]:
    """llama-server arguments -> {flag: value or True} (every llama-server flag here is a flag)."""
    flags: dict[str, str | bool] = {}
    i = 0
    while i < len(args):
        assert args[i].startswith("--"), args[i:]
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            flags[args[i]], i = args[i + 1], i + 2
        else:
            flags[args[i]], i = True, i + 1
    return flags


def assert_flags_match(flags: dict, config: dict, model: str, draft: str | None) -> None:
    """The flags llama-server gets, read independently of build_command: each setting, the GGUF files,
    what tracetune's measurements alone pass left out, no credential."""
    assert flags["--model"] == model
    assert flags["--alias"] == Path(config["model"]).name  # the name clients requested when it was measured
    for field in ("parallel", "ctx_size", "batch_size", "ubatch_size", "cache_type_k", "cache_type_v", "flash_attn",
                  "cache_reuse", "threads", "threads_batch"):
        flag = "--" + field.replace("_", "-")
        assert flags.get(flag) == (None if config[field] is None else str(config[field])), flag
    if draft is None:
        assert "--model-draft" not in flags and "--spec-type" not in flags
    else:
        assert flags["--model-draft"] == draft and flags["--spec-type"] == "draft-simple"
        assert flags["--spec-draft-n-max"] == str(config["draft_max"])
    assert flags["--metrics"] is True and flags["--cache-ram"] == "0"  # kept: counters, and measured without it
    for gone in ("--slots", "--slot-save-path", "--log-verbosity", "--api-key"):
        assert gone not in flags, gone


def run_llama_cmd(text: str, tmp_path: Path) -> dict:
    """Run the exported shell command with a fake `llama-server` on PATH that records its argv and env."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    out = tmp_path / "called.json"
    fake = bindir / "llama-server"
    fake.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                    f"json.dump({{'argv': sys.argv[1:], 'env': dict(os.environ)}}, open({str(out)!r}, 'w'))\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    script = tmp_path / "serve.sh"
    script.write_text(text)
    subprocess.run(["bash", str(script)], check=True, env={"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(tmp_path)},
                   cwd=tmp_path, timeout=30)
    return json.loads(out.read_text())


def header(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#")]


# -- the shell command -----------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["llama", "choice"])
def test_the_command_runs_llama_server_with_the_trials_settings(request, machine, tmp_path, which):
    study = request.getfixturevalue(f"{which}_study")
    trial = study.trial(0)
    text = export(study, trial, "command")
    called = run_llama_cmd(text, tmp_path)
    flags = flags_of(called["argv"])
    assert_flags_match(flags, trial.config, made(machine, "Q8_0"), made(machine, "Q4_K_M"))
    assert flags["--host"] == "127.0.0.1" and flags["--port"] == "8000" and flags["--seed"] == "1"
    assert called["env"]["LLAMA_LOG_COLORS"] == "off" and "LLAMA_API_KEY" not in called["env"]
    assert SECRET not in text and "left out (credential-like, supply them from a secret store): --api-key, " \
                                  "LLAMA_API_KEY" in text


def test_a_gguf_the_user_gave_round_trips_byte_for_byte(llama_study, tmp_path):
    text = export(llama_study, llama_study.trial(1), "command")
    flags = flags_of(run_llama_cmd(text, tmp_path)["argv"])
    assert_flags_match(flags, llama_study.trial(1).config, NASTY_GGUF, None)
    assert not list(tmp_path.glob("x")), "a command substitution in the path ran"
    placed = [line for line in header(text) if line.startswith("# model file")]
    assert placed == [f"# model file {NASTY_GGUF}: on the serving host at the same path: rsync -a "
                      f"{shlex.quote(NASTY_GGUF)} HOST:{shlex.quote(NASTY_GGUF)}"]  # the user's file: nothing to remake
    assert not any("to make it again" in line for line in header(text))


# -- compose, k8s, helm ---------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["llama", "choice"])
def test_compose_runs_the_official_server_image_and_passes_docker_compose_config(request, machine, tmp_path, which):
    study = request.getfixturevalue(f"{which}_study")
    trial = study.trial(0)
    text = export(study, trial, "compose")
    (name, service), = yaml.safe_load(text)["services"].items()
    assert service["image"] == IMAGE and service["entrypoint"] == ["/app/llama-server"]
    flags = flags_of(unescape_dollars(service["command"]))
    gguf, draft = made(machine, "Q8_0"), made(machine, "Q4_K_M")
    inside = {h: "/models/" + Path(h).name for h in (gguf, draft)}
    assert_flags_match(flags, trial.config, inside[gguf], inside[draft])
    assert flags["--host"] == "0.0.0.0"
    assert service["volumes"] == [{"type": "bind", "source": h, "target": t, "read_only": True}
                                  for h, t in inside.items()]  # each GGUF file, not a directory
    assert service["healthcheck"]["test"] == ["CMD", "curl", "-f", "http://localhost:8000/health"]
    assert "ipc" not in service and "deploy" not in service  # no /dev/shm sharing, no GPU on the CPU image
    command = compose_command()
    if command is None:
        pytest.skip("no docker compose here (Debian: apt-get install docker-compose; scripts/install_test_system.sh)")
    path = tmp_path / "compose.yaml"
    path.write_text(text)
    out = subprocess.run([*command, "-f", str(path), "config"], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    (checked, served), = yaml.safe_load(out.stdout)["services"].items()
    assert checked == name and served["image"] == IMAGE


@pytest.mark.parametrize("which", ["llama", "choice"])
def test_k8s_manifests_validate_with_the_gguf_files_in_the_claim(request, machine, which):
    study = request.getfixturevalue(f"{which}_study")
    trial = study.trial(0)
    text = export(study, trial, "k8s", ExportOptions(namespace="serving", models_pvc="gguf-models"))
    docs = list(yaml.safe_load_all(text))
    assert [d["kind"] for d in docs] == ["Deployment", "Service"]
    _validate_k8s(docs)
    pod = docs[0]["spec"]["template"]["spec"]
    container, = pod["containers"]
    assert (container["name"], container["image"], container["command"]) == ("llama-server", IMAGE,
                                                                               ["/app/llama-server"])
    gguf, draft = made(machine, "Q8_0"), made(machine, "Q4_K_M")
    assert_flags_match(flags_of(unescape_dollars(container["args"])), trial.config,
                       "/models/" + Path(gguf).name, "/models/" + Path(draft).name)
    assert container["resources"] == {"requests": {"cpu": "4", "memory": "16Gi"}}  # no GPU, no /dev/shm
    assert container["volumeMounts"] == [{"name": "models", "mountPath": "/models", "readOnly": True}]
    assert pod["volumes"] == [{"name": "models", "persistentVolumeClaim": {"claimName": "gguf-models",
                                                                            "readOnly": True}}]
    assert "nodeSelector" not in pod and "tolerations" not in pod
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health"
    said = header(text)
    for host in (gguf, draft):
        line, = [x for x in said if x.startswith(f"# model file {host} (GGUF weights tracetune made, on the "
                                                   f"measuring machine only)")]
        source, target = shlex.split(line.split("kubectl cp ", 1)[1])
        assert source == host and target == "POD:/models/" + Path(host).name
    assert "# requests: 4 CPU, 16Gi memory (--cpu, --memory)" in said
    assert f"# image: {IMAGE}; port 8000; GPUs: 0" in said
    assert "# clients request the model as 'SmolLM2-135M-Instruct' (--alias, the name measured)" in said


def test_helm_values_render_to_a_valid_deployment(llama_study, machine):
    values = yaml.safe_load(export(llama_study, llama_study.trial(0), "helm-values"))
    assert values["image"] == {"repository": "ghcr.io/ggml-org/llama.cpp", "tag": "server-b11312",
                               "pullPolicy": "IfNotPresent"}
    assert values["command"] == ["/app/llama-server"] and "nodeSelector" not in values
    assert_flags_match(flags_of(unescape_dollars(values["args"])), llama_study.trial(0).config,
                       "/models/" + Path(made(machine, "Q8_0")).name, "/models/" + Path(made(machine, "Q4_K_M")).name)
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": values["nameOverride"]},
                  "spec": {"replicas": values["replicaCount"], "selector": {"matchLabels": {"app": "x"}},
                           "template": {"metadata": {"labels": {"app": "x"}, "annotations": values["podAnnotations"]},
                                        "spec": {"containers": [{
                                            "name": "llama-server",
                                            "image": f"{values['image']['repository']}:{values['image']['tag']}",
                                            "command": values["command"], "args": values["args"], "env": values["env"],
                                            "ports": [{"containerPort": values["containerPort"]}],
                                            "resources": values["resources"], "startupProbe": values["startupProbe"],
                                            "readinessProbe": values["readinessProbe"],
                                            "livenessProbe": values["livenessProbe"],
                                            "volumeMounts": values["volumeMounts"]}],
                                            "volumes": values["volumes"]}}}}
    _validate_k8s([deployment])


def test_json_names_the_engine_its_image_and_argv(choice_study, machine):
    trial = choice_study.trial(0)
    doc = json.loads(export(choice_study, trial, "json"))
    # the configuration as measured, without its credentials
    assert doc["config"] == {**trial.config, "extra_args": ["--seed", "1"], "env": {"LLAMA_LOG_COLORS": "off"}}
    assert (doc["engine"], doc["image"], doc["target_release"]) == ("llamacpp", IMAGE, "server-b11312")
    assert "measured_vllm" not in doc and doc["serve"]["argv"][0] == "llama-server"
    assert_flags_match(flags_of(doc["serve"]["argv"][1:]), trial.config, made(machine, "Q8_0"),
                       made(machine, "Q4_K_M"))
    assert SECRET not in json.dumps(doc)


# -- a choice of engines: each trial on the engine it ran on ----------------------------------------
def test_a_vllm_trial_of_a_choice_study_exports_as_vllm_does(choice_study):
    trial = choice_study.trial(1)
    k8s = export(choice_study, trial, "k8s")
    docs = list(yaml.safe_load_all(k8s))
    _validate_k8s(docs)
    container, = docs[0]["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["vllm", "serve"] and container["image"].startswith("vllm/vllm-openai:v")
    assert "--enforce-eager" not in container["args"] and "--max-num-seqs" in container["args"]
    assert "# left out for the GPU (measured on the CPU, only the CPU needed them): --enforce-eager" in k8s
    assert "# quality cost vs vLLM's defaults: " in k8s  # vLLM is the choice's reference
    assert "llama" not in "\n".join(line for line in k8s.splitlines() if not line.startswith("#"))


def test_the_reference_is_the_first_engines_defaults(llama_study, choice_study):
    text = export(llama_study, llama_study.reference_run, "command")
    assert "# tracetune export (command): study 'choice', the reference (llama.cpp's defaults)" in text
    assert "vLLM" not in text  # a llama.cpp study never names vLLM
    assert "# quality cost vs llama.cpp's defaults: " in export(llama_study, llama_study.trial(0), "k8s")
    assert "# quality cost vs vLLM's defaults: " in export(choice_study, choice_study.trial(0), "k8s")


def test_the_dashboard_names_the_reference_by_the_studys_engine(llama_study, choice_study, synthetic_url):
    """The pages' labels of the reference (trial picker and headings, the front table, the verdict) say the
    study's engine's defaults; a choice's are its first engine's; a study stored without its engine (the
    synthetic one, as studies were before the engine was recorded) is vLLM's, as it was then."""
    from tracetune.dashboard import tables

    ref = llama_study.reference_run
    assert llama_study.title(ref) == "reference (llama.cpp's defaults)"
    assert tables.why(llama_study, ref) == "llama.cpp's defaults: the reference every trial is measured against"
    assert tables.front_table(llama_study)[0]["differs from reference"] == "(llama.cpp's defaults)"
    assert llama_study.decision.verdict() == "trial 0 is best by output_tps on the front (llama.cpp's defaults included)."
    assert choice_study.title(choice_study.reference_run) == "reference (vLLM's defaults)"
    synthetic = data.load_study(synthetic_url, "synth")
    assert synthetic.engine is None and synthetic.title(synthetic.reference_run) == "reference (vLLM's defaults)"

def test_the_header_says_the_cpu_measurement_holds_on_the_cpu_image(llama_study):
    said = header(export(llama_study, llama_study.trial(0), "compose"))
    assert said[1] == ("# measured on platform cpu with llama.cpp; the same settings for llama.cpp server-b11312 (the "
                       "release tracetune builds; --engine-version names another) on the CPU, as measured: its numbers "
                       "hold on a machine like the measuring one (the image's build picks its CPU kernels at run time; "
                       "tracetune measured a build for the measuring CPU)")
    assert not any("left out for the GPU" in line for line in said)
    tagged = export(llama_study, llama_study.trial(0), "compose", ExportOptions(engine_version="server-b9999"))
    assert "image: ghcr.io/ggml-org/llama.cpp:server-b9999" in tagged


# -- the GGUF files: where they came from and how to make them again ---------------------------------
def test_the_export_says_how_to_make_each_gguf_again_as_tracetune_made_it(llama_study, machine, monkeypatch):
    """The commands in the comment are the ones tracetune ran to make the files (captured from
    `gguf_checkpoint`, the converter and llama-quantize), with file names for paths."""
    from tracetune.engine_adapter.llamacpp import gguf

    ran: list[list[str]] = []

    def run(argv, log, env=None):
        ran.append([Path(a).name if "/" in a else a for a in argv])
        Path(argv[-1] if argv[0] != str(gguf.tool("llama-quantize")) else argv[2]).write_bytes(b"GGUF")

    monkeypatch.setattr(gguf, "_run", run)
    gguf.gguf_checkpoint(machine, "Q8_0")
    said = header(export(llama_study, llama_study.trial(0), "k8s"))
    remake = [line for line in said if "to make it again" in line]
    assert len(remake) == 2  # the weights, and the derived draft
    q8, = [line for line in remake if line.startswith(f"# GGUF file {Path(made(machine, 'Q8_0')).name}: Q8_0 weights "
                                                       f"tracetune made from {machine} with llama.cpp's converter and "
                                                       f"llama-quantize")]
    steps = [shlex.split(step) for step in q8.split("build of llama-quantize): ", 1)[1].split(" && ")]
    convert, quantize = ran  # F16 from the model, then Q8_0 from F16, as gguf_checkpoint ran them
    assert steps[0][1:4] == [convert[1], str(machine), "--outtype"] and steps[0][4:6] == ["f16", "--outfile"]
    assert Path(steps[0][6]).name == Path(made(machine, "F16")).name
    assert steps[1][0] == quantize[0] == "llama-quantize" and steps[1][3] == quantize[3] == "Q8_0"
    assert steps[1][1] == Path(made(machine, "F16")).name and steps[1][2] == Path(made(machine, "Q8_0")).name
    assert "tag b11312" in q8


@pytest.mark.parametrize("fmt", FORMATS)
def test_no_credential_and_no_measurement_flag_in_any_format(llama_study, fmt):
    text = export(llama_study, llama_study.trial(0), fmt)
    assert SECRET not in text and "sk-live" not in text
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    for gone in ("--slots", "--log-verbosity", "--slot-save-path"):
        assert gone not in body, gone
    assert "/dev/shm" not in text and "nvidia" not in body


def test_pick_names_the_llama_cpp_defaults_it_weighed(llama_study):
    from tracetune.dashboard.export.pick import parse_pick, pick_trial
    from tracetune.errors import InputError

    with pytest.raises(InputError, match=r"no trial on the front meets it, nor do llama.cpp's defaults "
                                         r"\(llama.cpp's defaults: output_tps=50, ttft_p99=0.5; trial 0: "):
        pick_trial(llama_study, parse_pick("max:output_tps where ttft_p99<0.1"))
