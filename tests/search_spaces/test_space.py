"""Search-space files: validation with file/line/field errors, conditional sampling, grid, and
translation to engine configs per platform."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracetune.engine_adapter.platform import Platform
from tracetune.engine_adapter.vllm.translate import reference_config, to_engine_config
from tracetune.errors import Rejected
from tracetune.search_spaces.space import DEFAULT_SPACE, SearchSpace, SpaceError, load_space

MODEL = Path("/models/m")


def write(tmp_path, text):
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return path


def test_default_space_loads_and_covers_the_knobs():
    space = load_space(DEFAULT_SPACE)
    assert {"weight_bits", "max_num_seqs", "kv_cache_dtype", "speculative", "num_speculative_tokens",
            "enable_prefix_caching", "enable_chunked_prefill", "enforce_eager"} <= set(space.parameters)
    assert space.parameters["weight_bits"].choices == [16, 8, 4]
    assert space.parameters["num_speculative_tokens"].when == {"speculative": ["ngram"]}


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("parameters:\n  max_num_seqs:\n    low: 8\n    high: 4\n", ":2: field 'parameters.max_num_seqs': Value error, `low <= high` must hold, but got (low=8, high=4)"),
        ("parameters:\n  max_batch:\n    choices: [1, 2]\n", ":2: field 'parameters.max_batch': Value error, parameter 'max_batch' is not a tunable knob"),
        ("parameters:\n  max_num_seqs:\n    choices: [1, 2]\n    colour: red\n", ":4: field 'parameters.max_num_seqs.colour': Extra inputs are not permitted"),
        ("parameters:\n  num_speculative_tokens:\n    low: 1\n    high: 4\n    when: {speculative: [ngram]}\n", ":2: field 'parameters.num_speculative_tokens': Value error, num_speculative_tokens.when refers to 'speculative', which must be a parameter defined above it"),
        ("parameters:\n  speculative: {choices: [none]}\n  num_speculative_tokens:\n    low: 1\n    high: 4\n    when: {speculative: [eagle]}\n", ":3: field 'parameters.num_speculative_tokens'"),
        ("parameters: {}\n", "field 'parameters'"),
        ("parameters:\n  max_num_seqs: {low: 0, high: 8, log: true}\n", "log-scaled parameter needs low > 0"),
        ("parameters:\n  max_num_seqs: {choices: [4, 4]}\n", "choices must not repeat"),
        ("parameters:\n  max_num_seqs: {choices: [4, \"many\", 8.5]}\n", ":2: field 'parameters.max_num_seqs': Value error, choices must all be of one kind, but 4 is a number and 'many' a string"),
        ("parameters:\n  enforce_eager: {choices: [true, 1]}\n", "choices must all be of one kind, but True is a boolean and 1 a number"),
        ("parameters: [\n", "not valid YAML"),
        ("parameters:\n  max_num_seqs: {low: 1, high: .inf}\n", ":2: field 'parameters.max_num_seqs.high': Input should be a finite number"),
        ("parameters:\n  max_num_seqs: {low: .nan, high: 4}\n", ":2: field 'parameters.max_num_seqs.low': Input should be a finite number"),
        ("parameters:\n  max_num_seqs: {low: true, high: 4}\n", "field 'parameters.max_num_seqs.low': Value error, must be a number, not a boolean"),
        ("parameters:\n  max_num_seqs: {low: 1, high: 8, step: 0.5}\n", "an integer parameter needs an integer step, got 0.5"),
        ("parameters:\n  max_num_seqs:\n    choices: [[1]]\n", ":3: field 'parameters.max_num_seqs.choices.0': Value error, must be a boolean, number or string, got list"),
        ("parameters:\n  max_num_seqs: {choices: [.nan]}\n", "must be a finite number, got nan"),
        ("parameters:\n  speculative: {choices: [none]}\n  num_speculative_tokens: {low: 1, high: 4, when: {speculative: []}}\n", ":3: field 'parameters.num_speculative_tokens': Value error, when.speculative lists no values"),
        ("parameters:\n  max_num_seqs: {choices: [1]}\n  max_num_seqs: {choices: [2]}\n", ":3: key 'max_num_seqs' appears twice (lines 2 and 3); keep one"),
        ("parameters:\n  max_num_seqs: {choices: [1]}\n\x07\n", ":3: not valid YAML (unacceptable character #x0007"),
        ("fixed:\n  enforce_eager: true\n  max_num_seqs: lots\nparameters:\n  kv_cache_dtype: {choices: [auto]}\n", ":3: field 'fixed.max_num_seqs': Input should be a valid integer"),
        ("fixed:\n  weight_bits: 3\nparameters:\n  kv_cache_dtype: {choices: [auto]}\n", ":2: field 'fixed.weight_bits': must be 16, 8 or 4, got 3"),
        ("- 1\n- 2\n", "must be a mapping"),
    ],
)
def test_bad_space_files_name_line_and_field(tmp_path, text, where):
    with pytest.raises(SpaceError) as info:
        load_space(write(tmp_path, text))
    assert str(info.value).startswith(str(tmp_path / "space.yaml") + ":")
    assert where in str(info.value)
    assert info.value.exit_code == 2


@pytest.mark.parametrize(("choices", "problem"), [
    ([4, 8, 16], None), ([0.5, 1], None), (["auto", "fp8"], None), ([True, False], None),
    ([4, "8"], "but 4 is a number and '8' a string"), (["on", False], "but 'on' is a string and False a boolean"),
    ([1, 1.0], "choices must not repeat"), ([2, 2], "choices must not repeat"),
])
def test_choices_are_of_one_kind_whole_numbers_and_reals_mixing(choices, problem):
    from tracetune.search_spaces.values import choices_problem

    found = choices_problem(choices)
    assert found is None if problem is None else problem in (found or ""), found


def test_removing_every_choice_is_a_clear_error():
    space = SearchSpace.model_validate({"name": "s", "parameters": {"kv_cache_dtype": {"choices": ["fp8"]}}})
    with pytest.raises(SpaceError, match=r"no choice of 'kv_cache_dtype' is left once \['fp8'\] are removed"):
        space.without({"kv_cache_dtype": ["fp8"]})


def test_missing_and_non_utf8_files(tmp_path):
    with pytest.raises(SpaceError, match="no such search-space file"):
        load_space(tmp_path / "nope.yaml")
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"parameters:\n  max_num_seqs: {choices: [\xff]}\n")
    with pytest.raises(SpaceError, match=r"bin.yaml:2: not valid UTF-8"):
        load_space(path)


class FakeTrial:
    """Scripted Optuna trial: returns the first choice / the low end (unit-level)."""

    def __init__(self, picks=None):
        self.picks = picks or {}
        self.asked = []

    def suggest_categorical(self, name, choices):
        self.asked.append(name)
        return self.picks.get(name, choices[0])

    def suggest_int(self, name, low, high, log=False, step=1):
        self.asked.append(name)
        return self.picks.get(name, low)

    def suggest_float(self, name, low, high, log=False, step=None):
        self.asked.append(name)
        return self.picks.get(name, low)


def test_conditional_parameters_are_only_sampled_when_active():
    space = load_space(DEFAULT_SPACE)
    off = FakeTrial({"speculative": "none"})
    assert "num_speculative_tokens" not in space.sample(off) and "num_speculative_tokens" not in off.asked
    on = FakeTrial({"speculative": "ngram", "num_speculative_tokens": 5})
    assert space.sample(on)["num_speculative_tokens"] == 5


def test_grid_respects_conditions():
    space = SearchSpace.model_validate({"parameters": {
        "speculative": {"choices": ["none", "ngram"]},
        "num_speculative_tokens": {"low": 1, "high": 3, "step": 1, "when": {"speculative": ["ngram"]}},
        "enable_prefix_caching": {"choices": [True, False]},
    }})
    grid = space.grid()
    assert len(grid) == (1 + 3) * 2
    assert {"speculative": "none", "enable_prefix_caching": True} in grid


def test_translation_per_platform():
    values = {"weight_bits": 8, "max_num_seqs": 16, "kv_cache_dtype": "fp8", "speculative": "ngram",
              "num_speculative_tokens": 4, "enable_prefix_caching": True}
    gpu = to_engine_config(values, fixed={}, platform=Platform.CUDA, model_dir=MODEL)
    assert gpu.quantization == "fp8" and gpu.model == MODEL and gpu.speculative.num_speculative_tokens == 4
    made = []
    cpu = to_engine_config(values, fixed={"enforce_eager": True}, platform=Platform.CPU, model_dir=MODEL,
                           make_checkpoint=lambda scheme: made.append(scheme) or Path(f"/cache/{scheme}"),
                           flags=frozenset({"avx512f"}))
    assert made == ["W8A8"] and cpu.model == Path("/cache/W8A8") and cpu.quantization is None and cpu.enforce_eager
    own = to_engine_config({"weight_bits": 4}, fixed={}, platform=Platform.CPU, model_dir=MODEL,
                           quantized_checkpoints={4: Path("/mine/w4")}, flags=frozenset())
    assert own.model == Path("/mine/w4")


def test_rejections_before_any_engine_starts():
    avx512 = frozenset({"avx512f"})
    with pytest.raises(Rejected, match="needs a W4A16 checkpoint"):
        to_engine_config({"weight_bits": 4}, fixed={}, platform=Platform.CPU, model_dir=MODEL, flags=avx512)
    with pytest.raises(Rejected, match=r"W4A16\) cannot run on this CPU"):
        to_engine_config({"weight_bits": 4}, fixed={}, platform=Platform.CPU, model_dir=MODEL,
                         flags=frozenset({"avx2"}), make_checkpoint=lambda scheme: Path("/x"))
    w4 = to_engine_config({"weight_bits": 4}, fixed={}, platform=Platform.CPU, model_dir=MODEL, flags=avx512,
                          make_checkpoint=lambda scheme: Path(f"/cache/{scheme}"))
    assert w4.model == Path("/cache/W4A16")
    with pytest.raises(Rejected, match="attention_backend is a GPU setting"):
        to_engine_config({"attention_backend": "FLASH_ATTN"}, fixed={}, platform=Platform.CPU, model_dir=MODEL)
    with pytest.raises(Rejected, match="needs a draft model: list it under draft_models"):
        to_engine_config({"speculative": "draft_model"}, fixed={}, platform=Platform.CUDA, model_dir=MODEL)
    with pytest.raises(Rejected, match="without chunked prefill"):
        to_engine_config({"max_num_batched_tokens": 512, "enable_chunked_prefill": False}, fixed={},
                         platform=Platform.CUDA, model_dir=MODEL)


def test_reference_config_is_unquantized_auto_kv_no_speculation():
    ref = reference_config(fixed={"enforce_eager": True, "kv_cache_dtype": "fp8"}, model_dir=MODEL)
    assert ref.quantization is None and ref.kv_cache_dtype is None and ref.speculative.method == "none"
    assert ref.enforce_eager


def test_fp8_kv_cache_needs_avx512_or_amx_on_cpu():
    with pytest.raises(Rejected, match="FP8 KV cache on CPU requires x86 with AVX-512 or AMX"):
        to_engine_config({"kv_cache_dtype": "fp8"}, fixed={}, platform=Platform.CPU, model_dir=MODEL,
                         flags=frozenset({"avx2"}))
    ok = to_engine_config({"kv_cache_dtype": "fp8"}, fixed={}, platform=Platform.CPU, model_dir=MODEL,
                          flags=frozenset({"avx512f"}))
    assert ok.kv_cache_dtype == "fp8"
    assert to_engine_config({"kv_cache_dtype": "fp8"}, fixed={}, platform=Platform.CUDA, model_dir=MODEL,
                            flags=frozenset()).kv_cache_dtype == "fp8"


def test_choices_a_platform_can_never_run_are_found_and_removed():
    from tracetune.engine_adapter.vllm.translate import unrunnable_choices

    space = load_space(DEFAULT_SPACE)
    bad = unrunnable_choices(space, platform=Platform.CPU, model_dir=MODEL, flags=frozenset({"avx2"}))
    assert set(bad) == {"weight_bits", "kv_cache_dtype"}
    assert set(bad["weight_bits"]) == {4} and set(bad["kv_cache_dtype"]) == {"fp8"}
    assert "AVX-512" in bad["kv_cache_dtype"]["fp8"]
    assert unrunnable_choices(space, platform=Platform.CPU, model_dir=MODEL, flags=frozenset({"avx512f"})) == {}
    smaller = space.without({name: list(choices) for name, choices in bad.items()})
    assert smaller.parameters["weight_bits"].choices == [16, 8]
    assert smaller.parameters["kv_cache_dtype"].choices == ["auto"]
    # Conditions follow the removed choices.
    no_spec = space.without({"speculative": ["ngram"]})
    assert "num_speculative_tokens" not in no_spec.parameters


def test_engine_flags_pin_their_parameters():
    from tracetune.search_spaces.space import DEFAULT_SPACE, load_space

    space = load_space(DEFAULT_SPACE)
    pinned, names = space.pinned({"enforce_eager": True, "speculative": "ngram", "dtype": "float32"})
    assert names == ["speculative", "enforce_eager"]
    assert "enforce_eager" not in pinned.parameters and "speculative" not in pinned.parameters
    # conditioned on the pinned value, which meets the condition: still searched, unconditionally
    assert "num_speculative_tokens" in pinned.parameters and not pinned.parameters["num_speculative_tokens"].when
    off, _ = space.pinned({"speculative": "none"})
    assert "num_speculative_tokens" not in off.parameters
    assert space.pinned({"dtype": "float32"}) == (space, [])


def test_the_default_space_never_proposes_what_it_would_reject():
    """Every combination of the default space (numeric draft lengths at their ends) passes the
    combination rules of `to_engine_config` on a CPU that runs every knob."""
    space = load_space(DEFAULT_SPACE)
    space = space.model_copy(update={"parameters": {**space.parameters, "num_speculative_tokens":
                                                    space.parameters["num_speculative_tokens"].model_copy(
                                                        update={"step": 7})}})
    for point in space.grid():
        to_engine_config(point, fixed=space.fixed, platform=Platform.CPU, model_dir=MODEL,
                         make_checkpoint=lambda scheme: MODEL, flags=frozenset({"avx512f", "avx512_bf16"}))


@pytest.mark.parametrize("platform, flags", [
    ("cpu", {"avx2"}), ("cpu", {"avx2", "avx512f", "avx512_bf16", "amx_tile"}), ("cuda", set())])
def test_the_default_space_proposes_nothing_its_platform_rejects(platform, flags):
    """What the sampler can propose from the default space, once the choices a platform can never run
    are removed up front (as `tune --trace` does), always translates into a config: no trial is ever
    rejected by the space's own rules (400 random proposals per platform)."""
    import optuna

    from tracetune.engine_adapter.platform import Platform
    from tracetune.engine_adapter.vllm.translate import unrunnable_choices

    plat, flags = Platform(platform), frozenset(flags)
    space = load_space(DEFAULT_SPACE)
    never = unrunnable_choices(space, platform=plat, model_dir=Path("m"), flags=flags)
    space = space.without({name: list(choices) for name, choices in never.items()}) if never else space
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(400):
        trial = study.ask()
        values = space.sample(trial)
        study.tell(trial, 0.0)
        to_engine_config(values, fixed=space.fixed, platform=plat, model_dir=Path("m"), flags=flags,
                         make_checkpoint=lambda scheme: Path(f"checkpoint-{scheme}"))  # raises Rejected if not


def test_size_counts_configurations_with_their_conditions():
    """The default space: 3 weight bits x 5 batch limits x (chunked: 4 step sizes, or none) x 2 KV dtypes x
    (no speculation, or ngram with 8 draft lengths) x prefix caching x eager = 5400; a grid's size is its length."""
    assert load_space(DEFAULT_SPACE).size() == 3 * 5 * (4 + 1) * 2 * (1 + 8) * 2 * 2
    grid = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "grid_space.yaml"
    assert load_space(grid).size() == len(load_space(grid).grid()) == 48
    real = SearchSpace.model_validate({"parameters": {"gpu_memory_utilization": {"low": 0.5, "high": 0.9,
                                                                                  "float": True}}})
    assert real.size() == float("inf")


def test_fewer_random_start_up_trials_on_a_small_space():
    import optuna

    from tracetune.tuner.objectives import make_sampler, startup_trials

    assert startup_trials(48) == 3 and startup_trials(5400) == 10 and startup_trials(4) == 2
    assert startup_trials(float("inf")) == 10
    assert make_sampler("tpe", 0, n_startup=3)._n_startup_trials == 3
    assert make_sampler("nsga2", 0, n_startup=3)._population_size == 4
    assert isinstance(make_sampler("gp", 0, n_startup=3), optuna.samplers.GPSampler)


def test_a_space_is_checked_against_the_knobs_of_the_engine_it_is_for(tmp_path):
    """search_spaces names no engine: the EngineKind given hands it the knob table and the
    reference config that checks fixed settings; spaces derived from it keep that table."""
    import pydantic

    from tracetune.engine_adapter.kind import EngineKind, Knob

    class Settings(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        model: Path
        batch: int = pydantic.Field(1, gt=0)

    def reference(*, fixed, model_dir, base=None):
        return Settings(model=model_dir, **{k: v for k, v in fixed.items() if k != "mode"})

    kind = EngineKind("toy", Settings, make=None, translate=lambda values, **_: None, reference=reference,
                      knobs={"batch": Knob("batch size"), "mode": Knob("how", values=("a", "b"))})
    space = load_space(write(tmp_path, "parameters:\n  batch: {choices: [1, 2]}\n  mode: {choices: [a, b]}\n"), kind)
    assert list(space.parameters) == ["batch", "mode"]
    assert list(space.without({"mode": ["b"]}).pinned({"batch": 2})[0].parameters) == ["mode"]
    with pytest.raises(SpaceError, match=r":2: field 'parameters.max_num_seqs': .* known: \['batch', 'mode'\]"):
        load_space(write(tmp_path, "parameters:\n  max_num_seqs: {choices: [1]}\n"), kind)
    with pytest.raises(SpaceError, match=r":2: field 'fixed.mode': must be a or b, got 'c'"):
        load_space(write(tmp_path, "fixed:\n  mode: c\nparameters:\n  batch: {choices: [1]}\n"), kind)
    with pytest.raises(SpaceError, match=r":2: field 'fixed.batch': Input should be greater than 0"):
        load_space(write(tmp_path, "fixed:\n  batch: 0\nparameters:\n  mode: {choices: [a]}\n"), kind)
