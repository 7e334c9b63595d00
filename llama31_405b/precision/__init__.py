"""Low-precision numerics: the NVFP4 emulation (CPU / any GPU) and the Transformer Engine recipe
settings for native NVFP4 on Blackwell. Import the submodules directly (torch is imported there)."""
