"""Every command ends a failure the same way (llama31_405b.failures): one error line, an exit
status per kind, no traceback unless --debug / LLAMA31_405B_DEBUG; a run that fails before
run_start says "stopped before run_start: <reason>" and its log's last event carries the reason;
a checkpoint whose tensors contradict its record is refused naming the tensor and both shapes."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, py_env
from llama31_405b import failures
from llama31_405b.config import load_config
from llama31_405b.mlperf.log import log_events
from test_data_verify import prepared  # noqa: F401  (a small prepared data_dir, module-scoped)


class PlacementError(RuntimeError):     # matched by name, like the real one
    pass


def _raiser(exc):
    def func(args):
        raise exc
    return func


def _checkpoint_exception():
    from torch.distributed.checkpoint.api import CheckpointException
    return CheckpointException("CheckpointException ranks:dict_keys([0])",
                               {0: (RuntimeError("size mismatch"), None)})


def test_exit_status_per_kind_and_one_line(capsys, monkeypatch):
    monkeypatch.delenv(failures.DEBUG_ENV, raising=False)
    monkeypatch.delenv("RANK", raising=False)
    from llama31_405b.checkpoint.format import CheckpointError
    from llama31_405b.config.errors import ConfigError
    cases = [(PlacementError("TP group spans racks"), 3), (ConfigError("x.toml: bad"), 2),
             (CheckpointError("ck: tensor t"), 2), (FileNotFoundError(2, "No such file", "f"), 2),
             (ValueError("odd"), 1), (_checkpoint_exception(), 1)]
    for exc, code in cases:
        assert failures.run_command(_raiser(exc), None) == code
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    # torch's CheckpointException is a BaseException: still one line naming rank and cause
    failures.run_command(_raiser(_checkpoint_exception()), None)
    assert "rank 0: RuntimeError: size mismatch" in capsys.readouterr().err


def test_traceback_only_when_asked_and_other_ranks_say_their_rank(capsys, monkeypatch):
    monkeypatch.setenv(failures.DEBUG_ENV, "1")
    monkeypatch.setenv("RANK", "3")
    assert failures.run_command(_raiser(ValueError("odd")), None) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.splitlines()[-1] == "error: rank 3: ValueError: odd"


def test_a_failure_before_run_start_is_logged_and_said_once(tmp_path, capsys, monkeypatch):
    """A BaseException during init (as torch's CheckpointException is) still ends in run_stop
    aborted with its reason as the log's last event, and the console says so once."""
    monkeypatch.delenv(failures.DEBUG_ENV, raising=False)
    from llama31_405b.cli.train_cmd import outcome
    from llama31_405b.train.hooks import Hook
    from llama31_405b.train.loop import Run
    from llama31_405b.train.mllog import MLPerfLogHook
    from llama31_405b.train.progress import ProgressHook
    cfg = load_config("configs/tiny_cpu.toml")
    log = tmp_path / "result.txt"

    class Broken(Hook):
        def on_init_start(self, run):
            raise _checkpoint_exception()

    run = Run(cfg, seed=1, hooks=[MLPerfLogHook(cfg, seed=1, log_file=str(log), rank=0, echo=False),
                                  ProgressHook(cfg, rank=0), Broken()])
    assert run.execute() == "aborted"
    assert outcome(run, "aborted", rank=0) == 1
    last = log_events(log)[-1]
    assert last.key == "run_stop" and last.metadata["status"] == "aborted"
    assert "rank 0: RuntimeError: size mismatch" in last.metadata["reason"]
    err = capsys.readouterr().err
    assert err == f"error: stopped before run_start: {last.metadata['reason']}\n"


def test_exit_status_of_a_placement_failure_is_3(capsys):
    from types import SimpleNamespace

    from llama31_405b.cli.train_cmd import outcome
    run = SimpleNamespace(failure=PlacementError("racks"),
                          state=SimpleNamespace(run_started=False, reason="racks"))
    assert outcome(run, "aborted", rank=0) == 3
    assert capsys.readouterr().err == "error: stopped before run_start: racks\n"


def test_shape_mismatches_name_tensor_and_both_shapes():
    from types import SimpleNamespace

    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    from llama31_405b.checkpoint.shapes import mismatches
    sharded = {"model": {
        "a": ShardedTensor.from_rank_offsets("decoder.final_layernorm.weight", torch.zeros(128)),
        "b": ShardedTensor.from_rank_offsets("output_layer.weight", torch.zeros(8, 4),
                                             allow_shape_mismatch=True),
        "c": ShardedTensor.from_rank_offsets("not.stored", torch.zeros(2))}}
    stored = {"decoder.final_layernorm.weight": SimpleNamespace(size=torch.Size([256])),
              "output_layer.weight": SimpleNamespace(size=torch.Size([16, 4]))}
    assert mismatches(sharded, stored) == [("decoder.final_layernorm.weight", (256,), (128,))]


def _lying_checkpoint(path: Path, cfg) -> Path:
    """A checkpoint whose record (llama31_405b.json) matches `cfg` while its one tensor, the final
    norm, is twice as wide as cfg's model."""
    import torch.distributed.checkpoint as dcp

    from llama31_405b.checkpoint.format import MODEL_INFO, SHAPE_KEYS
    dcp.save({"decoder.final_layernorm.weight": torch.zeros(2 * cfg.model.hidden_size)},
             checkpoint_id=str(path), no_dist=True)
    (path / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist"}))
    (path / MODEL_INFO).write_text(json.dumps({k: getattr(cfg.model, k) for k in SHAPE_KEYS}))
    return path


def test_train_refuses_a_checkpoint_whose_tensors_contradict_its_record(prepared, tmp_path):
    """`train` with that checkpoint: exit 2, one error line naming tensor and both shapes, no
    traceback, and the same reason in the log's last event (run_stop aborted). The data is
    checked before the model is built (train.inputs): a small prepared data_dir passes those
    checks (metadata only; the run stops at the load, before reading it)."""
    cfg = load_config("configs/tiny_cpu.toml")
    ck = _lying_checkpoint(tmp_path / "ck", cfg)
    log = tmp_path / "result.txt"
    env = {k: v for k, v in py_env().items() if k != failures.DEBUG_ENV}
    r = subprocess.run([sys.executable, "-m", "llama31_405b", "train", "--config",
                        "configs/tiny_cpu.toml", "--seed", "1", "--log", str(log),
                        "--init-checkpoint", str(ck), "--set", f"data.data_dir={prepared}",
                        "--set", 'data.tokenizer="tokenizer/tok.model"', "--set",
                        'data.pretrain_prefix=""', "--set", "data.require_verified=false"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    h = cfg.model.hidden_size
    want = (f"tensor decoder.final_layernorm.weight is [{2 * h}] in the checkpoint but [{h}] in "
            "the model of")
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 2, r.stderr[-3000:]
    assert len(errors) == 1 and errors[0].startswith("error: stopped before run_start: ")
    assert want in errors[0] and "Traceback" not in r.stderr, r.stderr[-3000:]
    last = log_events(log)[-1]
    assert last.key == "run_stop" and want in last.metadata["reason"]
    assert not any(e.key == "run_start" for e in log_events(log))


@pytest.mark.slow       # two gloo ranks under torchrun (~30 s)
def test_checkpoint_verify_under_torchrun_prints_no_traceback(tmp_path):
    from checkpoint_helpers import write_config
    from helpers.ports import free_port
    cfg_path = write_config(tmp_path / "tp2.toml", tp=2)
    ck = _lying_checkpoint(tmp_path / "ck", load_config(cfg_path))
    env = {k: v for k, v in py_env().items() if k != failures.DEBUG_ENV}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                        f"--master-port={free_port()}", "--master-addr=127.0.0.1",
                        "-m", "llama31_405b", "checkpoint", "verify", "--hf", str(tmp_path),
                        "--megatron", str(ck), "--config", str(cfg_path)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    # torchrun's own ChildFailedError report is its business; the ranks print one line each
    assert "[rank0]: Traceback" not in r.stderr and "[rank1]: Traceback" not in r.stderr, \
        r.stderr[-3000:]
    lines = [ln for ln in r.stderr.splitlines() if "error:" in ln and "tensor " in ln]
    assert any(ln.startswith("error: ") and "decoder.final_layernorm.weight is [128] in the "
               "checkpoint but [64]" in ln for ln in lines), r.stderr[-3000:]
