//! Getting into a job that is already running (`vramscope attach --pid`). gdb loads this
//! library into the job at a safe point and calls `vsh_attach_spawn`, which only starts a
//! thread: nothing runs Python where gdb stopped the job (its interpreter may be halfway
//! through anything). The thread takes the GIL when the interpreter next lets it go and runs
//! vramscope's attach script, which installs the hook as `vramscope py` would have.

use std::ffi::{c_char, c_int, CStr};

type Ensure = unsafe extern "C" fn() -> c_int;
type Release = unsafe extern "C" fn(c_int);
type RunString = unsafe extern "C" fn(*const c_char) -> c_int;
type IsInitialized = unsafe extern "C" fn() -> c_int;

/// A function of the job's interpreter, found among the symbols the process already has
/// (libpython's, or the python executable's own: CPython exports its API either way).
fn python_fn<T: Copy>(name: &CStr) -> Option<T> {
    // SAFETY: dlsym with a NUL-terminated name; the symbol, where found, is CPython's API
    // function of that name, whose signature `T` is.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    (!p.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut libc::c_void, T>(&p) })
}

/// The Python statement that runs the script at `path` in a namespace of its own.
fn run_statement(path: &str) -> String {
    // A JSON string is a valid Python string literal.
    let p = serde_json::to_string(path).expect("a string serialises");
    format!("exec(compile(open({p}).read(), {p}, 'exec'), {{'__name__': '__vramscope_attach__'}})")
}

/// Starts the thread that runs the attach script at `script` (a file path); 0 on success.
/// Returns at once: the job goes on as soon as the debugger leaves.
#[no_mangle]
pub extern "C" fn vsh_attach_spawn(script: *const c_char) -> c_int {
    let r = std::panic::catch_unwind(|| {
        if script.is_null() {
            return -1;
        }
        // SAFETY: the debugger passes a NUL-terminated string it keeps for the call.
        let Ok(path) = unsafe { CStr::from_ptr(script) }.to_str().map(str::to_string) else { return -1 };
        let (Some(initialized), Some(ensure), Some(release), Some(run)) = (
            python_fn::<IsInitialized>(c"Py_IsInitialized"),
            python_fn::<Ensure>(c"PyGILState_Ensure"),
            python_fn::<Release>(c"PyGILState_Release"),
            python_fn::<RunString>(c"PyRun_SimpleString"),
        ) else {
            return -2;
        };
        // SAFETY: CPython's own function, callable from any thread at any time.
        if unsafe { initialized() } == 0 {
            return -3;
        }
        let statement = std::ffi::CString::new(run_statement(&path)).expect("no NUL in a JSON string");
        let spawned = std::thread::Builder::new().name("vramscope-attach".into()).spawn(move || {
            // SAFETY: the GIL is taken before and released after running the statement, as
            // any foreign thread calling into CPython must.
            unsafe {
                let state = ensure();
                // An error is the script's to report (it writes its status file).
                run(statement.as_ptr());
                release(state);
            }
        });
        if spawned.is_ok() {
            0
        } else {
            -4
        }
    });
    r.unwrap_or(-5)
}

type Obj = *mut std::ffi::c_void;

/// The CPython functions `instances_of` calls: C all of them, so none runs Python code.
struct Api {
    call: unsafe extern "C" fn(Obj, Obj) -> Obj,
    list_new: unsafe extern "C" fn(isize) -> Obj,
    list_size: unsafe extern "C" fn(Obj) -> isize,
    list_item: unsafe extern "C" fn(Obj, isize) -> Obj,
    list_append: unsafe extern "C" fn(Obj, Obj) -> c_int,
    list_set: unsafe extern "C" fn(Obj, isize, Obj) -> c_int,
    tuple_size: unsafe extern "C" fn(Obj) -> isize,
    tuple_item: unsafe extern "C" fn(Obj, isize) -> Obj,
    type_of: unsafe extern "C" fn(Obj) -> Obj,
    is_subtype: unsafe extern "C" fn(Obj, Obj) -> c_int,
    decref: unsafe extern "C" fn(Obj),
}

impl Api {
    fn find() -> Option<Api> {
        Some(Api {
            call: python_fn(c"PyObject_CallObject")?,
            list_new: python_fn(c"PyList_New")?,
            list_size: python_fn(c"PyList_Size")?,
            list_item: python_fn(c"PyList_GetItem")?,
            list_append: python_fn(c"PyList_Append")?,
            list_set: python_fn(c"PyList_SetItem")?,
            tuple_size: python_fn(c"PyTuple_Size")?,
            tuple_item: python_fn(c"PyTuple_GetItem")?,
            type_of: python_fn(c"PyObject_Type")?,
            is_subtype: python_fn(c"PyType_IsSubtype")?,
            decref: python_fn(c"Py_DecRef")?,
        })
    }
}

/// For each class of the tuple `classes`, a list of the objects `get_objects()` (the
/// collector's `gc.get_objects`) gives whose type is that class or a subclass of it; NULL,
/// with Python's error set, where a call fails. Called with the GIL held (through
/// `ctypes.PyDLL`).
///
/// Why in C: the list `gc.get_objects()` makes holds a reference to objects another thread
/// of the job is halfway through building, such as the tuple `tuple(generator)` resizes
/// once it has its items, which needs to be the only reference then. Filtered in Python,
/// the interpreter may hand the GIL to that thread while the list lives, and the job dies
/// of a SystemError in `_PyTuple_Resize` (seen in CI's attach test). Here nothing runs
/// Python code from the call until the list is gone: the type checks read the types'
/// MROs, never `__class__`, and every list the result needs is made before the call (a
/// new container could start a collection, and its finalizers are Python code).
#[no_mangle]
pub extern "C" fn vsh_instances_of(get_objects: Obj, classes: Obj) -> Obj {
    std::panic::catch_unwind(|| {
        let api = Api::find()?;
        // SAFETY: CPython's API, called with the GIL held (the caller's `PyDLL`) on the
        // objects the caller passed; borrowed references are used while their owner lives,
        // and each new one is released once.
        unsafe {
            let n = (api.tuple_size)(classes);
            if n < 0 {
                return None;
            }
            let out = (api.list_new)(n);
            if out.is_null() {
                return None;
            }
            let mut found = Vec::with_capacity(n as usize);
            for k in 0..n {
                let list = (api.list_new)(0);
                if list.is_null() {
                    (api.decref)(out);
                    return None;
                }
                found.push(list);
                (api.list_set)(out, k, list); // `out` owns the list from here

            }
            let all = (api.call)(get_objects, std::ptr::null_mut());
            if all.is_null() {
                (api.decref)(out);
                return None;
            }
            let mut failed = false;
            for i in 0..(api.list_size)(all).max(0) {
                let item = (api.list_item)(all, i);
                let ty = (api.type_of)(item);
                for (k, list) in found.iter().enumerate() {
                    let class = (api.tuple_item)(classes, k as isize);
                    if !class.is_null() && (api.is_subtype)(ty, class) != 0 {
                        failed |= (api.list_append)(*list, item) != 0;
                    }
                }
                (api.decref)(ty);
            }
            (api.decref)(all);
            if failed {
                (api.decref)(out);
                return None;
            }
            Some(out)
        }
    })
    .ok()
    .flatten()
    .unwrap_or(std::ptr::null_mut())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_statement_quotes_any_path() {
        assert_eq!(
            run_statement("/tmp/a'b\"c.py"),
            r#"exec(compile(open("/tmp/a'b\"c.py").read(), "/tmp/a'b\"c.py", 'exec'), {'__name__': '__vramscope_attach__'})"#
        );
    }
}
