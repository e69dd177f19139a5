//! A small training run's memory snapshot, made here so the viewer's screens are tested
//! in a plain clone, without the third-party files: a two-layer character-level GPT (as
//! nanoGPT's) on one GPU, a few steps of forward, backward and Adam. Allocations carry
//! Python frames between native ones (backward's only native ones, as the autograd
//! thread records them), torch.profiler's category names, and each step's phases are
//! annotated.
//! The segments at the end hold what the trace left alive. Fixed sizes, addresses and
//! times: the same bytes on every run.

use std::collections::HashMap;
use std::path::Path;

use vramscope_core::snapshot::model::{
    Action, Annotation, AnnotationStage, Block, BlockState, Frame, Segment, SegmentType, Snapshot, StackId, StackInterner, TraceEntry,
};

/// Tokens per sequence, model width, attention heads, blocks, vocabulary.
const CTX: u64 = 256;
const WIDTH: u64 = 512;
const HEADS: u64 = 8;
const LAYERS: usize = 2;
const VOCAB: u64 = 256;
const F32: u64 = 4;
const MIB: u64 = 1 << 20;
/// 2025-01-01T00:00:00Z in µs: the trace's first entry is a little after.
const START_US: i64 = 1_735_689_600_000_000;

/// What the tests vary between runs.
#[derive(Clone, Copy, Debug)]
pub struct TrainingRun {
    pub steps: usize,
    /// Sequences per step: activations grow with it, parameters do not.
    pub batch: u64,
    /// The GPU the run used; the traces of the devices before it are empty (a run on
    /// cuda:1, or DDP rank 1).
    pub device: usize,
}

impl Default for TrainingRun {
    fn default() -> Self {
        TrainingRun { steps: 3, batch: 8, device: 0 }
    }
}

/// The files of the frames, where the machine that recorded the run had them.
const TRAIN: &str = "/home/ada/nanogpt/train.py";
const MODEL: &str = "/home/ada/nanogpt/model.py";
macro_rules! torch {
    ($file:literal) => {
        concat!("/home/ada/.venv/lib/python3.11/site-packages/torch/", $file)
    };
}

fn native(name: &str) -> Frame {
    Frame { name: name.into(), filename: "??".into(), line: 0 }
}

fn py(name: &str, filename: &str, line: i64) -> Frame {
    Frame { name: name.into(), filename: filename.into(), line }
}

fn natives(names: &[&str]) -> Vec<Frame> {
    names.iter().map(|n| native(n)).collect()
}

/// The caching allocator's own path into a new tensor: innermost in every stack.
const ALLOCATOR: [&str; 12] = [
    "torch::unwind::unwind()",
    "torch::CapturedTraceback::gather(bool, bool, bool)",
    "torch::cuda::(anonymous namespace)::gather_with_cpp()",
    "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)",
    "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**, signed char, unsigned long, CUstream_st*)",
    "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)",
    "at::TensorBase at::detail::_empty_generic<long>(c10::ArrayRef<long>, c10::Allocator*, c10::DispatchKeySet, c10::ScalarType, std::optional<c10::MemoryFormat>)",
    "at::detail::empty_generic(c10::ArrayRef<long>, c10::Allocator*, c10::DispatchKeySet, c10::ScalarType, std::optional<c10::MemoryFormat>)",
    "at::detail::empty_cuda(c10::ArrayRef<long>, c10::ScalarType, std::optional<c10::Device>, std::optional<c10::MemoryFormat>)",
    "at::detail::empty_cuda(c10::ArrayRef<long>, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat>)",
    "at::detail::empty_cuda(c10::ArrayRef<long>, c10::TensorOptions const&)",
    "at::(anonymous namespace)::create_out(c10::ArrayRef<long>, c10::ArrayRef<long>, c10::TensorOptions const&)",
];

/// The interpreter below `python train.py`'s outermost frame.
const INTERPRETER: [&str; 10] = [
    "PyEval_EvalCode",
    "run_eval_code_obj",
    "run_mod",
    "_PyRun_SimpleFileObject",
    "_PyRun_AnyFileObject",
    "Py_RunMain",
    "Py_BytesMain",
    "__libc_start_call_main",
    "__libc_start_main_impl",
    "_start",
];

/// How the autograd engine runs a graph node.
const NODE_CALL: [&str; 2] = [
    "torch::autograd::Node::operator()(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)",
    "torch::autograd::call_function(std::shared_ptr<torch::autograd::GraphTask>&, torch::autograd::Node*, torch::autograd::InputBuffer&)",
];

/// The autograd engine's thread, below every backward op.
const ENGINE: [&str; 7] = [
    "torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&, torch::autograd::Node*, torch::autograd::InputBuffer&, std::shared_ptr<torch::autograd::ReadyQueue> const&)",
    "torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)",
    "torch::autograd::Engine::thread_init(int, std::shared_ptr<torch::autograd::ReadyQueue> const&, bool)",
    "torch::autograd::python::PythonEngine::thread_init(int, std::shared_ptr<torch::autograd::ReadyQueue> const&, bool)",
    "std::thread::_State_impl<std::thread::_Invoker<std::tuple<void (torch::autograd::Engine::*)(int, std::shared_ptr<torch::autograd::ReadyQueue> const&, bool), torch::autograd::Engine*, signed char, std::shared_ptr<torch::autograd::ReadyQueue>, bool> > >::_M_run()",
    "start_thread",
    "clone3",
];

/// ATen's path for each forward op, innermost first, up to the Python binding.
const EMBEDDING: [&str; 4] = ["at::native::embedding(at::Tensor const&, at::Tensor const&, long, bool, bool)", "at::_ops::embedding::call(at::Tensor const&, at::Tensor const&, c10::SymInt, bool, bool)", "torch::autograd::THPVariable_embedding(_object*, _object*, _object*)", "cfunction_call"];
const LAYER_NORM: [&str; 4] = ["at::native::layer_norm_cuda(at::Tensor const&, c10::ArrayRef<long>, std::optional<at::Tensor> const&, std::optional<at::Tensor> const&, double)", "at::_ops::native_layer_norm::call(at::Tensor const&, c10::ArrayRef<c10::SymInt>, std::optional<at::Tensor> const&, std::optional<at::Tensor> const&, double)", "torch::autograd::THPVariable_layer_norm(_object*, _object*, _object*)", "cfunction_call"];
const LINEAR: [&str; 5] = ["at::native::structured_addmm_out_cuda::impl(at::Tensor const&, at::Tensor const&, at::Tensor const&, c10::Scalar const&, c10::Scalar const&, at::Tensor const&)", "at::_ops::addmm::call(at::Tensor const&, at::Tensor const&, at::Tensor const&, c10::Scalar const&, c10::Scalar const&)", "at::native::linear(at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&)", "torch::autograd::THPVariable_linear(_object*, _object*, _object*)", "cfunction_call"];
const MATMUL: [&str; 5] = ["at::native::bmm_out_cuda(at::Tensor const&, at::Tensor const&, at::Tensor&)", "at::_ops::bmm::call(at::Tensor const&, at::Tensor const&)", "at::native::_matmul_impl(at::Tensor&, at::Tensor const&, at::Tensor const&)", "at::native::matmul(at::Tensor const&, at::Tensor const&)", "torch::autograd::TypeError_to_NotImplemented_<&torch::autograd::THPVariable_matmul>(_object*, _object*, _object*)"];
const SOFTMAX: [&str; 4] = ["at::native::structured_softmax_cuda_out::impl(at::Tensor const&, long, bool, at::Tensor const&)", "at::_ops::_softmax::call(at::Tensor const&, long, bool)", "at::native::softmax(at::Tensor const&, long, std::optional<c10::ScalarType>)", "torch::autograd::THPVariable_softmax(_object*, _object*, _object*)"];
const GELU: [&str; 3] = ["at::native::structured_gelu_out_cuda::impl(at::Tensor const&, c10::basic_string_view<char>, at::Tensor const&)", "at::_ops::gelu::call(at::Tensor const&, c10::basic_string_view<char>)", "torch::autograd::THPVariable_gelu(_object*, _object*, _object*)"];
const ADD: [&str; 3] = ["at::native::structured_ufunc_add_CUDA::impl(at::Tensor const&, at::Tensor const&, c10::Scalar const&, at::Tensor const&)", "at::_ops::add_Tensor::call(at::Tensor const&, at::Tensor const&, c10::Scalar const&)", "torch::autograd::TypeError_to_NotImplemented_<&torch::autograd::THPVariable_add>(_object*, _object*, _object*)"];
const CROSS_ENTROPY: [&str; 5] = ["at::native::structured_log_softmax_cuda_out::impl(at::Tensor const&, long, bool, at::Tensor const&)", "at::_ops::_log_softmax::call(at::Tensor const&, long, bool)", "at::native::cross_entropy_loss_symint(at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, long, c10::SymInt, double)", "at::_ops::cross_entropy_loss::call(at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, long, c10::SymInt, double)", "torch::autograd::THPVariable_cross_entropy_loss(_object*, _object*, _object*)"];
const NLL_LOSS: [&str; 4] = ["at::native::structured_nll_loss_forward_out_cuda::impl(at::Tensor const&, at::Tensor const&, at::OptionalTensorRef, long, long, at::Tensor const&, at::Tensor const&)", "at::_ops::nll_loss_forward::call(at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, long, c10::SymInt)", "at::native::cross_entropy_loss_symint(at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, long, c10::SymInt, double)", "torch::autograd::THPVariable_cross_entropy_loss(_object*, _object*, _object*)"];
const TO_DEVICE: [&str; 4] = ["at::native::_to_copy(at::Tensor const&, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, bool, std::optional<c10::MemoryFormat>)", "at::_ops::_to_copy::call(at::Tensor const&, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, bool, std::optional<c10::MemoryFormat>)", "at::native::to(at::Tensor const&, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, bool, bool, std::optional<c10::MemoryFormat>)", "torch::autograd::THPVariable_to(_object*, _object*, _object*)"];
const ZEROS_LIKE: [&str; 3] = ["at::native::zeros_like(at::Tensor const&, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat>)", "at::_ops::zeros_like::call(at::Tensor const&, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat>)", "torch::autograd::THPVariable_zeros_like(_object*, _object*, _object*)"];
const FOREACH_SQRT: [&str; 3] = ["at::native::foreach_tensor_sqrt_cuda(c10::ArrayRef<at::Tensor>)", "at::_ops::_foreach_sqrt::call(c10::ArrayRef<at::Tensor>)", "torch::autograd::THPVariable__foreach_sqrt(_object*, _object*, _object*)"];
const ONES_LIKE: [&str; 4] = ["at::native::ones_like(at::Tensor const&, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat>)", "at::_ops::ones_like::call(at::Tensor const&, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat>)", "torch::autograd::THPVariable_ones_like(_object*, _object*, _object*)", "cfunction_call"];

/// A module's `forward` at `line`, as `module(x)` reaches it through `nn.Module.__call__`.
fn call(name: &str, filename: &str, line: i64) -> Vec<Frame> {
    vec![py(name, filename, line), py("_call_impl", torch!("nn/modules/module.py"), 1750), py("_wrapped_call_impl", torch!("nn/modules/module.py"), 1739)]
}

/// train.py's loop at `line`, and what runs it.
fn main_at(line: i64) -> Vec<Frame> {
    vec![py("main", TRAIN, line), py("<module>", TRAIN, 94)]
}

/// `GPT.forward` at `line`, called from the loop's `logits, loss = model(x, y)`.
fn gpt(line: i64) -> Vec<Frame> {
    [call("forward", MODEL, line), main_at(72)].concat()
}

/// `Block.forward` at `line` (the blocks share their code, so both layers' stacks are one).
fn block(line: i64) -> Vec<Frame> {
    [call("forward", MODEL, line), gpt(118)].concat()
}

/// `CausalSelfAttention.forward` at `line`.
fn attn(line: i64) -> Vec<Frame> {
    [call("forward", MODEL, line), block(84)].concat()
}

/// `MLP.forward` at `line`.
fn mlp(line: i64) -> Vec<Frame> {
    [call("forward", MODEL, line), block(85)].concat()
}

/// `nn.Linear`, into its own forward.
fn linear() -> Vec<Frame> {
    call("forward", torch!("nn/modules/linear.py"), 125)
}

/// `nn.LayerNorm`, into `F.layer_norm`.
fn layer_norm() -> Vec<Frame> {
    [vec![py("layer_norm", torch!("nn/functional.py"), 2910)], call("forward", torch!("nn/modules/normalization.py"), 217)].concat()
}

/// `optimizer.step()` at adam.py's `line`, into `inner`.
fn adam_step(inner: Frame, line: i64) -> Vec<Frame> {
    let optimizer = torch!("optim/optimizer.py");
    [vec![inner, py("step", torch!("optim/adam.py"), line), py("_use_grad", optimizer, 79), py("wrapper", optimizer, 485)], main_at(75)].concat()
}

/// The frames of an op run from Python: the allocator, ATen's `names`, the `python`
/// frames (each above the interpreter's frame that runs it), the interpreter.
fn op(names: &'static [&'static str], python: Vec<Frame>) -> impl FnOnce() -> Vec<Frame> {
    move || {
        let python = python.into_iter().flat_map(|f| [f, native("_PyEval_EvalFrameDefault")]);
        natives(&ALLOCATOR).into_iter().chain(natives(names)).chain(python).chain(natives(&INTERPRETER)).collect()
    }
}

/// A named tensor's block: the same one every step, as a steady loop gets the same
/// blocks back from the caching allocator.
struct Slot {
    address: u64,
    requested: u64,
    size: u64,
    stack: StackId,
    category: &'static str,
    live: bool,
}

/// A segment: its slots in address order, then space never handed out.
struct Seg {
    address: u64,
    size: u64,
    small: bool,
    used: u64,
    stack: StackId,
    slots: Vec<usize>,
}

/// Records tensors by name into a trace, and where the caching allocator put them.
struct Recorder {
    snap: Snapshot,
    interner: StackInterner,
    device: usize,
    trace: Vec<TraceEntry>,
    time_us: i64,
    /// µs between entries in the current phase.
    pace: i64,
    slots: Vec<Slot>,
    by_name: HashMap<String, usize>,
    segs: Vec<Seg>,
    /// The small and large pools' segments that take the next new block.
    open: [Option<usize>; 2],
    next_address: u64,
}

impl Recorder {
    fn new(device: usize) -> Recorder {
        let mut r = Recorder {
            snap: Snapshot::default(),
            interner: StackInterner::default(),
            device,
            trace: Vec::new(),
            time_us: START_US,
            pace: 20,
            slots: Vec::new(),
            by_name: HashMap::new(),
            segs: Vec::new(),
            open: [None, None],
            next_address: 0x7f3a_4000_0000,
        };
        // Stack 0 is the empty one: blocks and entries without frames name it.
        r.interner.stack(&mut r.snap, Vec::new());
        r
    }

    fn stack(&mut self, frames: Vec<Frame>) -> StackId {
        let ids = frames.into_iter().map(|f| self.interner.frame(&mut self.snap, f)).collect();
        self.interner.stack(&mut self.snap, ids)
    }

    fn entry(&mut self, action: Action, address: u64, size: u64, stack: StackId, category: Option<&str>) {
        self.time_us += self.pace;
        self.trace.push(TraceEntry { time_us: self.time_us, frames: stack, category: category.map(Into::into), ..TraceEntry::new(action, address, size) });
    }

    fn annotate(&mut self, name: &str, stage: AnnotationStage) {
        self.time_us += 5;
        self.snap.external_annotations.push(Annotation { name: name.into(), stage, device: self.device as i64, time_us: self.time_us });
    }

    /// A block for `name` as PyTorch's caching allocator places it: up to 1 MiB in 2 MiB
    /// segments of the small pool, up to 10 MiB in 20 MiB segments of the large pool, a
    /// segment of its own rounded to 2 MiB above that. A new segment is recorded in the
    /// trace unless the block is `before_trace`.
    fn place(&mut self, name: &str, requested: u64, category: &'static str, stack: StackId, before_trace: bool) -> usize {
        let size = requested.div_ceil(512) * 512;
        let small = size <= MIB;
        let pool = usize::from(!small);
        let fits = |s: &Seg| s.used + size <= s.size;
        let seg = match self.open[pool].filter(|&i| size <= 10 * MIB && fits(&self.segs[i])) {
            Some(i) => i,
            None => {
                let seg_size = if small { 2 * MIB } else if size <= 10 * MIB { 20 * MIB } else { size.div_ceil(2 * MIB) * 2 * MIB };
                let address = self.next_address;
                self.next_address += seg_size;
                if !before_trace {
                    self.entry(Action::SegmentAlloc, address, seg_size, stack, None);
                }
                self.segs.push(Seg { address, size: seg_size, small, used: 0, stack, slots: Vec::new() });
                let i = self.segs.len() - 1;
                if size <= 10 * MIB {
                    self.open[pool] = Some(i);
                }
                i
            }
        };
        let s = &mut self.segs[seg];
        let address = s.address + s.used;
        s.used += size;
        s.slots.push(self.slots.len());
        self.slots.push(Slot { address, requested, size, stack, category, live: false });
        self.by_name.insert(name.into(), self.slots.len() - 1);
        self.slots.len() - 1
    }

    /// Allocates `name`; its frames are asked for only the first time.
    fn alloc(&mut self, name: &str, requested: u64, category: &'static str, frames: impl FnOnce() -> Vec<Frame>) {
        let i = match self.by_name.get(name) {
            Some(&i) => i,
            None => {
                let stack = self.stack(frames());
                self.place(name, requested, category, stack, false)
            }
        };
        let s = &mut self.slots[i];
        assert!(!s.live && s.requested == requested, "{name} allocated twice");
        s.live = true;
        let (address, stack, category) = (s.address, s.stack, s.category);
        self.entry(Action::Alloc, address, requested, stack, Some(category));
    }

    fn free(&mut self, name: &str) {
        let s = &mut self.slots[self.by_name[name]];
        assert!(s.live, "{name} freed twice");
        s.live = false;
        let (address, requested, stack, category) = (s.address, s.requested, s.stack, s.category);
        self.entry(Action::FreeRequested, address, requested, stack, Some(category));
        self.entry(Action::FreeCompleted, address, requested, stack, Some(category));
    }

    /// A backward op's allocation on the autograd thread: native frames only, ATen's
    /// `path` under the graph's `node` (none where the engine sums two gradients).
    fn grad(&mut self, name: &str, requested: u64, category: &'static str, path: &[&str], node: Option<&str>) {
        let mut frames = natives(&ALLOCATOR);
        frames.extend(natives(path));
        if let Some(node) = node {
            frames.push(native(&format!("torch::autograd::generated::{node}::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)")));
            frames.extend(natives(&NODE_CALL));
        }
        frames.extend(natives(&ENGINE));
        self.alloc(name, requested, category, || frames);
    }

    /// The segments as the snapshot at the end of the trace shows them: each tensor's
    /// block active or not, neighbouring free space merged.
    fn segments(&self) -> Vec<Segment> {
        self.segs
            .iter()
            .map(|seg| {
                let mut blocks: Vec<Block> = Vec::new();
                let spans = seg.slots.iter().map(|&i| &self.slots[i]).map(|s| (s.address, s.size, s.live.then_some(s)));
                let tail = (seg.used < seg.size).then_some((seg.address + seg.used, seg.size - seg.used, None));
                for (address, size, live) in spans.chain(tail) {
                    match (live, blocks.last_mut()) {
                        (None, Some(last)) if last.state == BlockState::Inactive => last.size += size,
                        (None, _) => blocks.push(Block { address, size, requested_size: 0, state: BlockState::Inactive, frames: 0 }),
                        (Some(s), _) => blocks.push(Block { address, size, requested_size: s.requested, state: BlockState::ActiveAllocated, frames: s.stack }),
                    }
                }
                let active: Vec<&Block> = blocks.iter().filter(|b| b.state.is_active()).collect();
                let allocated = active.iter().map(|b| b.size).sum();
                Segment {
                    device: self.device as i64,
                    address: seg.address,
                    total_size: seg.size,
                    allocated_size: allocated,
                    active_size: allocated,
                    requested_size: active.iter().map(|b| b.requested_size).sum(),
                    stream: 0,
                    segment_type: if seg.small { SegmentType::Small } else { SegmentType::Large },
                    segment_pool_id: (0, 0),
                    is_expandable: false,
                    frames: seg.stack,
                    blocks,
                }
            })
            .collect()
    }
}

/// The model's parameters, in `model.parameters()` order, with their bytes.
fn parameters() -> Vec<(String, u64)> {
    let mut p = vec![("wte.weight".to_string(), VOCAB * WIDTH * F32)];
    for l in 0..LAYERS {
        for (name, bytes) in [
            ("ln_1.weight", WIDTH * F32),
            ("ln_1.bias", WIDTH * F32),
            ("attn.c_attn.weight", 3 * WIDTH * WIDTH * F32),
            ("attn.c_proj.weight", WIDTH * WIDTH * F32),
            ("ln_2.weight", WIDTH * F32),
            ("ln_2.bias", WIDTH * F32),
            ("mlp.c_fc.weight", 4 * WIDTH * WIDTH * F32),
            ("mlp.c_proj.weight", 4 * WIDTH * WIDTH * F32),
        ] {
            p.push((format!("layers.{l}.{name}"), bytes));
        }
    }
    p.extend([("ln_f.weight".to_string(), WIDTH * F32), ("ln_f.bias".to_string(), WIDTH * F32), ("lm_head.weight".to_string(), VOCAB * WIDTH * F32)]);
    p
}

impl TrainingRun {
    /// The run's snapshot, as `torch.cuda.memory._snapshot()` takes it after the last step.
    pub fn snapshot(&self) -> Snapshot {
        let mut r = Recorder::new(self.device);
        // The training tokens went to the GPU before recording began: alive throughout,
        // with no frames.
        r.place("dataset", 12_000_000, "unknown", 0, true);
        r.slots[0].live = true;
        let params = parameters();
        for (name, bytes) in &params {
            // `model.to(device)`: one `_apply` per module down to the parameter's own.
            let depth = name.matches('.').count();
            let module = torch!("nn/modules/module.py");
            let applies = std::iter::once(py("_apply", module, 942)).chain(std::iter::repeat_n(py("_apply", module, 915), depth));
            let python = std::iter::once(py("convert", module, 1343)).chain(applies).chain([py("to", module, 1355)]).chain(main_at(61)).collect();
            r.alloc(name, *bytes, "parameter", op(&TO_DEVICE, python));
        }
        for step in 0..self.steps {
            r.time_us += 3_000;
            let name = format!("step {step}");
            r.annotate(&name, AnnotationStage::Start);
            if step > 0 {
                // optimizer.zero_grad(set_to_none=True)
                r.pace = 4;
                for (p, _) in &params {
                    r.free(&format!("{p}.grad"));
                }
            }
            self.forward(&mut r);
            self.backward(&mut r);
            self.optimizer_step(&mut r, &params, step == 0);
            for t in ["loss", "batch.y", "batch.x"] {
                r.free(t);
            }
            r.annotate(&name, AnnotationStage::End);
        }
        let mut snap = std::mem::take(&mut r.snap);
        snap.segments = r.segments();
        snap.device_traces = vec![Vec::new(); self.device];
        snap.device_traces.push(std::mem::take(&mut r.trace));
        snap
    }

    fn forward(&self, r: &mut Recorder) {
        let tokens = self.batch * CTX;
        let x = tokens * WIDTH * F32;
        let scores = self.batch * HEADS * CTX * CTX * F32;
        r.pace = 150;
        for (t, line) in [("batch.x", 33), ("batch.y", 34)] {
            r.alloc(t, tokens * 8, "input", op(&TO_DEVICE, [vec![py("get_batch", TRAIN, line)], main_at(71)].concat()));
        }
        r.annotate("forward", AnnotationStage::Start);
        r.pace = 45;
        let embedding = [vec![py("embedding", torch!("nn/functional.py"), 2551)], call("forward", torch!("nn/modules/sparse.py"), 190), gpt(114)].concat();
        r.alloc("wte.out", x, "activation", op(&EMBEDDING, embedding));
        for l in 0..LAYERS {
            let t = |s: &str| format!("layers.{l}.{s}");
            let norm = |line| [layer_norm(), block(line)].concat();
            r.alloc(&t("ln_1"), x, "activation", op(&LAYER_NORM, norm(84)));
            r.alloc(&t("ln_1.stats"), 2 * tokens * F32, "activation", op(&LAYER_NORM, norm(84)));
            r.alloc(&t("attn.c_attn"), 3 * x, "activation", op(&LINEAR, [linear(), attn(45)].concat()));
            r.alloc(&t("attn.scores"), scores, "temporary", op(&MATMUL, attn(48)));
            let softmax = [vec![py("softmax", torch!("nn/functional.py"), 2140)], attn(50)].concat();
            r.alloc(&t("attn.probs"), scores, "activation", op(&SOFTMAX, softmax));
            r.free(&t("attn.scores"));
            r.alloc(&t("attn.y"), x, "activation", op(&MATMUL, attn(51)));
            r.alloc(&t("attn.c_proj"), x, "temporary", op(&LINEAR, [linear(), attn(53)].concat()));
            r.alloc(&t("res_1"), x, "activation", op(&ADD, block(84)));
            r.free(&t("attn.c_proj"));
            r.alloc(&t("ln_2"), x, "activation", op(&LAYER_NORM, norm(85)));
            r.alloc(&t("ln_2.stats"), 2 * tokens * F32, "activation", op(&LAYER_NORM, norm(85)));
            r.alloc(&t("mlp.c_fc"), 4 * x, "activation", op(&LINEAR, [linear(), mlp(66)].concat()));
            r.alloc(&t("mlp.gelu"), 4 * x, "activation", op(&GELU, mlp(67)));
            r.alloc(&t("mlp.c_proj"), x, "temporary", op(&LINEAR, [linear(), mlp(68)].concat()));
            r.alloc(&t("res_2"), x, "activation", op(&ADD, block(85)));
            r.free(&t("mlp.c_proj"));
        }
        r.alloc("ln_f", x, "activation", op(&LAYER_NORM, [layer_norm(), gpt(119)].concat()));
        r.alloc("ln_f.stats", 2 * tokens * F32, "activation", op(&LAYER_NORM, [layer_norm(), gpt(119)].concat()));
        let logits = tokens * VOCAB * F32;
        r.alloc("lm_head", logits, "temporary", op(&LINEAR, [linear(), gpt(120)].concat()));
        let cross_entropy = || [vec![py("cross_entropy", torch!("nn/functional.py"), 3494)], gpt(121)].concat();
        r.alloc("loss.log_softmax", logits, "activation", op(&CROSS_ENTROPY, cross_entropy()));
        r.alloc("loss", F32, "activation", op(&NLL_LOSS, cross_entropy()));
        // The logits are no tensor's saved input: gone once forward returns.
        r.free("lm_head");
        r.annotate("forward", AnnotationStage::End);
    }
}

/// ATen's path for each backward op.
const MM_INPUT: [&str; 2] = ["at::_ops::mm::call(at::Tensor const&, at::Tensor const&)", "torch::autograd::generated::details::mm_mat1_backward(at::Tensor const&, at::Tensor const&, c10::ArrayRef<c10::SymInt>, c10::ArrayRef<c10::SymInt>, c10::Layout, c10::Scalar const&)"];
const MM_WEIGHT: [&str; 2] = ["at::_ops::mm::call(at::Tensor const&, at::Tensor const&)", "torch::autograd::generated::details::mm_mat2_backward(at::Tensor const&, at::Tensor const&, c10::ArrayRef<c10::SymInt>, c10::ArrayRef<c10::SymInt>, c10::Layout, c10::Scalar const&)"];
const BMM: [&str; 1] = ["at::_ops::bmm::call(at::Tensor const&, at::Tensor const&)"];
const NORM_BACKWARD: [&str; 2] = ["at::native::layer_norm_backward_cuda(at::Tensor const&, at::Tensor const&, c10::ArrayRef<long>, at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, std::optional<at::Tensor> const&, std::array<bool, 3ul>)", "at::_ops::native_layer_norm_backward::call(at::Tensor const&, at::Tensor const&, c10::ArrayRef<c10::SymInt>, at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, std::optional<at::Tensor> const&, std::array<bool, 3ul>)"];
const GELU_BACKWARD: [&str; 2] = ["at::native::structured_gelu_backward_out_cuda::impl(at::Tensor const&, at::Tensor const&, c10::basic_string_view<char>, at::Tensor const&)", "at::_ops::gelu_backward::call(at::Tensor const&, at::Tensor const&, c10::basic_string_view<char>)"];
const SOFTMAX_BACKWARD: [&str; 2] = ["at::native::structured_softmax_backward_cuda_out::impl(at::Tensor const&, at::Tensor const&, long, c10::ScalarType, at::Tensor const&)", "at::_ops::_softmax_backward_data::call(at::Tensor const&, at::Tensor const&, long, c10::ScalarType)"];
const CAT: [&str; 2] = ["at::native::structured_cat_out_cuda::impl(c10::IListRef<at::Tensor> const&, long, long, bool, bool, bool, c10::MemoryFormat, at::Tensor const&)", "at::_ops::cat::call(c10::IListRef<at::Tensor> const&, long)"];
const NLL_BACKWARD: [&str; 2] = ["at::native::structured_nll_loss_backward_out_cuda::impl(at::Tensor const&, at::Tensor const&, at::Tensor const&, at::OptionalTensorRef, long, long, at::Tensor const&, at::Tensor const&)", "at::_ops::nll_loss_backward::call(at::Tensor const&, at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, long, c10::SymInt, at::Tensor const&)"];
const LOG_SOFTMAX_BACKWARD: [&str; 2] = ["at::native::structured_log_softmax_backward_cuda_out::impl(at::Tensor const&, at::Tensor const&, long, c10::ScalarType, at::Tensor const&)", "at::_ops::_log_softmax_backward_data::call(at::Tensor const&, at::Tensor const&, long, c10::ScalarType)"];
const EMBEDDING_BACKWARD: [&str; 2] = ["at::native::embedding_dense_backward_cuda(at::Tensor const&, at::Tensor const&, long, long, bool)", "at::_ops::embedding_dense_backward::call(at::Tensor const&, at::Tensor const&, c10::SymInt, c10::SymInt, bool)"];
/// The engine summing the two gradients of a residual's input.
const ACCUMULATE: [&str; 2] = ["at::_ops::add_Tensor::call(at::Tensor const&, at::Tensor const&, c10::Scalar const&)", "torch::autograd::InputBuffer::add(unsigned long, at::Tensor&&, std::optional<c10::Stream> const&, std::optional<c10::Stream> const&)"];

impl TrainingRun {
    /// `loss.backward()`: each op's gradients, its saved tensors freed once it has run.
    fn backward(&self, r: &mut Recorder) {
        let tokens = self.batch * CTX;
        let x = tokens * WIDTH * F32;
        let scores = self.batch * HEADS * CTX * CTX * F32;
        let logits = tokens * VOCAB * F32;
        let norm = WIDTH * F32;
        r.annotate("backward", AnnotationStage::Start);
        r.pace = 60;
        // The seed gradient is made on the main thread, in Python.
        let autograd = torch!("autograd/__init__.py");
        let seed = vec![py("_make_grads", autograd, 220), py("backward", autograd, 340), py("backward", torch!("_tensor.py"), 626)];
        r.alloc("grad.loss", F32, "temporary", op(&ONES_LIKE, [seed, main_at(73)].concat()));
        r.grad("grad.loss.log_softmax", logits, "temporary", &NLL_BACKWARD, Some("NllLossBackward0"));
        r.free("grad.loss");
        r.grad("grad.lm_head", logits, "temporary", &LOG_SOFTMAX_BACKWARD, Some("LogSoftmaxBackward0"));
        r.free("grad.loss.log_softmax");
        r.free("loss.log_softmax");
        r.grad("lm_head.weight.grad", VOCAB * WIDTH * F32, "gradient", &MM_WEIGHT, Some("MmBackward0"));
        r.grad("grad.ln_f", x, "temporary", &MM_INPUT, Some("MmBackward0"));
        r.free("grad.lm_head");
        r.free("ln_f");
        let last = format!("layers.{}.res_2", LAYERS - 1);
        r.grad(&format!("grad.{last}"), x, "temporary", &NORM_BACKWARD, Some("NativeLayerNormBackward0"));
        r.grad("ln_f.weight.grad", norm, "gradient", &NORM_BACKWARD, Some("NativeLayerNormBackward0"));
        r.grad("ln_f.bias.grad", norm, "gradient", &NORM_BACKWARD, Some("NativeLayerNormBackward0"));
        r.free("grad.ln_f");
        r.free("ln_f.stats");
        r.free(&last);
        for l in (0..LAYERS).rev() {
            let t = |s: &str| format!("layers.{l}.{s}");
            let g = |s: &str| format!("grad.layers.{l}.{s}");
            let mm = Some("MmBackward0");
            let ln = Some("NativeLayerNormBackward0");
            r.grad(&t("mlp.c_proj.weight.grad"), 4 * WIDTH * WIDTH * F32, "gradient", &MM_WEIGHT, mm);
            r.grad(&g("mlp.gelu"), 4 * x, "temporary", &MM_INPUT, mm);
            r.free(&t("mlp.gelu"));
            r.grad(&g("mlp.c_fc"), 4 * x, "temporary", &GELU_BACKWARD, Some("GeluBackward0"));
            r.free(&g("mlp.gelu"));
            r.free(&t("mlp.c_fc"));
            r.grad(&t("mlp.c_fc.weight.grad"), 4 * WIDTH * WIDTH * F32, "gradient", &MM_WEIGHT, mm);
            r.grad(&g("ln_2"), x, "temporary", &MM_INPUT, mm);
            r.free(&g("mlp.c_fc"));
            r.free(&t("ln_2"));
            r.grad(&g("ln_2.input"), x, "temporary", &NORM_BACKWARD, ln);
            r.grad(&t("ln_2.weight.grad"), norm, "gradient", &NORM_BACKWARD, ln);
            r.grad(&t("ln_2.bias.grad"), norm, "gradient", &NORM_BACKWARD, ln);
            r.free(&g("ln_2"));
            r.free(&t("ln_2.stats"));
            r.grad(&g("res_1"), x, "temporary", &ACCUMULATE, None);
            r.free(&g("res_2"));
            r.free(&g("ln_2.input"));
            r.free(&t("res_1"));
            r.grad(&t("attn.c_proj.weight.grad"), WIDTH * WIDTH * F32, "gradient", &MM_WEIGHT, mm);
            r.grad(&g("attn.y"), x, "temporary", &MM_INPUT, mm);
            r.free(&t("attn.y"));
            r.grad(&g("attn.probs"), scores, "temporary", &BMM, Some("BmmBackward0"));
            r.grad(&g("attn.v"), x, "temporary", &BMM, Some("BmmBackward0"));
            r.free(&g("attn.y"));
            r.grad(&g("attn.scores"), scores, "temporary", &SOFTMAX_BACKWARD, Some("SoftmaxBackward0"));
            r.free(&g("attn.probs"));
            r.free(&t("attn.probs"));
            // q's and k's gradients (from the scores) and v's, back into c_attn's output.
            r.grad(&g("attn.c_attn"), 3 * x, "temporary", &CAT, Some("SplitBackward0"));
            r.free(&g("attn.scores"));
            r.free(&g("attn.v"));
            r.free(&t("attn.c_attn"));
            r.grad(&t("attn.c_attn.weight.grad"), 3 * WIDTH * WIDTH * F32, "gradient", &MM_WEIGHT, mm);
            r.grad(&g("ln_1"), x, "temporary", &MM_INPUT, mm);
            r.free(&g("attn.c_attn"));
            r.free(&t("ln_1"));
            r.grad(&g("ln_1.input"), x, "temporary", &NORM_BACKWARD, ln);
            r.grad(&t("ln_1.weight.grad"), norm, "gradient", &NORM_BACKWARD, ln);
            r.grad(&t("ln_1.bias.grad"), norm, "gradient", &NORM_BACKWARD, ln);
            r.free(&g("ln_1"));
            r.free(&t("ln_1.stats"));
            let below = if l > 0 { format!("layers.{}.res_2", l - 1) } else { "wte.out".into() };
            r.grad(&format!("grad.{below}"), x, "temporary", &ACCUMULATE, None);
            r.free(&g("res_1"));
            r.free(&g("ln_1.input"));
            r.free(&below);
        }
        r.grad("wte.weight.grad", VOCAB * WIDTH * F32, "gradient", &EMBEDDING_BACKWARD, Some("EmbeddingBackward0"));
        r.free("grad.wte.out");
        r.annotate("backward", AnnotationStage::End);
    }

    /// Adam, `foreach`: its state made on the first step, a temporary per parameter on
    /// every step.
    fn optimizer_step(&self, r: &mut Recorder, params: &[(String, u64)], first: bool) {
        let adam = torch!("optim/adam.py");
        r.annotate("optimizer", AnnotationStage::Start);
        r.pace = 30;
        if first {
            for (p, bytes) in params {
                for (state, line) in [("exp_avg", 175), ("exp_avg_sq", 178)] {
                    r.alloc(&format!("{p}.{state}"), *bytes, "optimizer_state", op(&ZEROS_LIKE, adam_step(py("_init_group", adam, line), 236)));
                }
            }
        }
        for (p, bytes) in params {
            let python = [vec![py("_multi_tensor_adam", adam, 589)], adam_step(py("adam", adam, 889), 247)].concat();
            r.alloc(&format!("{p}.exp_avg_sq.sqrt"), *bytes, "temporary", op(&FOREACH_SQRT, python));
        }
        for (p, _) in params {
            r.free(&format!("{p}.exp_avg_sq.sqrt"));
        }
        r.annotate("optimizer", AnnotationStage::End);
    }
}

/// `run` written where `path` says, as `torch.cuda.memory._dump_snapshot` writes it.
pub fn write(run: TrainingRun, path: &Path) -> Snapshot {
    let snap = run.snapshot();
    vramscope_core::snapshot::save_snapshot_atomic(&snap, path).expect("write the training snapshot");
    snap
}
