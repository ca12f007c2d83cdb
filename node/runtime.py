"""Interpreter settings both node processes apply at startup."""

from __future__ import annotations

import gc

# Young-generation collections every 20,000 allocations instead of 700: a request allocates a few
# hundred container objects, so the default ran a collection every few requests. Survivors of
# startup (the metadata image, codecs, configs) are frozen out of every later collection.
GC_THRESHOLDS = (20_000, 20, 100)


def tune_gc() -> None:
    """Collect what startup left, freeze the survivors, raise the thresholds (GC_THRESHOLDS)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
