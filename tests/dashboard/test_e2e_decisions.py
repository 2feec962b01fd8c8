"""Decisions in a real browser (headless Debian Chromium, one `tune dashboard` for the module) on the
decision studies of tests/dashboard/synthetic.py: the banner of a study without a quality gate, the
front point outside the default gate, a tie inside the intervals, a stale trial shown interrupted."""

from __future__ import annotations

import re

import pytest

from tests.dashboard.browser import HAVE_CHROMIUM, dashboard_page, wait_idle
from tests.dashboard.synthetic import make_decision_studies

pytestmark = [pytest.mark.integration, pytest.mark.skipif(not HAVE_CHROMIUM, reason="Debian chromium is not installed")]


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    url = make_decision_studies(tmp_path_factory.mktemp("decisions") / "study.db")
    with dashboard_page(url, "nogate") as opened:
        yield opened


def _cells(page) -> list[str]:
    page.locator('[data-testid="stDataFrame"] [role="gridcell"]').first.wait_for(state="attached", timeout=30_000)
    return page.locator('[data-testid="stDataFrame"] [role="gridcell"]').all_inner_texts()


def test_the_pareto_page_says_no_gate_marks_the_costly_point_and_the_tie(page, artifacts):
    wait_idle(page)
    page.get_by_text(re.compile(r"^No quality gate: this study was run with")).first.wait_for(timeout=30_000)
    assert page.get_by_text(re.compile(r"front trial\(s\) 1 are outside it")).count()
    legend = page.eval_on_selector_all(".js-plotly-plot .legendtext", "els => els.map(e => e.textContent)")
    assert "on the front, outside the default gate ppl<=+1% (no gate set) (1)" in legend, legend
    assert "tied with the front, inside the intervals (1)" in legend and "Pareto front (1)" in legend
    symbols = page.eval_on_selector_all(".js-plotly-plot .scatterlayer .trace .points path",
                                        "els => els.map(e => e.getAttribute('d').length)")
    assert len(symbols) >= 4  # three trials and the reference drawn
    cells = _cells(page)
    assert "tie: dominated by 0 only inside the 95% intervals" in cells, cells
    assert any(c.startswith("on the front, outside the default quality gate ppl<=+1%") for c in cells)
    assert "apart from 1; inside the intervals of 2" in cells
    page.screenshot(path=str(artifacts / "decisions-pareto.png"), full_page=True)


def test_a_stale_trial_reads_interrupted_and_live_refresh_stays_off(page, artifacts):
    live = page.get_by_role("switch", name="Live refresh")
    assert not live.is_checked()
    page.locator('[data-testid="stSidebar"]').get_by_text("Trial detail", exact=True).click()
    page.get_by_role("heading", name=re.compile(r"^Trial detail · study")).wait_for(timeout=60_000)
    wait_idle(page)
    page.get_by_role("combobox", name="Trial", exact=True).click()
    page.get_by_role("option", name=re.compile(r"^trial 4 ")).click()
    page.get_by_text(re.compile(r"stopped sending heartbeats 3\.0 days ago")).first.wait_for(timeout=30_000)
    assert not page.get_by_text("a worker is measuring it now").count()
    page.screenshot(path=str(artifacts / "decisions-stale.png"), full_page=True)
