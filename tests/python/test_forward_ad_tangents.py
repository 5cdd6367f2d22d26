"""Forward-mode AD under a budget: an op on dual tensors reads their tangents (integration/dispatch_hook.cc,
NoteTangents).

An op's autograd kernel computes the output's tangent from the arguments' tangents inside the kernel, where its
nested calls are not recorded; the tangents are not among the op's arguments. remat used to gather only the
arguments, so a tangent it had evicted was read evicted ("this tensor's storage is evicted ... read inside the
recorded op"). Each argument's tangent is now gathered with the arguments.
"""
import torch
import torch.autograd.forward_ad as fwAD

import oracle
import remat

MiB = 1 << 20


def _dual_mm():
    torch.manual_seed(0)
    w = torch.randn(256, 256)
    with fwAD.dual_level():
        primal = torch.randn(256, 256)
        tangent = torch.randn(256, 256)  # a result remat recorded: evictable
        x = fwAD.make_dual(primal, tangent)
        newer = [torch.randn(256, 256) * 2 for _ in range(12)]  # 3 MiB made after it: the tangent goes first
        out, out_tangent = fwAD.unpack_dual(torch.mm(x, w))
        return [out.clone(), out_tangent.clone(), *[n.clone() for n in newer]]


def test_an_evicted_tangent_is_brought_back_for_the_op_that_reads_it():
    expected = _dual_mm()
    with remat.enable(2 * MiB):
        got = _dual_mm()
        stats = remat.stats()
    assert stats["evictions"] > 0 and stats["rematerializations"] > 0, stats
    assert len(expected) == len(got)
    for i, (e, g) in enumerate(zip(expected, got)):
        assert oracle.same_bytes(e, g), f"tensor {i} differs (0: output, 1: its tangent)"
