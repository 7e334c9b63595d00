"""MLPerf Training reference implementation: Llama 3.1 405B pretraining in NVFP4 on GB200 NVL72."""
__version__ = "0.1.0"
