"""The C kernel of the NVFP4 row+column and rowwise quantizations (precision/native.py, rowcol.c)
gives the bits of the torch formulation it replaces (nvfp4.fake_quantize_rowcol and
fake_quantize_amax with native.ENABLED off), on every kind of FP32 input, and the emulation
falls back to torch, with one warning, when the kernel cannot be built."""
import warnings

import pytest
import torch

from llama31_405b.precision import native, nvfp4
from llama31_405b.precision.nvfp4 import fake_quantize_rowcol

F32_MAX = torch.finfo(torch.float32).max


def _both(x: torch.Tensor) -> tuple[tuple, tuple]:
    native.ENABLED = False
    try:
        row, col, amax = fake_quantize_rowcol(x)
        want = (row.clone(), col.clone(), amax)
    finally:
        native.ENABLED = True
    row, col, amax = fake_quantize_rowcol(x)
    return want, (row.clone(), col.clone(), amax)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The bit patterns, every NaN as the canonical quiet NaN: which NaN payload a product of two
    NaNs keeps is the operand order the compiler picked (x86 keeps the first one's), and any NaN
    input makes the whole tensor NaN either way (its amax, hence every scale, is NaN)."""
    t = t.contiguous()
    return torch.where(t.isnan(), torch.tensor(float("nan")), t).view(torch.int32)


def _inputs():
    g = torch.Generator().manual_seed(7)
    for rows, cols in [(16, 16), (48, 80), (512, 128), (512, 352), (64, 704), (32, 16)]:
        x = torch.randn(rows, cols, generator=g)
        yield f"{rows}x{cols} normal", x
        yield f"{rows}x{cols} wide range", x * torch.exp(torch.randn(rows, cols, generator=g) * 8)
        # E2M1 grid points, ties and neighbours of ties at every scale of the block (the scale
        # set by a row's own amax): the rounding's hard cases
        grid = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0,
                             5.0, 6.0, 6.5])
        t = grid[torch.randint(0, len(grid), (rows, cols), generator=g)]
        t = t * torch.where(torch.rand(rows, cols, generator=g) < 0.5, -1.0, 1.0)
        ulp = torch.randint(-1, 2, (rows, cols), generator=g, dtype=torch.int32)
        t = (t.view(torch.int32) + ulp * (t != 0)).view(torch.float32)
        yield f"{rows}x{cols} ties", t * torch.exp2(torch.randint(-100, 100, (rows, 1),
                                                                 generator=g).float())
        s = x.clone()
        s[::3] = 0.0
        s[1::5, ::2] = -0.0
        s[0, :16] = 1e-45                                   # subnormals, an underflowing block
        s[2, 3] = -3e-39
        s[-1, -1] = F32_MAX
        yield f"{rows}x{cols} zeros, subnormals, FLT_MAX", s
        yield f"{rows}x{cols} all zero", torch.zeros(rows, cols)
        i = x.clone()
        i[1, 5], i[3, 0] = float("inf"), float("-inf")
        yield f"{rows}x{cols} infinities", i
        n = x.clone()
        n[2, 7] = float("nan")
        n[5, 1] = torch.tensor(0x7FC12345, dtype=torch.int32).view(torch.float32)  # a payload
        yield f"{rows}x{cols} NaNs", n
        yield f"{rows}x{cols} tiny amax", x * 1e-38
        yield f"{rows}x{cols} huge amax", x * 1e37


def test_the_kernel_builds_here():
    """CI and the images have a C compiler: the fast path must be the one measured."""
    assert native.kernel() is not None, (
        "the NVFP4 C kernel did not build (see the RuntimeWarning): install a C compiler "
        "(e.g. apt-get install gcc)")


INPUTS = list(_inputs())


@pytest.mark.parametrize("case,x", INPUTS, ids=[c for c, _ in INPUTS])
def test_kernel_gives_the_torch_formulations_bits(case, x):
    (row0, col0, amax0), (row1, col1, amax1) = _both(x)
    assert torch.equal(_bits(row1), _bits(row0)), case
    assert torch.equal(_bits(col1), _bits(col0)), case
    assert col1.shape == (x.shape[1], x.shape[0])
    assert amax1 == amax0 or (amax1 != amax1 and amax0 != amax0)      # equal, or both NaN


ROWWISE = INPUTS + [("40x48 rows not a multiple of 16",
                     torch.randn(40, 48, generator=torch.Generator().manual_seed(5)))]


@pytest.mark.parametrize("case,x", ROWWISE, ids=[c for c, _ in ROWWISE])
def test_rowwise_kernel_gives_the_torch_formulations_bits(case, x):
    """fake_quantize_amax's rowwise round-to-nearest case (evaluation forwards, weights without
    Dgrad): the rows need not be a multiple of 16."""
    native.ENABLED = False
    try:
        want, amax0 = nvfp4.fake_quantize_amax(x)
    finally:
        native.ENABLED = True
    got, amax1 = nvfp4.fake_quantize_amax(x, out_slot="test_rowwise")
    assert torch.equal(_bits(got), _bits(want)), case
    assert amax1 == amax0 or (amax1 != amax1 and amax0 != amax0)


def test_kernel_results_do_not_depend_on_the_thread_count():
    """Every OpenMP thread writes its own rows and blocks: 1 and 2 intra-op threads agree."""
    before = torch.get_num_threads()
    outs = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            outs.append([(fake_quantize_rowcol(x)[:2], nvfp4.fake_quantize_amax(x)[0])
                         for _, x in INPUTS[::3]])
    finally:
        torch.set_num_threads(before)
    for ((r1, c1), w1), ((r2, c2), w2) in zip(*outs):
        assert torch.equal(_bits(r1), _bits(r2)) and torch.equal(_bits(c1), _bits(c2))
        assert torch.equal(_bits(w1), _bits(w2))


def test_kernel_results_in_a_callers_buffer_and_3d_inputs():
    """The linear layer passes a scratch `out` and Megatron's 3-D activations: the same bits."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 4, 64, generator=g) * 3
    out = torch.empty(2 * x.numel())
    native.ENABLED = False
    try:
        want = [t.clone() for t in fake_quantize_rowcol(x)[:2]]
    finally:
        native.ENABLED = True
    got = fake_quantize_rowcol(x, out=out)
    assert got[0].data_ptr() == out.data_ptr()
    assert torch.equal(_bits(got[0]), _bits(want[0])) and torch.equal(_bits(got[1]),
                                                                      _bits(want[1]))


def test_a_failed_build_falls_back_to_torch_with_one_warning(monkeypatch, tmp_path):
    broken = tmp_path / "rowcol.c"
    broken.write_text("this is not C\n")
    monkeypatch.setattr(native, "SOURCE", broken)
    monkeypatch.setattr(native, "_STATE", {})
    with pytest.warns(RuntimeWarning, match="(?s)not available .*rowcol.c.*using the torch"):
        assert native.kernel() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert native.kernel() is None                       # decided once, warned once
    x = torch.randn(32, 32)
    row, col, _ = fake_quantize_rowcol(x)
    assert torch.equal(row, nvfp4.fake_quantize(x))
    assert torch.equal(col, nvfp4.fake_quantize(x, columnwise=True))


def test_no_compiler_is_named_in_the_error(monkeypatch):
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="no C compiler"):
        native.build()


def test_the_flags_keep_ieee_arithmetic():
    """No FMA contraction and no fast-math: the compiler may not fuse x * enc + C or reorder
    (y + C) - C, which would change the rounding (the exactness of the kernel rests on it)."""
    assert "-ffp-contract=off" in native.FLAGS and "-fno-fast-math" in native.FLAGS
    assert not any(f.startswith(("-Ofast", "-ffast-math", "-funsafe")) for f in native.FLAGS)


def test_the_kernels_calls_are_annotated_for_the_profile_only_while_it_runs():
    """A profile counts the kernel's calls as compute (profile/attribution.py KERNEL_PREFIX): the
    emulated linear's forward and backward each annotate their kernel calls under a profiler,
    and the Python of the autograd Function around them (host time) is left unannotated."""
    from torch.profiler import ProfilerActivity, profile

    from llama31_405b.precision.linear import nvfp4_linear
    from llama31_405b.profile.attribution import KERNEL_PREFIX
    x = torch.randn(32, 64, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(48, 64, dtype=torch.bfloat16, requires_grad=True)
    nvfp4_linear(x, w).sum().backward()          # unprofiled: no annotation, nothing recorded
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        nvfp4_linear(x, w).sum().backward()
    assert native.ANNOTATION == KERNEL_PREFIX    # the profile's name for a kernel's call
    names = [e.key for e in prof.key_averages()]
    kernels = {n for n in names if n.startswith(KERNEL_PREFIX)}
    assert {KERNEL_PREFIX + "nvfp4_block_amax", KERNEL_PREFIX + "nvfp4_rowcol"} <= kernels
    assert "NVFP4LinearFunction" in names and "NVFP4LinearFunctionBackward" in names
