"""Streamlit entry point of `tune dashboard` (run by `streamlit run dashboard/app.py`): the sidebar
(storage, study, page, live refresh, what the study was judged by) and the page it names (`views`)."""

from __future__ import annotations

import os
import time

import streamlit as st

from tracetune.dashboard import ENV_STORAGE, ENV_STORAGE_PICKER, ENV_STUDY, banners, data, storage, views
from tracetune.errors import TuneError


def storage_picker_shown() -> bool:
    """The sidebar's storage box, unless `tune dashboard` switched it off ("0": a visitor could point
    it at any file on the server)."""
    return os.environ.get(ENV_STORAGE_PICKER, "1").strip() != "0"


def _storage_url() -> str:
    given = os.environ.get(ENV_STORAGE) or storage.default_storage() or ""
    shown = storage.display_url(given) if given else ""
    if not storage_picker_shown():
        st.caption(f"storage: {shown or '-'}")
        return given
    typed = st.text_input("Storage", value=shown, key="storage",
                          help="the study database (SQLAlchemy URL); the dashboard only reads it")
    # The password of a database URL is never shown; the masked text stands for the given URL.
    return given if typed == shown else typed


def _judged_by(study: data.StudyView) -> None:
    """What the study's trials were judged by: objectives, SLOs and the quality gate (or its absence)."""
    st.caption(f"objectives: {', '.join(f'{o} ({d[:3]})' for o, d in zip(study.objectives, study.directions))}")
    dummy = banners.on_random_weights(study)
    gate = ([] if study.gate_off or dummy else [f"quality {study.shown_gate} (beyond the noise floor)"])
    if study.slos or gate:
        st.caption("constraints: " + ", ".join(study.slos + gate))
    if dummy:
        st.caption("quality: not measurable (random weights, load_format dummy: speed only)")
    elif study.gate_off:
        st.warning(f"No quality gate: trials of any quality cost compete (default would be {study.shown_gate}).",
                   icon=":material/report:")
    st.caption(f"measured on: {study.platform}")
    if study.floor_text:
        st.caption(f"quality {study.floor_text}")


def main() -> None:
    st.set_page_config(page_title="tracetune", page_icon="📈", layout="wide")
    with st.sidebar:
        st.title("tracetune")
        url = _storage_url()
        if not url:
            st.warning("No study database: run `tune --trace FILE` first, or enter a storage URL.")
            return
        try:
            names = views.studies(url)
        except (TuneError, Exception) as exc:  # a bad URL is the user's input: say so, do not crash
            st.error(f"cannot read {storage.display_url(url)}: {storage.display_url(str(exc))}")
            return
        if not names:
            st.warning("This storage holds no study yet.")
            return
        wanted = os.environ.get(ENV_STUDY)
        name = st.selectbox("Study", names, index=names.index(wanted) if wanted in names else 0, key="study")
        page = st.radio("Page", views.PAGES, key="page")
    study = views.load(url, name)
    with st.sidebar:
        # On only while a worker beats: a finished study, or one whose workers went silent, is not live.
        live = st.toggle("Live refresh", value=study.running, key="live",
                         help="re-read the study every few seconds while a worker is measuring")
        every = st.select_slider("every (s)", [2, 5, 10, 30], value=5, key="live_every") if live else None
        _judged_by(study)

    def body() -> None:
        current = views.load(url, name)
        measured = sum(1 for t in current.trials if t.measured)
        st.header(f"{page} · study {current.name}")
        workers = f" · {len(current.workers)} workers" if current.several_workers else ""
        st.caption(f"{len(current.trials)} trials, {measured} measured, {len(current.front)} on the front{workers}"
                   + (" · running" if current.running else "") + f" · read {time.strftime('%H:%M:%S')}")
        views.RENDER[page](current)

    if live:
        st.fragment(body, run_every=every)()
    else:
        body()


main()
