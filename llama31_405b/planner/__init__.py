"""The planner: a first-principles performance model of the Llama 3.1 405B run (pure Python).

`predict(cfg)` gives step time, its breakdown, MFU, memory per GPU and time-to-train of a config;
`sweep(system, racks, Fixed(...))` ranks every feasible layout; `writer` regenerates the
per-scale GB200 configs; `explain` tabulates and plots the scaling. All constants, published
calibration figures and fitted values live in `calibration.py`. See docs/planner.md.
"""
from .calibration import ASSUMED, CALIBRATION, fitted
from .spec import make_config
from .step import Prediction, predict
from .sweep import Fixed, best, sweep

__all__ = ["ASSUMED", "CALIBRATION", "Fixed", "Prediction", "best", "fitted", "make_config", "predict",
           "sweep"]
