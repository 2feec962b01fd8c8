"""Capacity at an SLO: the step record and level verdicts (step), the search over loads (search),
sizing and judging a held level (sustain), the windows a level of a long trace replays (windows,
parts), and running levels on an engine (levels)."""
