import torch
torch.set_num_threads(1)
from llama31_405b.config.load import load_config
from llama31_405b.profile.probe import run_probe
import sys
cfg=load_config(sys.argv[1])
for rep in (5,20):
    r=run_probe(cfg, repeats=rep)
    s=r["seconds"]; print(rep, {k:round(v*1e3,3) for k,v in s.items() if k.startswith("ffn")}, r["shapes"]["ffn"])
