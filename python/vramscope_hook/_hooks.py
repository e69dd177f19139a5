"""Hooks into PyTorch, telling vramscope's core where each phase and step begins and what
each tensor is, with no change to the user's script:

- the outermost module call starts the forward phase; every module's call is its scope
  (`layers.3.attn`, the job's own qualified names), followed by wrapping
  `nn.Module.__call__` rather than with torch's global module hooks, which would send
  every module call down torch's slower path;
- `torch.autograd.backward` (which `loss.backward()` calls) is the backward phase, after
  which gradients are named by their parameters;
- an optimizer's step is the optimizer phase, after which its state is named
  (`exp_avg of layers.0.attn.q_proj.weight`), and its end ends the step;
- `zero_grad` is its own phase.

Parameters are named when their model first runs forward. Categories follow the engine's
rules: what forward makes and keeps is an activation, what dies in its phase a temporary.
"""

import math
import operator
import sys
import threading
import time
import weakref
from array import array
from itertools import chain

from ._native import slots

OTHER, FORWARD, BACKWARD, OPTIMIZER, ZERO_GRAD = range(5)
PARAMETER, OPTIMIZER_STATE, INPUT, TEMPORARY, ACTIVATION, GRADIENT, AUTOGRAD_DETAIL, UNKNOWN = range(8)
_VALUES = operator.methodcaller("values")  # a mapping's values, called from C

# Wrappers whose own name is not part of the job's module names: the attribute that holds
# the model they wrap. torch.compile's OptimizedModule is one.
_WRAPPERS = {"DistributedDataParallel": "module", "DataParallel": "module", "FullyShardedDataParallel": "module", "OptimizedModule": "_orig_mod"}


def _storage_ptr(t):
    """The address the allocator handed out for `t`'s memory: what the capture saw."""
    try:
        return t.untyped_storage().data_ptr()
    except (AttributeError, RuntimeError):
        return t.data_ptr()


def _compiling(torch):
    """torch.compiler.is_compiling (torch 2.3 on): true while dynamo traces."""
    compiler = getattr(torch, "compiler", None)
    return getattr(compiler, "is_compiling", None) or (lambda: False)


class _PerThread(threading.local):
    """Each thread's stack of module scopes, there from its first use."""

    def __init__(self):
        self.stack = []


class Hooks:
    def __init__(self, torch, shim, core):
        self.torch = torch
        self.shim = shim
        # The shim's scope and phase, written in place: a call through ctypes at every
        # module's forward and return and every boundary cost the job's thread 3 µs each
        # inside a step (issue 35).
        self._scope_slot, self._phase_slot, self._tag_slot = slots(shim)
        self.core = core
        self.local = _PerThread()
        self.names = {}  # id(module) -> qualified name
        self.scope_ids = {}  # name -> interned id
        self._scopes = {}  # id(module) -> (scope id, name)
        self.params = {}  # id(param) -> (weakref, name, its gradient's name interned)
        self._first_param = None  # a weakref to the model's first parameter: its dtype
        self.phase = OTHER
        # The first step's clock starts at its first phase: what came before (torch's
        # import, building the model, CUDA's start-up) is no step's.
        self.step_started = None
        self.backward_ran = False
        # Backward calls under way: a module's forward inside one is activation
        # checkpointing's recompute, which belongs to backward, not a new forward pass.
        self.backward_depth = 0
        # The precision knob's value once asked (None: to be asked; False: settled), asked
        # again where a step's end says a knob changed.
        self._cast_checked = None
        # id of a state tensor tagged -> (weakref to it, its data's address then): AdamW's
        # moments are the same tensors step after step, and are named once.
        self._tagged = {}
        self._tagged_pruned = 0  # how many were kept when dead ones last went
        # id(optimizer) -> (weakref to it, the ids of its state's values, steps to the next
        # look at their storage): naming its state looks at every tensor's storage, which cost
        # the job's thread 40 µs a step for a small MLP's AdamW (issue 35), where comparing
        # which objects its state holds finds what a checkpoint loaded or an optimizer that
        # makes new tensors puts there. Every 16th step, the storage (`.data` swapped).
        self._state_seen = {}
        # Gradients are named at the optimizer's start once an optimizer is seen; before
        # that (a script that updates parameters itself), after each step's first backward.
        self._optimizer_seen = False
        self.autocast = None  # the dtype of the autocast region the model's forward ran in
        self._autocast_read = False  # read at the model's first forward of the step
        # GradScaler.scale's outputs this step (by id) and the losses they scaled.
        self._scaled = {}
        # This step's samples (every micro-batch the model ran) and sequence length (0: its
        # inputs have none).
        self.samples = 0
        self.ctx = 0
        self.model = None  # id of the module whose forwards count samples
        self.losses = []  # each backward's loss this step (micro-steps), read; None where unread
        self.given_loss = None  # the step's loss as the script read it (`vramscope_hook.loss`)
        self.knob_values = None  # set by the package: name -> current value getter
        self.stop_requested = False  # the viewer that started the job asked it to end
        self.history = None  # CUDA memory from PyTorch's history (`_history`), where used
        self._originals = []
        self._handles = []
        self.on_unhook = None  # set by the package: takes the hook out of the job
        # Whether the step in progress began under the hook (not so when it came mid-step).
        self.began = True
        # What an attach leaves for the job's own thread, run at its next forward, optimizer
        # step or step end (`_catch_up`).
        self.on_job_thread = None
        # Precision by key for a script that does not choose it (`precision_knob`): the
        # autocast region the hook holds open from the model's forward to backward.
        self.precision_knob = None  # set by the package: () -> "fp32", "bf16", or None: the script's
        self._cast = None
        self.script_autocast = False  # the script runs under its own autocast
        self.cast_refused = set()  # (device type, precision) autocast refused, said once each
        self.note = None  # set by the package: a line for the screen's event log
        # The model's forward whose batch was not in its positional arguments: counted from
        # its keyword arguments (input_ids, ...) when it returns.
        self._uncounted = None
        self._input_word = None  # the tag word's category and name bits for an input
        self._any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None)
        self._precisions = {torch.bfloat16: 1, torch.float16: 2}  # vsh_step_end's numbering

    # -- phases and scopes -------------------------------------------------------------

    def set_phase(self, phase):
        if phase == self.phase:
            return
        if self.step_started is None:
            self.step_started = time.perf_counter()
        if self._phase_slot[0] != 0xFF:
            self._phase_slot[0] = phase  # the modelled CPU: the shim records it in band
        else:
            self.read_history()
            self.core.vsh_phase(phase)
        self.phase = phase

    def read_history(self):
        """Hands the core the history's entries of the phase that ends now."""
        if self.history is None:
            return
        try:
            self.history.read()
        except Exception as e:  # never break the job
            print(f"vramscope_hook: stopped reading PyTorch's memory history: {e}", file=sys.stderr)
            self.history = None

    def _scope_id(self, name):
        sid = self.scope_ids.get(name)
        if sid is None:
            sid = self.scope_ids[name] = self.core.vsh_intern(name.encode())
        return sid

    def _name_of(self, module, stack):
        name = self.names.get(id(module))
        if name is None:
            if not stack:
                self._adopt(module)
                name = self.names.get(id(module), "")
            else:
                # A module its model does not list (made on the fly): under its caller.
                parent = stack[-1][1]
                name = f"{parent}.{type(module).__name__}" if parent else type(module).__name__
                self.names[id(module)] = name
        return name

    def _adopt(self, root):
        """Names a model's modules and parameters as the job names them."""
        # Wrappers nest (DDP around a compiled model, or the other way round).
        strip, inner = "", root
        while type(inner).__name__ in _WRAPPERS and hasattr(inner, _WRAPPERS[type(inner).__name__]):
            attr = _WRAPPERS[type(inner).__name__]
            strip, inner = f"{strip}{attr}.", getattr(inner, attr)

        def own(n):
            if strip.startswith(n + "."):  # a wrapper inside the outermost one
                return ""
            return n.removeprefix(strip)

        for n, m in root.named_modules():
            self.names.setdefault(id(m), own(n))
        for n, p in root.named_parameters():
            self.params[id(p)] = (weakref.ref(p), own(n), self.core.vsh_intern(f"grad of {own(n)}".encode()))
            if self._first_param is None or self._first_param() is None:
                self._first_param = weakref.ref(p)
            self.core.vsh_tag(_storage_ptr(p), PARAMETER, own(n).encode())
        total = sum(p().numel() for p, _, _ in self.params.values() if p() is not None)
        self.core.vsh_set_parameters(total)

    def _module_call(self, original):
        """`nn.Module.__call__`, wrapped: each module's forward is its scope. Torch's global
        module hooks would send every module call down its slower call path (6 µs a call
        on this machine's dense job, issue 35); a wrapper of the call costs under 2."""
        hooks = self
        local = self.local
        scopes = self._scopes
        slot = self._scope_slot
        compiling = _compiling(self.torch)
        modules = sys.modules

        def call(module, *args, **kwargs):
            # Dynamo traces module calls inside a compiled region, and this wrapper's writes
            # would break its graph at every module. It reads `compiling()` as a constant:
            # there the wrapper is only the call, and the compiled region is one scope.
            # Asked only once dynamo is loaded: the question is two Python calls at every
            # module call (issue 35). torch.compile loads it, and so does making a
            # torch.optim optimizer (torch 2.13): a job without either (inference, its own
            # update) does not ask it.
            if "torch._dynamo" in modules and compiling():
                return original(module, *args, **kwargs)
            stack = local.stack
            outermost = not stack and not hooks.backward_depth
            if outermost:
                hooks._outermost(module, args)
            scope = scopes.get(id(module))
            if scope is None:
                name = hooks._name_of(module, stack)
                scope = scopes[id(module)] = (hooks._scope_id(name), name)
            stack.append(scope)
            slot[0] = scope[0]
            try:
                return original(module, *args, **kwargs)
            finally:
                # Also when forward raises (an OOM): scopes stay balanced.
                if stack:
                    stack.pop()
                slot[0] = stack[-1][0] if stack else 0
                if outermost and hooks._uncounted == id(module):
                    hooks._uncounted = None
                    for key in ("input_ids", "inputs_embeds", "labels"):
                        if hooks._count(kwargs.get(key)):
                            break

        return call

    def _count(self, a):
        """Counts a model input's samples and, where it has one, its sequence length."""
        if not isinstance(a, self.torch.Tensor):
            return False
        shape = a.shape
        if not shape:
            return False
        self.samples += shape[0]
        # A sequence length only where there is one: token ids [batch, seq] or embeddings
        # [batch, seq, d]; an MLP's [batch, features] has none.
        if len(shape) == 3 or (len(shape) == 2 and not a.is_floating_point()):
            self.ctx = shape[1]
        return True

    def _catch_up(self):
        """Runs what the attach left for the job's thread, once. A failure is said on the
        screen, never raised into the job."""
        work, self.on_job_thread = self.on_job_thread, None
        try:
            work()
        except Exception as e:
            self.note(f"attached, but what the job held before could not be learned: {type(e).__name__}: {e}")

    def _outermost(self, module, args):
        if self.on_job_thread is not None:
            self._catch_up()
        torch = self.torch
        self.set_phase(FORWARD)
        # The model's forwards count samples (each micro-batch of gradient accumulation); a
        # loss module called at top level does not. The model is the first top-level module
        # with parameters.
        if self.model is None and next(module.parameters(), None) is not None:
            self.model = id(module)
        counted = id(module) != self.model
        for a in args:
            if isinstance(a, torch.Tensor):
                if not counted:
                    counted = self._count(a)
                # Data, not what a model computed: a loss module called at top level is
                # handed the model's logits (an activation) beside its labels.
                if a.grad_fn is None:
                    self._tag_input(_storage_ptr(a))
        if not counted:
            # Hugging Face models take their batch as keyword arguments.
            self._uncounted = id(module)
        # The model's forward tells the step's precision: a loss module called at top level
        # after it, outside the autocast region as many scripts call it, does not.
        if not self._autocast_read and (id(module) == self.model or self.model is None):
            self.autocast = self._autocast_dtype()
            self._autocast_read = id(module) == self.model
        if id(module) == self.model and self._cast_checked is not False:
            self._cast_for(module)

    def _tag_input(self, addr):
        """Names an input: in the shim's tag word where phases are in place and the word
        is free (a call through ctypes cost the job's thread 8 µs here, issue 35), else by a
        call."""
        if self._input_word is None:
            self._input_word = (INPUT << 48) | (self._scope_id("input") << 52)
        slot = self._tag_slot
        if self._phase_slot[0] != 0xFF and slot[0] == 0 and addr < 1 << 48 and self._input_word < 1 << 64:
            slot[0] = self._input_word | addr
        else:
            self.core.vsh_tag(addr, INPUT, b"input")

    def _autocast_dtype(self):
        """The dtype of the autocast region the model's forward runs in, or None."""
        torch = self.torch
        # One call where no region is open anywhere (most steps of most jobs), against
        # one a device type (issue 35); torch before 2.3 has no such call.
        if self._any_autocast is not None and not self._any_autocast():
            return None
        for device_type in ("cuda", "cpu"):
            if self._autocast_on(device_type):
                try:
                    return torch.get_autocast_dtype(device_type)
                except AttributeError:  # before 2.4: one function per device
                    return torch.get_autocast_cpu_dtype() if device_type == "cpu" else torch.get_autocast_gpu_dtype()
        return None

    def _autocast_on(self, device_type):
        torch = self.torch
        try:
            return torch.is_autocast_enabled(device_type)
        except TypeError:  # before 2.4: one function per device
            return torch.is_autocast_cpu_enabled() if device_type == "cpu" else torch.is_autocast_enabled()
        except RuntimeError:  # a device autocast does not know (meta): never on there
            return False

    def _cast_for(self, model):
        """Precision by key: under bf16, the model's forward (and the loss computed from it
        in this step) runs in the hook's autocast region, closed before backward; a script
        under its own autocast owns its precision, and is said so once."""
        # The knob is asked once, and again only where a viewer changed a knob, and once fp32
        # or the script's own autocast is found, forwards have nothing to do: asking at each
        # step, or each micro-batch's forward, cost the job's thread (issue 35).
        if self._cast_checked is None:
            knob = self.precision_knob() if self.precision_knob is not None else None
            self._cast_checked = knob
        want = self._cast_checked
        if not want or self._cast is not None:
            return  # the script chooses its precision (a knob of its own), settled, or the region is open
        if self.autocast is not None:  # read as this forward began: the script's own region
            if not self.script_autocast and self.note is not None:
                self.note("the script runs under its own autocast: it owns its precision, and p does not change it")
            self.script_autocast = True
            self._cast_checked = False
            return
        # fp16 by key is autocast alone: a GradScaler is the script's to make.
        dtype = {"bf16": self.torch.bfloat16, "fp16": self.torch.float16}.get(want)
        if dtype is None:  # fp32: nothing to open (finding the model's device cost 40 µs a step)
            self._cast_checked = False
            return
        param = next(model.parameters(), None)
        device_type = param.device.type if param is not None else "cpu"
        try:
            cast = self.torch.autocast(device_type, dtype=dtype)
            cast.__enter__()
        except RuntimeError as e:  # no autocast on this device: the step runs as it is
            if self.note is not None and (device_type, want) not in self.cast_refused:
                self.note(f"no {want} autocast on {device_type}: {str(e).splitlines()[0][:200]}")
            self.cast_refused.add((device_type, want))
            self._cast_checked = False
            return
        self._cast = cast
        self.autocast = dtype

    def _close_cast(self):
        if self._cast is not None:
            cast, self._cast = self._cast, None
            cast.__exit__(None, None, None)

    # -- backward, optimizer, zero_grad ----------------------------------------------------

    def _tag(self, t, category, name):
        """Names what `t` holds (`name`, bytes) unless this very tensor was named where it is
        already: a tag and even asking for its storage cost the job's thread (issue 35)."""
        seen = self._tagged.get(id(t))
        ptr = t.data_ptr()
        if seen is not None and seen[0]() is t and seen[1] == ptr:
            return
        self._tagged[id(t)] = (weakref.ref(t), ptr)
        self.core.vsh_tag(_storage_ptr(t), category, name)

    def _name_grads(self):
        """Names every gradient, in one call: most are new each step (`zero_grad` sets them
        to None), and the core passes over a name an allocation has already, where keeping
        a table of those named cost the job's thread more (issue 35). By its own address:
        a gradient that is a view into a bigger block (DDP's buckets) names that block only
        where it begins it."""
        addrs, names = array("Q"), array("I")
        for ref, _, grad_name in self.params.values():
            p = ref()
            g = p.grad if p is not None else None
            if g is not None:
                addrs.append(g.data_ptr())
                names.append(grad_name)
        if addrs:
            self.core.vsh_tag_many(GRADIENT, addrs.buffer_info()[0], names.buffer_info()[0], len(addrs))

    def _backward(self, original):
        def backward(tensors, *args, **kwargs):
            self.local.stack.clear()
            self._scope_slot[0] = 0
            # Backward never runs in the hook's autocast region (as torch.autocast advises).
            if self._cast is not None:
                self._close_cast()
            self.set_phase(BACKWARD)
            # Later micro-batches accumulate into the gradients the first one made, and the
            # optimizer's start names any new ones: naming after each backward cost the
            # job's thread (issue 35).
            first = not self.backward_ran and not self._optimizer_seen
            self.backward_ran = True
            if isinstance(tensors, self.torch.Tensor) and tensors.numel() == 1:
                # A GradScaler's scaled loss stands for the loss it scaled: its value is the
                # step's loss, and the hook keeps no hold on the scaled tensor. (Not `or`:
                # a CUDA tensor's truth would wait for the GPU.) A CPU loss is read here (one
                # call, and no tensor kept to the step's end); another device's is never
                # read (None).
                loss = self._scaled.pop(id(tensors), None) if self._scaled else None
                loss = tensors if loss is None else loss
                self.losses.append(loss.item() if loss.is_cpu else None)
            self.backward_depth += 1
            try:
                return original(tensors, *args, **kwargs)
            finally:
                self.backward_depth -= 1
                if first:
                    self._name_grads()

        return backward

    def _opt_pre(self, optimizer, args, kwargs):
        if self.on_job_thread is not None:
            self._catch_up()
        self.local.stack.clear()
        self._scope_slot[0] = 0
        self._optimizer_seen = True
        self._name_grads()
        self.set_phase(OPTIMIZER)

    def _opt_post(self, optimizer, args, kwargs):
        ref, ids, rest = self._state_seen.get(id(optimizer), (None, None, 0))
        # The ids of every value its state holds, listed in C: a comprehension ran some
        # 200 bytecodes a step for AdamW on six parameters (issue 35).
        now = list(map(id, chain.from_iterable(map(_VALUES, optimizer.state.values()))))
        if ref is None or ref() is not optimizer or ids != now or not rest:
            ref, rest = weakref.ref(optimizer), 16
            self._name_state(optimizer)
        self._state_seen[id(optimizer)] = (ref, now, rest - 1)
        self.end_step()

    def _name_state(self, optimizer):
        tensor = self.torch.Tensor
        for group in optimizer.param_groups:
            for p in group["params"]:
                state = optimizer.state.get(p)
                if not state:
                    continue
                name = self.params.get(id(p), (None, "a parameter"))[1] or "a parameter"
                for key, v in state.items():
                    if isinstance(v, tensor) and v.numel() > 1:
                        self._tag(v, OPTIMIZER_STATE, f"{key} of {name}".encode())

    def _zero_grad(self, original):
        def zero_grad(obj, *args, **kwargs):
            self.set_phase(ZERO_GRAD)
            return original(obj, *args, **kwargs)

        return zero_grad

    def _scaler_scale(self, original):
        def scale(scaler, outputs, *args, **kwargs):
            scaled = original(scaler, outputs, *args, **kwargs)
            if isinstance(outputs, self.torch.Tensor) and outputs.numel() == 1:
                self._scaled[id(scaled)] = outputs.detach()
            return scaled

        return scale

    def _scaler_update(self, original):
        def update(scaler, *args, **kwargs):
            try:
                return original(scaler, *args, **kwargs)
            finally:
                for attr in ("_scale", "_growth_tracker"):
                    t = getattr(scaler, attr, None)
                    if isinstance(t, self.torch.Tensor):
                        self.core.vsh_tag(_storage_ptr(t), OPTIMIZER_STATE, f"GradScaler.{attr}".encode())
                # GradScaler skipped optimizer.step (a gradient held an inf or NaN): the
                # step ends here instead.
                if self.backward_ran:
                    self.end_step()

        return update

    def end_step(self, loss=None):
        """Closes a step: the core reports it and applies viewers' controls (waiting here
        while paused)."""
        if self.on_job_thread is not None:
            self._catch_up()
        torch = self.torch
        now = time.perf_counter()
        if not self.began:
            # The step was under way when the hook came (`vramscope attach --pid`): not a
            # whole step, so not reported; what it did counts towards the next one.
            self.began = True
            self.phase, self.backward_ran, self.samples, self.ctx = OTHER, False, 0, 0
            self._autocast_read = False
            self.losses, self.given_loss = [], None
            self._scaled.clear()
            self.core.vsh_phase(OTHER)
            self.step_started = time.perf_counter()
            return
        self._close_cast()
        # Names of tensors that died go (their addresses will hold others), once they are
        # as many as those kept: an optimizer that makes new state adds some every step.
        if len(self._tagged) > 2 * self._tagged_pruned + 16:
            self._tagged = {k: seen for k, seen in self._tagged.items() if seen[0]() is not None}
            self._tagged_pruned = len(self._tagged)
        self._autocast_read = False
        # The step's loss: the given one, else what its backwards were called on, summed
        # over micro-steps (a script that accumulates gradients divides each by their
        # number, so the sum is the step's mean). Reading a CUDA loss would wait for the
        # GPU: only CPU ones are read (a backward's unread loss is None).
        losses = [loss] if loss is not None else [self.given_loss] if self.given_loss is not None else self.losses
        if losses is self.losses:  # each backward's loss as `item()` gave it, or None (unread)
            read = bool(losses) and None not in losses
        else:
            read = all(isinstance(x, (int, float)) or (isinstance(x, torch.Tensor) and x.is_cpu) for x in losses)
        try:
            value = sum(map(float, losses)) if read else math.nan
        except TypeError:  # a complex loss (its backward failed): no value, never an error here
            read, value = False, math.nan
        batch, ctx = self.samples, self.ctx
        if self.knob_values is not None:
            ctx = int(self.knob_values("ctx", ctx))
            batch = int(self.knob_values("batch", batch))
        # The precision: the forward's autocast dtype, else the parameters' own.
        first = self._first_param() if self._first_param is not None else None
        dtype = self.autocast or (first.dtype if first is not None else None)
        precision = self._precisions.get(dtype, 0)
        if self.history is not None:
            self.read_history()
        rc = self.core.vsh_step_end(value, 1 if read else 0, now - (self.step_started or now), ctx, batch, 1 if self.backward_ran else 0, precision)
        stop = rc & 3 if rc > 0 else 0
        if rc > 0 and rc & 4:
            self._cast_checked = None  # a knob changed: precision is asked again
        self.stop_requested |= stop == 1
        self.phase = OTHER
        self.backward_ran = False
        self.losses = []
        self.given_loss = None
        self._scaled.clear()
        self.samples = 0
        self.ctx = 0
        self.step_started = time.perf_counter()
        if stop == 2 and self.on_unhook is not None:
            self.on_unhook()

    def _storage_new(self, original):
        """`torch.UntypedStorage(...)` on the CPU with the allocator libtorch hands out now:
        PyTorch asks for its default CPU allocator by name there, past the shim's, so a
        tensor's deepcopy (an EMA model, a kept copy of the weights) went unseen."""
        shim, device_type = self.shim, self.torch.device

        def new(cls, *args, **kwargs):
            device = kwargs.get("device")
            if len(args) <= 1 and kwargs.keys() <= {"device"} and (device is None or device_type(device).type == "cpu"):
                allocator = shim.vs_cpu_allocator()
                if allocator:  # torch takes an allocator or a device, not both
                    try:
                        return original(cls, *args, allocator=allocator)
                    except TypeError:  # a torch whose storage takes no allocator: as it was
                        pass
            return original(cls, *args, **kwargs)

        return new

    # -- installing ---------------------------------------------------------------------

    def install(self):
        torch = self.torch
        handles = self._handles
        self._patch(torch.nn.Module, "__call__", self._module_call)
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        handles.append(register_optimizer_step_pre_hook(self._opt_pre))
        handles.append(register_optimizer_step_post_hook(self._opt_post))
        self._patch(torch.autograd, "backward", self._backward)
        self._patch(torch.optim.Optimizer, "zero_grad", self._zero_grad)
        self._patch(torch.nn.Module, "zero_grad", self._zero_grad)
        scaler = getattr(getattr(torch, "amp", None), "GradScaler", None) or torch.cuda.amp.GradScaler
        self._patch(scaler, "scale", self._scaler_scale)
        self._patch(scaler, "update", self._scaler_update)
        self._patch(torch.UntypedStorage, "__new__", self._storage_new)

    def uninstall(self):
        """Takes every hook and patch out again: the job runs as it did before."""
        self._close_cast()
        for h in self._handles:
            h.remove()
        for owner, attr, original in reversed(self._originals):
            setattr(owner, attr, original)
        self._handles.clear()
        self._originals.clear()

    def _patch(self, owner, attr, wrap):
        original = getattr(owner, attr)
        setattr(owner, attr, wrap(original))
        self._originals.append((owner, attr, original))
