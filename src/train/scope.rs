//! Module scopes (`layers.7.attn`) tagged onto every allocation. The model enters a scope
//! around each submodule's forward; the shim stamps the current id on each event.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use crate::capture;

/// Id 0 is "no module".
pub const NO_SCOPE: u32 = 0;

pub struct Scopes {
    ids: RefCell<HashMap<String, u32>>,
    names: RefCell<Vec<String>>,
    /// Names not yet sent to consumers.
    unsent: RefCell<Vec<(u32, String)>>,
    current: Cell<u32>,
}

impl Default for Scopes {
    fn default() -> Self {
        Scopes {
            ids: RefCell::new(HashMap::from([(String::new(), NO_SCOPE)])),
            names: RefCell::new(vec![String::new()]),
            unsent: RefCell::new(Vec::new()),
            current: Cell::new(NO_SCOPE),
        }
    }
}

impl Scopes {
    pub fn intern(&self, name: &str) -> u32 {
        if let Some(id) = self.ids.borrow().get(name) {
            return *id;
        }
        let mut names = self.names.borrow_mut();
        let id = names.len() as u32;
        names.push(name.to_string());
        self.ids.borrow_mut().insert(name.to_string(), id);
        self.unsent.borrow_mut().push((id, name.to_string()));
        id
    }

    /// Number of scope ids handed out (id 0, "no module", included, so never zero).
    pub fn count(&self) -> usize {
        self.names.borrow().len()
    }

    pub fn name(&self, id: u32) -> String {
        self.names.borrow().get(id as usize).cloned().unwrap_or_default()
    }

    pub fn take_unsent(&self) -> Vec<(u32, String)> {
        std::mem::take(&mut *self.unsent.borrow_mut())
    }

    /// Enters `id` until the guard drops (scopes nest; the previous one comes back).
    pub fn enter(&self, id: u32) -> ScopeGuard<'_> {
        let prev = self.current.replace(id);
        capture::set_scope(id);
        ScopeGuard { scopes: self, prev }
    }

    pub fn current(&self) -> u32 {
        self.current.get()
    }
}

pub struct ScopeGuard<'a> {
    scopes: &'a Scopes,
    prev: u32,
}

impl Drop for ScopeGuard<'_> {
    fn drop(&mut self) {
        self.scopes.current.set(self.prev);
        capture::set_scope(self.prev);
    }
}
