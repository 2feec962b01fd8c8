"""The H200 report's figure: attainment vs load per configuration, drawn from search steps."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "capacity_report.py"


def _report_module(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # as `python scripts/gpu/capacity_report.py` runs it
    spec = importlib.util.spec_from_file_location("capacity_report", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _steps(capacity: float) -> list[dict]:
    return [{"rps": rps, "attainment": 1.0 if rps <= capacity else 0.9, "abandoned": rps > capacity}
            for rps in (capacity / 2, capacity, capacity * 1.1, capacity * 2)]


def test_attainment_figure_is_a_png_of_both_panels(tmp_path, monkeypatch):
    report = _report_module(monkeypatch)
    out = tmp_path / "attainment.png"
    report.figure([("defaults", _steps(28.4)), ("fp8", _steps(56.9))], [("defaults", _steps(3.0))], 0.95, path=out)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1320, 682)  # 12 x 6.2 inches at 110 dpi


def test_rps_of_the_trace_rate_from_a_search(monkeypatch):
    report = _report_module(monkeypatch)
    assert report.rps_of([{"rps": 31.0, "scale": 2.0}, {"rps": 15.5, "scale": 1.0}]) == 15.5
