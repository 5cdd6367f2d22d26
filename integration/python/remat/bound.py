"""The smallest budget any drop-and-recompute runtime could train a program with, measured on an unconstrained run.

Some storages can never be dropped: the optimizer's state (momentum, Adam's moments: written in place every step
from values that are gone), and, while the optimizer updates the parameters, every gradient (once a parameter
changes, nothing computed from its old value can be recomputed, and every gradient was computed from nearly every
parameter). And an op needs the storages it reads and writes resident while it runs. So when op k runs, at least

    bytes of the optimizer's state alive then (+ every gradient, if op k is part of an optimizer step or comes
    after one, before the next forward; + every parameter the program made while remat was on, such as
    vector_to_parameters' views, once an optimizer step has written it in place)
    + bytes of the other storages op k reads and writes

must be in memory, whatever was dropped before; and if op k's kernel allocates buffers of its own while it runs
(convolution's backward, an RNN's workspace), its outputs count as the most it holds at once beyond what was
allocated before it started, when that is more.

The gradients add a second constraint, before the step. Each gradient is made for the last time (by its last
writer, or by a replay of it) at some moment before the step, and stays resident from then on (dropped, it would
have to be made again). So, in the order a runtime last makes them, the op that makes the k-th runs with the
gradients made before it resident, beside what that op reads and writes. Whatever order a runtime chooses, it
holds at least

    state + min over orders of max over k of (gradients made before the k-th + what the k-th one's op holds)

and that minimum is reached by making first the gradients whose op holds the most beyond the gradients it leaves
(an exchange argument: of two adjacent ones, the one with the larger difference goes first). An op that writes
several gradients (an RNN layer's backward) makes them together; a gradient whose last writer was not seen counts
as its own bytes. Dependencies between the ops (a gradient's op reads the backward pass before it) are ignored,
which can only lower it.

An op's inputs add a third. Of the storages an op reads, one was made last (by its last writer, or a replay of it),
and the others, made before, stay resident from then until the op. So whichever it was, its writer ran beside
them: the op needs at least

    min over its inputs x of (what x's last writer required when it ran + the op's other inputs that writer
    neither read nor wrote, and that are not undroppable)

(two activations added together, each the product of two others: one of them is held while the other's product is
made). Only inputs whose writer ran since the model's forward started (or the last step ended) are looked at, and
an undroppable input made before then is never the last one; an input the measurement did not see made gives no
constraint.

Results the program keeps across a step add a fourth. A storage computed from a parameter's old value (through
any chain of ops since the model's forward started) cannot be recomputed once the step has written that parameter,
so if the program reads it after the step, it was resident from that write on. At the step's end, then, every such
result read later is resident beside the optimizer's state, the stepped parameters and every gradient (activations a
forward hook kept for logging, a loss read after the step). Only parameters the step's optimizer holds with a
gradient count as written; results that die unread, or are read before the step ends, add nothing.

The largest such sum over the program is a lower bound on every budget that can run it without a second tier,
for every eviction policy (fragmentation only adds to it). Storages
that existed before the measurement started (the model's parameters and buffers, the tensors passed as `outside`)
are not counted: remat's arena does not hold them, and its peak does not count them either.

    with RequiredBytes(model, optimizer, outside=[x, y]) as rb:
        train_step()
    rb.required_bytes, rb.at_op, rb.pinned_at_max
    rb.op_bytes   # the largest op's own inputs and outputs: the bound when a second tier can take all the rest

A kernel's own buffers are only seen through remat's arena: measure under `remat.enable(budget)` with a budget that
never binds (every allocation then comes from the arena, nothing is evicted) to count them; without remat they
count as nothing. Under remat it restarts the arena's peak at every op (remat.reset_peak()). The arena is the
process's: while other threads allocate (torch.jit.fork's tasks), their bytes count towards the op that runs then,
so for such a program the bound may be a little high, and vary from run to run.

The tests use it to tell a budget remat fails at from one that no drop-and-recompute policy can meet. It runs ops
through a Python dispatch mode: it measures, it does not train fast.
"""

from __future__ import annotations

from typing import Dict, Iterable, NamedTuple, Optional, Tuple

import torch
from torch._C._functorch import is_functorch_wrapped_tensor
from torch.multiprocessing.reductions import StorageWeakRef
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ._engine import optimizer_state_tensors
from ._exports import storage_identity
from ._subclasses import inner_tensors

__all__ = ["RequiredBytes"]


def _storages(t: torch.Tensor):
    """Each storage holding t's values: its own, or a sparse tensor's parts (it has no storage: its indices and values
    are dense tensors), or none for a nested tensor or a zero tensor (forward AD's tangent of a tensor that has none:
    no memory), or a Python subclass's inner tensors' (a wrapper has no memory of its own; one over its own storage
    whose attributes hold no tensor counts nothing, which only loosens the bound)."""
    if t.layout == torch.sparse_coo:
        return [*_storages(t._indices()), *_storages(t._values())]
    if t.layout in (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc):
        compressed, plain = ((t.crow_indices(), t.col_indices()) if t.layout in (torch.sparse_csr, torch.sparse_bsr)
                             else (t.ccol_indices(), t.row_indices()))
        return [*_storages(compressed), *_storages(plain), *_storages(t.values())]
    if t.is_nested or t._is_zerotensor():
        return []
    if torch._C._dispatch_keys(t).has(torch._C.DispatchKey.Python):  # a subclass: the memory is its inner tensors'
        return [storage for inner in inner_tensors(t) for storage in _storages(inner)]
    return [storage_identity(t)]  # not an export: its address is an identity here, its bytes are never read


def _still(ref: StorageWeakRef, storage: torch.UntypedStorage) -> bool:
    """ref, taken from a storage at this address, is this live storage (not a later one placed where it died)."""
    return not ref.expired() and ref.cdata == StorageWeakRef(storage).cdata


class _LiveStorages:
    """A set of storages by address, held weakly: one that dies leaves the set, and a later storage the allocator
    places at its address is not taken for it (vector_to_parameters frees the old parameters, zero_grad the
    gradients; a gradient or an activation may then land at their addresses)."""

    def __init__(self, tensors: Iterable[torch.Tensor] = ()):
        self._refs: Dict[int, Tuple[int, StorageWeakRef]] = {}
        for t in tensors:
            for storage in _storages(t):
                self.add(storage)

    def add(self, storage: torch.UntypedStorage) -> None:
        self._refs[storage.data_ptr()] = (storage.nbytes(), StorageWeakRef(storage))

    def clear(self) -> None:
        self._refs.clear()

    def __contains__(self, ptr: int) -> bool:
        entry = self._refs.get(ptr)
        if entry is None:
            return False
        if entry[1].expired():
            del self._refs[ptr]
            return False
        return True

    def live_sizes(self) -> Dict[int, int]:
        """{address: bytes} of the storages in the set that live."""
        for ptr in [ptr for ptr, (_, ref) in self._refs.items() if ref.expired()]:
            del self._refs[ptr]
        return {ptr: nbytes for ptr, (nbytes, _) in self._refs.items()}


class RequiredBytes(TorchDispatchMode):
    """Measures max over ops of (undroppable bytes + the op's other inputs and outputs); see the module docstring.

    The undroppable set is kept by hooks rather than rescanned per op: the optimizer's state (and, once a step has
    run, its parameters) is rescanned when the model's forward starts and after each optimizer step; the gradients
    join it when an optimizer step starts and leave it when the next forward starts (they were computed from the
    parameters' old values; zero_grad has dropped or zeroed them by then). State created inside a step joins the set
    only after it, which can only make the bound lower, so it stays a lower bound.
    """

    def __init__(self, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
                 outside: Iterable[torch.Tensor] = ()):
        super().__init__()
        self._model = model
        self._optimizer = optimizer
        self._outside = _LiveStorages([*model.parameters(), *model.buffers(), *outside])
        self._pinned = _LiveStorages()
        self._stepped = False  # an optimizer step has run: its parameters were written in place
        self._hooks = []
        # per address written since the model's forward started: the written storage (held weakly) and its last
        # writer, shared by every storage that op wrote
        self._last_writer: Dict[int, Tuple[StorageWeakRef, _Writer]] = {}
        self.required_bytes = 0
        self.at_op = ""           # the op at which the maximum was reached
        self.pinned_at_max = 0    # of required_bytes, the undroppable part
        self.op_bytes = 0         # max over ops of the bytes of the storages the op reads and writes
        self.kernel_bytes_at_max = 0  # of required_bytes, what the kernel held beyond its outputs
        self.ops = 0
        self._arena = False       # remat was enabled at __enter__: each op's kernel buffers are measured
        # The fourth constraint: which parameters (a bit each, by address) each storage written since the model's
        # forward started was computed from; at a step's start, the live ones computed from a parameter it writes
        # (kept: {address: (bytes, storage)}); after it, those the program reads (needed) beside what stayed pinned.
        self._parameter_bits: Dict[int, int] = {}
        self._computed_from: Dict[int, Tuple[StorageWeakRef, int, int]] = {}  # (storage, bits, bytes)
        self._kept: Dict[int, Tuple[int, StorageWeakRef]] = {}
        self._kept_needed: Dict[int, int] = {}
        self._pinned_after_step = 0
        self._watching_kept = False

    def _counted(self, t: Optional[torch.Tensor]):
        """The storages of t that hold memory and are not outside."""
        if isinstance(t, torch.Tensor):
            for storage in _storages(t):
                if storage.nbytes() > 0 and storage.data_ptr() not in self._outside:
                    yield storage

    def _pin(self, t: Optional[torch.Tensor]) -> None:
        for storage in self._counted(t):
            self._pinned.add(storage)

    def _pin_state(self, *_) -> None:
        self._pinned.clear()
        self._last_writer.clear()  # a forward starts (or a step ended): the gradients to come are not made yet
        self._computed_from.clear()
        self._parameter_bits = self._bits_of_parameters()
        if self._optimizer is not None:
            for t in optimizer_state_tensors(self._optimizer):
                self._pin(t)
            if self._stepped:  # a parameter the program made under remat cannot be recomputed once stepped
                for group in getattr(self._optimizer, "param_groups", []):
                    for p in group["params"]:
                        self._pin(p)

    def _bits_of_parameters(self) -> Dict[int, int]:
        """{address: a bit of its own} of the model's parameters' storages. Inside a torch.func transform
        (functional_call under grad or vmap) the forward's parameters are wrappers with no storage to tell: none then,
        which only loosens the fourth constraint."""
        return {storage.data_ptr(): 1 << k for k, p in enumerate(self._model.parameters())
                if not is_functorch_wrapped_tensor(p) for storage in _storages(p)}

    def _pin_gradients(self, *_) -> None:
        for p in self._model.parameters():
            self._pin(p.grad)

    def _before_step(self, optimizer=None, *_) -> None:
        self._bound_kept_results()
        self._pin_gradients()
        self._bound_gradient_order()
        self._note_kept_results(optimizer if optimizer is not None else self._optimizer)

    def _bound_gradient_order(self) -> None:
        """The gradients' constraint of the module docstring, at the start of a step."""
        gradients = {storage.data_ptr(): storage for p in self._model.parameters() for storage in self._counted(p.grad)}
        if not gradients:
            return
        pinned = self._pinned.live_sizes()  # the state, the stepped parameters and the gradients
        state = sum(nbytes for ptr, nbytes in pinned.items() if ptr not in gradients)
        # per op that last wrote gradients: [bytes of its gradients, the most it holds besides the state and the
        # other gradients, its name]
        makers: Dict[int, list] = {}
        for ptr, storage in gradients.items():
            writer = self._writer_of(ptr, storage)
            if writer is None:  # made where we did not look: it costs its own bytes
                makers[-ptr] = [storage.nbytes(), storage.nbytes(), "an op made outside the measurement"]
                continue
            if id(writer) not in makers:
                reads = sum(nbytes for address, nbytes in writer.inputs.items()
                            if address not in gradients and address not in pinned)
                makers[id(writer)] = [0, reads + max(sum(writer.outputs.values()), writer.held), writer.op]
            makers[id(writer)][0] += storage.nbytes()
        made = worst = 0
        worst_op = ""
        for kept, holds, op in sorted(makers.values(), key=lambda m: m[1] - m[0], reverse=True):
            if made + holds > worst:
                worst, worst_op = made + holds, op
            made += kept
        if state + worst > self.required_bytes:
            self.required_bytes = state + worst
            self.at_op = f"{worst_op} (making a gradient beside those made before it, in the best order)"
            self.pinned_at_max = state
            self.kernel_bytes_at_max = 0

    def _after_step(self, *_) -> None:
        self._stepped = True
        self._pin_state()
        self._pin_gradients()
        self._pinned_after_step = sum(self._pinned.live_sizes().values())
        self._watching_kept = bool(self._kept)

    def _note_kept_results(self, optimizer) -> None:
        """At a step's start: the live storages computed from a parameter the step writes (one with a gradient in
        the optimizer's groups), not pinned already."""
        written = 0
        for group in getattr(optimizer, "param_groups", []):
            for p in group["params"]:
                if p.grad is not None:
                    for storage in _storages(p):
                        written |= self._parameter_bits.get(storage.data_ptr(), 0)
        pinned = self._pinned.live_sizes()
        self._kept = {ptr: (nbytes, ref) for ptr, (ref, bits, nbytes) in self._computed_from.items()
                      if bits & written and ptr not in pinned and not ref.expired()}
        self._kept_needed.clear()
        self._watching_kept = False

    def _bound_kept_results(self) -> None:
        """The fourth constraint, once the reads after the last step are known (at the next step or the end)."""
        if self._kept_needed:
            required = self._pinned_after_step + sum(self._kept_needed.values())
            if required > self.required_bytes:
                self.required_bytes = required
                self.at_op = (f"the end of an optimizer step ({len(self._kept_needed)} results computed from the "
                              f"parameters' old values and read after it, beside the gradients and the state)")
                self.pinned_at_max = required
                self.kernel_bytes_at_max = 0
        self._kept.clear()
        self._kept_needed.clear()
        self._watching_kept = False

    def __enter__(self):
        if not isinstance(self._model, torch.jit.ScriptModule):  # a ScriptModule takes no hooks; the step's suffice
            self._hooks.append(self._model.register_forward_pre_hook(self._pin_state))
        if self._optimizer is not None:
            try:
                self._hooks.append(self._optimizer.register_step_pre_hook(self._before_step))
                self._hooks.append(self._optimizer.register_step_post_hook(self._after_step))
            except AttributeError:  # a wrapper that skips Optimizer.__init__ (opacus' DPOptimizer): its inner
                # optimizer's step runs the hooks registered for every optimizer
                self._hooks.append(register_optimizer_step_pre_hook(self._before_step))
                self._hooks.append(register_optimizer_step_post_hook(self._after_step))
        self._pin_state()
        self._arena = bool(torch.ops.remat.is_enabled())
        return super().__enter__()

    def __exit__(self, *exc):
        self._bound_kept_results()
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._arena:
            allocated_before = torch.ops.remat.stats()["allocated_bytes"]
            torch.ops.remat.reset_peak()
        out = func(*args, **kwargs)
        # the most the op held at once beyond what existed before it: outputs and the kernel's own buffers
        held = torch.ops.remat.stats()["peak_allocated_bytes"] - allocated_before if self._arena else 0
        self.ops += 1
        pinned = self._pinned.live_sizes()
        seen = set()
        inputs = self._own_storages((args, kwargs), seen)
        outputs = self._own_storages(out, seen)  # the new ones: an output that is an input was seen there
        in_sizes = {ptr: storage.nbytes() for ptr, storage in inputs.items()}
        out_sizes = {ptr: storage.nbytes() for ptr, storage in outputs.items()}
        own_in, own_out = sum(in_sizes.values()), sum(out_sizes.values())
        extra_in = sum(nbytes for ptr, nbytes in in_sizes.items() if ptr not in pinned)
        extra_out = sum(nbytes for ptr, nbytes in out_sizes.items() if ptr not in pinned)
        self.op_bytes = max(self.op_bytes, own_in + max(own_out, held))
        required = sum(pinned.values()) + extra_in + max(extra_out, held)
        if required > self.required_bytes:
            self.required_bytes = required
            self.at_op = str(func)
            self.pinned_at_max = sum(pinned.values())
            self.kernel_bytes_at_max = max(0, held - extra_out)
        self._bound_last_input(func, inputs, in_sizes, pinned)
        touched = {ptr: StorageWeakRef(storage) for ptr, storage in (*inputs.items(), *outputs.items())}
        writer = _Writer(str(func), in_sizes, out_sizes, held, required, sum(pinned.values()), touched)
        written = self._note_writer(func, args, kwargs, inputs, outputs, writer)
        self._note_computed_from(func, args, kwargs, inputs, written)
        return out

    def _note_computed_from(self, func, args, kwargs, inputs: Dict[int, torch.UntypedStorage],
                            written: Dict[int, torch.UntypedStorage]) -> None:
        """The parameters each written storage was computed from: those the op read (directly, or through what it
        read); and, after a step, which kept results the op reads (a view reads no bytes, detach's; an argument the op
        writes may not be read either, zero_'s or an out= argument's: neither counts)."""
        bits = 0
        for t in tree_flatten((args, kwargs))[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                for storage in _storages(t):
                    ptr = storage.data_ptr()
                    bits |= self._parameter_bits.get(ptr, 0)
                    entry = self._computed_from.get(ptr)
                    if entry is not None and _still(entry[0], storage):
                        bits |= entry[1]
        if self._watching_kept and not getattr(func, "is_view", False):
            for ptr, storage in inputs.items():
                kept = self._kept.get(ptr)
                if kept is not None and ptr not in written and _still(kept[1], storage):
                    self._kept_needed[ptr] = kept[0]
        if bits:
            for ptr, storage in written.items():
                previous = self._computed_from.get(ptr)
                inherited = previous[1] if previous is not None and _still(previous[0], storage) else 0
                self._computed_from[ptr] = (StorageWeakRef(storage), bits | inherited, storage.nbytes())

    def _bound_last_input(self, func, inputs: Dict[int, torch.UntypedStorage], in_sizes: Dict[int, int],
                          pinned: Dict[int, int]) -> None:
        """The inputs' constraint of the module docstring, before the op runs: of its inputs, the one made
        last was made beside the others."""
        if len(in_sizes) < 2:
            return
        least = None
        for ptr, storage in inputs.items():
            writer = self._writer_of(ptr, storage)
            if writer is None:
                if ptr in pinned:  # undroppable, made before the window began: not the last one made
                    continue
                return  # droppable and made where we did not look: it may be the last, at no cost we know
            others = sum(nbytes for address, nbytes in in_sizes.items()
                         if address != ptr and address not in pinned and not writer.touched(address))
            if least is None or writer.required + others < least[0]:
                least = (writer.required + others, writer)
        if least is not None and least[0] > self.required_bytes:
            self.required_bytes = least[0]
            self.at_op = f"{func} (its input made last, by {least[1].op}, made beside its other inputs)"
            self.pinned_at_max = least[1].pinned
            self.kernel_bytes_at_max = 0

    def _writer_of(self, ptr: int, storage: torch.UntypedStorage) -> Optional["_Writer"]:
        """The op that last wrote this storage since the window began (the model's forward, or the end of a step),
        or None."""
        entry = self._last_writer.get(ptr)
        if entry is None or not _still(entry[0], storage):
            return None
        return entry[1]

    def _own_storages(self, tree, seen) -> Dict[int, torch.UntypedStorage]:
        """{address: storage} of tree's tensors' storages not yet seen and not outside; adds them to seen."""
        storages = {}
        for t in tree_flatten(tree)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                for storage in _storages(t):
                    ptr = storage.data_ptr()
                    if ptr not in seen and ptr not in self._outside:
                        seen.add(ptr)
                        storages[ptr] = storage
        return storages

    def _note_writer(self, func, args, kwargs, inputs, outputs,
                     writer: "_Writer") -> Dict[int, torch.UntypedStorage]:
        """Records the op as the last writer of its new outputs and of the inputs its schema says it writes (an
        output that is a view of an input, detach's, writes nothing). Returns what it wrote, by address."""
        written = dict(outputs)
        schema = getattr(func, "_schema", None)
        for k, argument in enumerate(schema.arguments if schema is not None else ()):
            if argument.alias_info is not None and argument.alias_info.is_write:
                value = args[k] if k < len(args) else kwargs.get(argument.name)
                for t in tree_flatten(value)[0]:
                    if isinstance(t, torch.Tensor) and t.device.type != "meta":
                        written.update((s.data_ptr(), inputs[s.data_ptr()]) for s in _storages(t)
                                       if s.data_ptr() in inputs)
        for ptr, storage in written.items():
            self._last_writer[ptr] = (StorageWeakRef(storage), writer)
        return written


class _Writer(NamedTuple):
    """An op as the last writer of storages: what it read and made (outside storages left out), the most its kernel
    held at once beyond what existed before it (0 when not measured under remat), and what it required when it ran
    (the undroppable bytes then, its other inputs and its outputs or kernel buffers)."""
    op: str
    inputs: Dict[int, int]   # {address: bytes}
    outputs: Dict[int, int]  # the new ones
    held: int
    required: int
    pinned: int  # of required, the undroppable bytes
    storages: Dict[int, StorageWeakRef]  # what it read and made, by address

    def touched(self, ptr: int) -> bool:
        """The live storage at this address is one the op read or made (not a later one placed where it died)."""
        ref = self.storages.get(ptr)
        return ref is not None and not ref.expired()
