//! Module scopes (`layers.7.attn`) and allocation names (`layers.0.attn.q.weight`), interned
//! to ids the capture shim stamps on every event. The training code enters a scope around
//! each submodule's forward; the session sends new names to viewers with the next batch.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

/// Id 0 is "no module".
pub const NO_SCOPE: u32 = 0;

/// Tells the capture shim the scope now in effect.
pub type SetScope = Box<dyn Fn(u32) + Send + Sync>;

struct Names {
    ids: HashMap<String, u32>,
    names: Vec<String>,
    /// Names not yet sent to consumers.
    unsent: Vec<(u32, String)>,
}

pub struct Scopes {
    names: Mutex<Names>,
    current: AtomicU32,
    set: SetScope,
}

impl Scopes {
    pub fn new(set: SetScope) -> Scopes {
        Scopes {
            names: Mutex::new(Names { ids: HashMap::from([(String::new(), NO_SCOPE)]), names: vec![String::new()], unsent: Vec::new() }),
            current: AtomicU32::new(NO_SCOPE),
            set,
        }
    }

    fn names(&self) -> std::sync::MutexGuard<'_, Names> {
        self.names.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn intern(&self, name: &str) -> u32 {
        let mut n = self.names();
        if let Some(id) = n.ids.get(name) {
            return *id;
        }
        let id = n.names.len() as u32;
        n.names.push(name.to_string());
        n.ids.insert(name.to_string(), id);
        n.unsent.push((id, name.to_string()));
        id
    }

    /// Number of scope ids handed out (id 0, "no module", included, so never zero).
    pub fn count(&self) -> usize {
        self.names().names.len()
    }

    pub fn name(&self, id: u32) -> String {
        self.names().names.get(id as usize).cloned().unwrap_or_default()
    }

    /// Every name with its id, for a viewer that attaches mid-run.
    pub fn all(&self) -> Vec<(u32, String)> {
        self.names().names.iter().enumerate().skip(1).map(|(i, n)| (i as u32, n.clone())).collect()
    }

    pub fn take_unsent(&self) -> Vec<(u32, String)> {
        std::mem::take(&mut self.names().unsent)
    }

    /// Makes `id` the scope in effect; returns the one it replaces.
    pub fn set(&self, id: u32) -> u32 {
        let prev = self.current.swap(id, Ordering::Relaxed);
        (self.set)(id);
        prev
    }

    /// Enters `id` until the guard drops (scopes nest; the previous one comes back).
    pub fn enter(&self, id: u32) -> ScopeGuard<'_> {
        ScopeGuard { scopes: self, prev: self.set(id) }
    }

    pub fn current(&self) -> u32 {
        self.current.load(Ordering::Relaxed)
    }
}

pub struct ScopeGuard<'a> {
    scopes: &'a Scopes,
    prev: u32,
}

impl Drop for ScopeGuard<'_> {
    fn drop(&mut self) {
        self.scopes.set(self.prev);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn scopes_nest_and_tell_the_shim() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        let s = Scopes::new(Box::new(move |id| s2.lock().unwrap().push(id)));
        let a = s.intern("layers.0");
        assert_eq!(s.intern("layers.0"), a, "interned once");
        let b = s.intern("layers.0.attn");
        {
            let _g = s.enter(a);
            let _h = s.enter(b);
            assert_eq!(s.current(), b);
        }
        assert_eq!(s.current(), NO_SCOPE);
        assert_eq!(*seen.lock().unwrap(), vec![a, b, a, NO_SCOPE]);
        assert_eq!(s.take_unsent(), vec![(a, "layers.0".into()), (b, "layers.0.attn".into())]);
        assert!(s.take_unsent().is_empty());
        assert_eq!(s.all().len(), 2);
    }
}
