"""The initial checkpoint: Hugging Face Llama 3.1 safetensors -> Megatron distributed checkpoint.

format (the one owner of the Megatron checkpoint: save, load, completeness, compatibility,
the extra-state policy, the model-info file), hf_reader (safetensors index, tensor-by-tensor
reads), mapping (names, shapes, fusions, checks), dcp_parts (Megatron saves of single tensors
joined into one torch_dist checkpoint), convert (the streamed conversion), verify (load at any
layout, compare logits), progress. See docs/checkpoint.md.
"""
