"""The decisions that read intervals, in a real browser (headless Debian Chromium, one `tune dashboard`
for the module) on the stored studies of tests/dashboard/interval_studies.py: a gate undecided by its
interval, vLLM's defaults breaking the SLO, a study on random weights."""

from __future__ import annotations

import re

import pytest

from tests.dashboard.browser import HAVE_CHROMIUM, dashboard_page, wait_idle
from tests.dashboard.interval_studies import make_interval_studies

pytestmark = [pytest.mark.integration, pytest.mark.skipif(not HAVE_CHROMIUM, reason="Debian chromium is not installed")]


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    url = make_interval_studies(tmp_path_factory.mktemp("intervals") / "study.db")
    with dashboard_page(url, "undecided") as opened:
        yield opened


def _open(page, study: str, view: str) -> None:
    sidebar = page.locator('[data-testid="stSidebar"]')
    box = sidebar.get_by_role("combobox", name="Study")
    if box.input_value() != study:
        box.click()
        page.get_by_role("option", name=study, exact=True).click()
    sidebar.get_by_text(view, exact=True).click()
    page.get_by_role("heading", name=re.compile(rf"^{view} · study {study}$")).wait_for(timeout=60_000)
    wait_idle(page)


def _trial(page, name: str) -> None:
    page.get_by_role("combobox", name="Trial", exact=True).click()
    page.get_by_role("option", name=re.compile(rf"^{re.escape(name)} ")).click()
    wait_idle(page)


def _cells(page) -> list[str]:
    page.locator('[data-testid="stDataFrame"] [role="gridcell"]').first.wait_for(state="attached", timeout=30_000)
    return page.locator('[data-testid="stDataFrame"] [role="gridcell"]').all_inner_texts()


def _text(page) -> str:
    return page.locator('[data-testid="stMain"]').inner_text() + page.locator('[data-testid="stSidebar"]').inner_text()


def test_a_gate_undecided_by_its_interval_reads_undecided(page, artifacts):
    _open(page, "undecided", "Pareto")
    page.get_by_text(re.compile(r"front trial\(s\) 0 are undecided")).first.wait_for(timeout=30_000)
    cells = _cells(page)
    assert any(c.startswith("on the front, undecided against the default quality gate ppl<=+1%") for c in cells), cells
    _open(page, "undecided", "Trial detail")
    _trial(page, "trial 0")
    page.get_by_text(re.compile(r"^undecided against the default quality gate ppl<=\+1% \(this study set none\): "
                                r"its 95% interval \[-13\.37%, \+4\.86%\]")).first.wait_for(timeout=30_000)
    assert "within the default quality gate" not in _text(page)
    page.screenshot(path=str(artifacts / "intervals-undecided-detail.png"), full_page=True)
    _open(page, "undecided", "Export")
    page.locator("code").filter(has_text="UNDECIDED against the default gate (ppl<=+1%)").first.wait_for(
        timeout=30_000)
    assert "within the default gate" not in _text(page)
    page.screenshot(path=str(artifacts / "intervals-undecided-export.png"), full_page=True)


def test_defaults_breaking_the_slo_are_marked_never_on_the_front(page, artifacts):
    _open(page, "slo_broken", "Pareto")
    page.get_by_text(re.compile(r"^No configuration meets the SLO, vLLM's defaults included \(vLLM's defaults break "
                                r"it: TTFT p99 17\.8 s against 2 s, every load failed")).first.wait_for(timeout=30_000)
    cells = _cells(page)
    assert "the reference, not a candidate: breaks the SLO: TTFT p99 17.8 s against 2 s, every load failed" in cells
    assert not any(c.startswith("on the front") for c in cells), cells
    page.screenshot(path=str(artifacts / "intervals-slo-pareto.png"), full_page=True)
    _open(page, "slo_broken", "Trials")
    cells = _cells(page)
    assert "pareto" not in cells, cells
    # on screen at 1440 px: the third column (after trial and category) of a grid inside the page
    headers = page.locator('[data-testid="stDataFrame"] [role="columnheader"]').all_inner_texts()
    assert headers[:3] == ["trial", "category", "why"], headers
    grid = page.locator('[data-testid="stDataFrame"]').first.bounding_box()
    assert grid is not None and grid["x"] + grid["width"] <= 1440, grid
    assert any("breaks the SLO: TTFT p99 17.8 s against 2 s, every load failed" in c for c in cells), cells
    _open(page, "slo_broken", "Trial detail")
    _trial(page, "reference (vLLM's defaults)")
    page.get_by_role("heading", name=re.compile(r"^Reference \(vLLM's defaults\) — measured \(infeasible\)$")).wait_for(
        timeout=30_000)
    assert "best by" not in _text(page)
    _open(page, "slo_broken", "Export")
    _trial(page, "reference (vLLM's defaults)")
    page.locator("code").filter(has_text="WARNING: vLLM's defaults break the study's SLO").first.wait_for(
        timeout=30_000)
    page.screenshot(path=str(artifacts / "intervals-slo-export.png"), full_page=True)


def test_a_random_weights_study_shows_no_quality_number(page, artifacts):
    for view in ("Pareto", "Trials", "Trial detail", "Compare", "Export"):
        _open(page, "random", view)
        if view == "Trial detail":
            _trial(page, "trial 1")
            page.get_by_text(re.compile(r"^not measurable: measured on random weights")).first.wait_for(timeout=30_000)
        text = _text(page)
        for word in ("perplexity", "KLD", "top-1", "noise floor", "quality gate", "ppl<="):
            assert word not in text, (view, word)
        page.screenshot(path=str(artifacts / f"intervals-random-{view.replace(' ', '-').lower()}.png"),
                        full_page=True)
