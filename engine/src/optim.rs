//! AdamW written out, so the loop knows each state tensor's address: its moments are
//! exactly the "optimizer state" category. Two allocation patterns, one update rule:
//!
//! - `Optimizer::Reference`, the CS336 reference's (`cs336-basics` optimizer.py): every step
//!   builds new `m` and `v` tensors from temporaries, so a parameter's old and new moments
//!   coexist, and the old ones are freed only when the next parameter's moments take their
//!   place in its locals. It also makes a `zeros_like` per moment per step (the default
//!   argument of its `state.get`), freed at once when the state already exists.
//! - `Optimizer::Torch`, `torch.optim.AdamW`'s: moments updated in place, made once.

use tch::Tensor;

use vramscope_core::step_config::Optimizer;

pub struct AdamW {
    lr: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
    /// Steps taken (the same for every parameter: all of them have gradients each step).
    steps: i32,
    /// (first moment, second moment) per parameter, from its first step on.
    state: Vec<Option<(Tensor, Tensor)>>,
}

impl AdamW {
    pub fn new(lr: f64, beta1: f64, beta2: f64, eps: f64, weight_decay: f64) -> AdamW {
        AdamW { lr, beta1, beta2, eps, weight_decay, steps: 0, state: Vec::new() }
    }

    /// One update of every parameter that has a gradient. Call under `tch::no_grad`.
    pub fn step(&mut self, params: &[&Tensor], variant: Optimizer) {
        self.steps += 1;
        if self.state.len() != params.len() {
            self.state = params.iter().map(|_| None).collect();
        }
        match variant {
            Optimizer::Reference => self.step_reference(params),
            Optimizer::Torch => self.step_in_place(params),
        }
    }

    fn step_reference(&mut self, params: &[&Tensor]) {
        let (b1, b2, t) = (self.beta1, self.beta2, self.steps);
        let step_size = self.lr * (1.0 - b2.powi(t)).sqrt() / (1.0 - b1.powi(t));
        // The reference's `prev_m_t` / `prev_v_t`: each holds the moment it read until the
        // next parameter's read replaces it.
        let (mut prev_m, mut prev_v): (Option<Tensor>, Option<Tensor>) = (None, None);
        for (i, p) in params.iter().enumerate() {
            let g = p.grad();
            if !g.defined() {
                continue;
            }
            let mut data = p.shallow_clone();
            let decay = data.g_mul_scalar(self.lr * self.weight_decay);
            let _ = data.g_sub_(&decay);
            drop(decay);
            prev_m = Some(state_or_zeros(&g, self.state[i].as_ref().map(|(m, _)| m)));
            prev_v = Some(state_or_zeros(&g, self.state[i].as_ref().map(|(_, v)| v)));
            let (old_m, old_v) = (prev_m.as_ref().expect("just set"), prev_v.as_ref().expect("just set"));
            let a = old_m.g_mul_scalar(b1);
            let c = g.g_mul_scalar(1.0 - b1);
            let m = &a + &c;
            drop(a);
            drop(c);
            let a = old_v.g_mul_scalar(b2);
            let sq = g.square();
            let c = sq.g_mul_scalar(1.0 - b2);
            drop(sq);
            let v = &a + &c;
            drop(a);
            drop(c);
            let scaled = m.g_mul_scalar(step_size);
            let root = v.sqrt();
            let denom = root.g_add_scalar(self.eps);
            drop(root);
            let update = &scaled / &denom;
            drop(scaled);
            drop(denom);
            let _ = data.g_sub_(&update);
            drop(update);
            // The old moments live on in prev_m / prev_v.
            self.state[i] = Some((m, v));
        }
        // The last parameter's old moments go when the step returns.
        drop(prev_m);
        drop(prev_v);
    }

    fn step_in_place(&mut self, params: &[&Tensor]) {
        for (p, s) in params.iter().zip(self.state.iter_mut()) {
            if s.is_none() {
                *s = Some((p.zeros_like(), p.zeros_like()));
            }
        }
        let t = self.steps;
        let bc1 = 1.0 - self.beta1.powi(t);
        let bc2 = 1.0 - self.beta2.powi(t);
        let step_size = self.lr * bc2.sqrt() / bc1;
        for (p, (m, v)) in params.iter().zip(self.state.iter_mut().flatten()) {
            let g = p.grad();
            if !g.defined() {
                continue;
            }
            let mut p = p.shallow_clone();
            let _ = m.g_mul_scalar_(self.beta1).g_add_(&(&g * (1.0 - self.beta1)));
            let _ = v.g_mul_scalar_(self.beta2).g_add_(&(g.square() * (1.0 - self.beta2)));
            let update = &*m / (v.sqrt() + self.eps) * step_size;
            let _ = p.g_sub_(&update);
            let _ = p.g_mul_scalar_(1.0 - self.lr * self.weight_decay);
        }
    }

    /// Each parameter's index and the addresses of its two moments (none before its first
    /// step).
    pub fn state_ptrs(&self) -> Vec<(usize, u64, u64)> {
        let moments = self.state.iter().enumerate().filter_map(|(i, s)| s.as_ref().map(|(m, v)| (i, m, v)));
        moments.map(|(i, m, v)| (i, m.data_ptr() as u64, v.data_ptr() as u64)).collect()
    }
}

/// The reference's `state.get("m", torch.zeros_like(grad))`: the zeros are made whether or
/// not the state has the moment, and freed at once when it does.
fn state_or_zeros(g: &Tensor, state: Option<&Tensor>) -> Tensor {
    let zeros = g.zeros_like();
    match state {
        Some(t) => {
            drop(zeros);
            t.shallow_clone()
        }
        None => zeros,
    }
}
