"""tracetune: an auto-tuner for LLM serving that replays real traffic against real engine configs.

The packages, in the order data flows (no import runs back up):
`tracetune.engine_adapter` (start and talk to engines), `tracetune.replay` (traces, the replay
client, metrics, capacity), `tracetune.search_spaces` (knobs), `tracetune.tuner` (studies,
quality, storage), `tracetune.dashboard` (browse and export), `tracetune.fleet` (a study as
Kubernetes manifests), `tracetune.cli` (the `tune` command). Each lives in its own top-level folder of the source tree.
"""

from tracetune.errors import InputError, TuneError

__version__ = "0.1.0"
__all__ = ["InputError", "TuneError", "__version__"]
