"""The planner: a performance model of the Llama 3.1 405B run (pure Python).

`predict(cfg)` gives step time (from a simulation of Megatron's pipeline schedule), its
breakdown, MFU, memory per GPU and time-to-train of a config; `sweep(system, racks, Fixed(...))`
ranks every feasible layout; `capacity.memory_problems(cfg)` is the memory verdict the CLI checks
before a launch; `writer` regenerates the per-scale GB200 configs; `explain` tabulates and plots
the scaling. The constants are data in `calibrate/constants.py`, fitted to a measured step by
the `calibrate` package (`plan --calibrate`). See docs/planner.md.
"""
from .calibrate import ASSUMED, CALIBRATION, Fitted, fitted
from .spec import make_config
from .step import Prediction
from .step import predict as _predict
from .sweep import Fixed, best, sweep


def predict(cfg, fit: Fitted | None = None) -> Prediction:
    """The prediction for a config, with the published calibration's constants by default."""
    return _predict(cfg, fit or fitted())


__all__ = ["ASSUMED", "CALIBRATION", "Fitted", "Fixed", "Prediction", "best", "fitted", "make_config",
           "predict", "sweep"]
