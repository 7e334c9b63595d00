import torch, time, sys
torch.set_num_threads(1)
from llama31_405b.config.load import load_config
import llama31_405b.profile.probe as P
cfg=load_config(sys.argv[1]); sh=P.shapes(cfg)
fns={}
for prec,dt in (("fp32",torch.float32),("bf16",torch.bfloat16)):
    fns[f"gemm_{prec}"]=P._gemm(torch,dt,*sh["gemm"])
    fns[f"attention_{prec}"]=P._attention(torch,dt,*sh["attention"])
    fns[f"elementwise_{prec}"]=P._elementwise(torch,dt,*sh["elementwise"])
    fns[f"ffn_{prec}"]=P._linear(torch,dt,sh["ffn"],nvfp4=False)
fns["ffn_nvfp4"]=P._linear(torch,torch.bfloat16,sh["ffn"],nvfp4=True)
for burst in (1,2,4):
    best={k:1e9 for k in fns}
    for _ in range(5):
        for k,fn in fns.items():
            for _ in range(burst): best[k]=min(best[k],P._time(fn))
    print(burst,{k:round(v*1e3,3) for k,v in best.items()}, "nvfp4/fp32 %.3f"%(best["ffn_nvfp4"]/best["ffn_fp32"]), "bf16/fp32 gemm %.3f att %.3f ew %.3f"%(best["gemm_bf16"]/best["gemm_fp32"],best["attention_bf16"]/best["attention_fp32"],best["elementwise_bf16"]/best["elementwise_fp32"]))
