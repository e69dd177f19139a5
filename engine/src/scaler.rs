//! `torch.amp.GradScaler` with its defaults (torch/amp/grad_scaler.py), for fp16: the loss is
//! scaled before backward; the gradients are unscaled in place and checked, and the
//! optimizer skips the step when one holds an inf or NaN; then the scale grows or backs off.
//! Its memory is what PyTorch's is: the scale and growth tracker (one element each, made at
//! the first scaled loss, kept), the scaled loss, and during the step `found_inf` and the
//! inverse scale (`scale.double().reciprocal().float()`).

use tch::{Device, Kind, Tensor};

use crate::capture;

const INIT_SCALE: f64 = 65536.0;
const GROWTH_FACTOR: f64 = 2.0;
const BACKOFF_FACTOR: f64 = 0.5;
const GROWTH_INTERVAL: i64 = 2000;

#[derive(Default)]
pub struct GradScaler {
    /// (scale, growth tracker), from the first `scale` on.
    state: Option<(Tensor, Tensor)>,
}

impl GradScaler {
    /// `scaler.scale(loss)`: the loss times the scale, a new tensor.
    pub fn scale(&mut self, loss: &Tensor, device: Device) -> Tensor {
        let (scale, _) = self.state.get_or_insert_with(|| {
            (Tensor::full([] as [i64; 0], INIT_SCALE, (Kind::Float, device)), Tensor::zeros([] as [i64; 0], (Kind::Int, device)))
        });
        loss * &*scale
    }

    /// The scale and growth tracker, once made: to name them.
    pub fn tensors(&self) -> Option<(&Tensor, &Tensor)> {
        self.state.as_ref().map(|(s, g)| (s, g))
    }

    /// `scaler.step(optimizer)` then `scaler.update()`: unscales `grads` in place, runs
    /// `step` unless one holds an inf or NaN, and updates the scale. Returns whether the
    /// optimizer stepped.
    pub fn step_and_update(&mut self, grads: &[Tensor], step: impl FnOnce()) -> bool {
        let Some((scale, growth)) = self.state.as_mut() else {
            step();
            return true;
        };
        // unscale_: the inverse scale first, each temporary gone once the next is made.
        let double = scale.to_kind(Kind::Double);
        let reciprocal = double.reciprocal();
        drop(double);
        let inv_scale = reciprocal.to_kind(Kind::Float);
        drop(reciprocal);
        let found_inf = Tensor::zeros([] as [i64; 0], (Kind::Float, scale.device()));
        capture::amp_unscale(grads, &found_inf, &inv_scale).expect("unscale the gradients");
        drop(inv_scale);
        let stepped = found_inf.double_value(&[]) == 0.0;
        if stepped {
            step();
        }
        let _ = scale.internal_amp_update_scale_(growth, &found_inf, GROWTH_FACTOR, BACKOFF_FACTOR, GROWTH_INTERVAL);
        stepped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inf_gradient_skips_the_step_and_halves_the_scale() {
        let mut s = GradScaler::default();
        let loss = Tensor::from(2.0f32);
        assert_eq!(s.scale(&loss, Device::Cpu).double_value(&[]), 2.0 * INIT_SCALE);
        let grads = [Tensor::from_slice(&[INIT_SCALE as f32, 2.0 * INIT_SCALE as f32])];
        let mut ran = false;
        assert!(s.step_and_update(&grads, || ran = true));
        assert!(ran, "finite gradients step");
        assert_eq!(Vec::<f32>::try_from(&grads[0]).unwrap(), [1.0, 2.0], "unscaled in place");
        let bad = [Tensor::from_slice(&[f32::INFINITY])];
        let mut ran = false;
        assert!(!s.step_and_update(&bad, || ran = true));
        assert!(!ran, "an inf skips the optimizer");
        assert_eq!(s.tensors().unwrap().0.double_value(&[]), INIT_SCALE * BACKOFF_FACTOR);
    }
}
