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
