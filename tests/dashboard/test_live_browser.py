"""Live refresh in a real browser: while a study runs, a trial the tuner adds appears on the open
Pareto chart without a reload (synthetic study database, Debian chromium)."""

from __future__ import annotations

import shutil

import pytest

from tests.dashboard.browser import HAVE_CHROMIUM, dashboard_page
from tests.dashboard.synthetic import add_measured_trial


@pytest.mark.skipif(not HAVE_CHROMIUM, reason="Debian chromium is not installed")
def test_pareto_chart_refreshes_while_the_study_runs(synthetic_url, tmp_path, artifacts):
    db = tmp_path / "study.db"
    shutil.copy(synthetic_url[len("sqlite:///"):], db)
    url = f"sqlite:///{db}"

    def labels(page) -> set[str]:
        return set(page.eval_on_selector_all(".js-plotly-plot .textpoint", "els => els.map(e => e.textContent)"))

    with dashboard_page(url, "synth") as page:
        page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .textpoint').length >= 5",
                               timeout=30_000)
        assert {"0", "1", "2", "3", "ref"} <= labels(page)
        number = add_measured_trial(url, ttft=0.2, tps=50.0, loss=0.0, max_num_seqs=48)  # dominates 0 and 1
        page.wait_for_function(
            f"() => Array.from(document.querySelectorAll('.js-plotly-plot .textpoint'))"
            f".some(e => e.textContent === '{number}')", timeout=60_000)
        page.get_by_text("Pareto front (1)").first.wait_for(timeout=30_000)
        page.screenshot(path=str(artifacts / "live-refresh.png"))
