//! AdamW written out (as CS336 has students do), so the loop knows each state tensor's
//! address: its moments are exactly the "optimizer state" category.

use tch::Tensor;

pub struct AdamW {
    lr: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
    steps: i32,
    /// (first moment, second moment) per parameter, made on the first step.
    state: Vec<(Tensor, Tensor)>,
}

impl AdamW {
    pub fn new(lr: f64, beta1: f64, beta2: f64, eps: f64, weight_decay: f64) -> AdamW {
        AdamW { lr, beta1, beta2, eps, weight_decay, steps: 0, state: Vec::new() }
    }

    /// One update of every parameter that has a gradient. Call under `tch::no_grad`.
    pub fn step(&mut self, params: &[&Tensor]) {
        if self.state.is_empty() {
            self.state = params.iter().map(|p| (p.zeros_like(), p.zeros_like())).collect();
        }
        self.steps += 1;
        let bc1 = 1.0 - self.beta1.powi(self.steps);
        let bc2 = 1.0 - self.beta2.powi(self.steps);
        let step_size = self.lr * bc2.sqrt() / bc1;
        for (p, (m, v)) in params.iter().zip(self.state.iter_mut()) {
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

    /// Addresses of each parameter's two moments, in parameter order (empty before the
    /// first step).
    pub fn state_ptrs(&self) -> Vec<(u64, u64)> {
        self.state.iter().map(|(m, v)| (m.data_ptr() as u64, v.data_ptr() as u64)).collect()
    }
}
