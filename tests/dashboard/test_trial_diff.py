"""How the dashboard says what a configuration changes."""

from tracetune.dashboard.trial import diff_text


def test_another_engines_own_defaults_read_as_such():
    assert diff_text({"engine": "llamacpp"}) == "llama.cpp's own defaults (engine=llamacpp)"
    assert diff_text({"engine": "llamacpp", "parallel": 8}) == "engine=llamacpp, parallel=8"
    assert diff_text({}) == "(same as reference)"
