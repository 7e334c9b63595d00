"""known_warnings: the listed third-party warnings are dropped, exactly, and no other."""
import warnings

from llama31_405b.known_warnings import quiet_known_warnings

# torch 2.13 torch.distributed.checkpoint.state_dict_loader, as megatron-core 0.19.2's
# TorchDistLoadShardedStrategy.load (no_dist=True) makes it print on every run, with two more
# from the same call
DCP = ("torch.distributed is disabled, unavailable or uninitialized, assuming the intent is to "
       "load in a single process.")


def test_megatron_cores_checkpoint_load_warnings_are_dropped_and_others_are_not():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_known_warnings()
        warnings.warn(DCP, stacklevel=1)
        warnings.warn("The argument order of load has been changed. Please check the document "
                      "to avoid future breakages.", stacklevel=1)
        warnings.warn("Please use DTensor instead and we are deprecating ShardedTensor.",
                      FutureWarning, stacklevel=1)
        warnings.warn("torch.distributed is disabled for another reason", stacklevel=1)
    assert [str(w.message) for w in seen] == ["torch.distributed is disabled for another reason"]
