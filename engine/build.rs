//! Builds the C++ capture shim against the libtorch that torch-sys found, and makes the
//! binary find libtorch at run time (rpath) with libtorch_cuda kept linked so CUDA
//! registers on GPU machines.
use std::env;
use std::path::{Path, PathBuf};

fn main() {
    let lib = PathBuf::from(
        env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys did not report its libtorch lib dir"),
    );
    let root = lib.parent().expect("libtorch lib dir has a parent").to_path_buf();
    let has_torch_cuda = lib.join("libtorch_cuda.so").exists();
    let cuda_include = cuda_include_dir(&root);
    let with_cuda = has_torch_cuda && cuda_include.is_some();
    if env::var("VRAMSCOPE_REQUIRE_CUDA").is_ok_and(|v| v == "1") && !with_cuda {
        panic!(
            "VRAMSCOPE_REQUIRE_CUDA=1 but the CUDA capture cannot be compiled: libtorch_cuda.so {}, CUDA headers {}",
            if has_torch_cuda { "found" } else { "missing" },
            match &cuda_include { Some(p) => p.display().to_string(), None => "missing (pip install nvidia-cuda-crt)".into() }
        );
    }
    if has_torch_cuda && !with_cuda {
        println!("cargo:warning=CUDA headers not found next to {}: building without CUDA capture", root.display());
    }

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++20")
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .include(root.join("include"))
        .include(root.join("include/torch/csrc/api/include"))
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        .file("../python/vramscope_hook/csrc/capture_cpu.cpp")
        .file("../python/vramscope_hook/csrc/capture_cuda.cpp")
        .file("../python/vramscope_hook/csrc/autocast_policy.cpp");
    if let Some(inc) = &cuda_include {
        if with_cuda {
            build.define("VS_WITH_CUDA", None).include(inc);
        }
    }
    build.compile("vramscope_capture");

    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=c10");
    println!("cargo:rustc-link-lib=torch_cpu");
    if with_cuda {
        println!("cargo:rustc-link-lib=c10_cuda");
    }
    if has_torch_cuda {
        // --as-needed would drop libtorch_cuda (nothing of ours calls into it directly
        // without VS_WITH_CUDA), and then CUDA never registers with libtorch.
        println!("cargo:rustc-link-arg=-Wl,--push-state,--no-as-needed,-ltorch_cuda,--pop-state");
    }
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());

    for f in ["../python/vramscope_hook/csrc/capture.h", "../python/vramscope_hook/csrc/capture_cpu.cpp", "../python/vramscope_hook/csrc/capture_cuda.cpp", "../python/vramscope_hook/csrc/autocast_policy.cpp"] {
        println!("cargo:rerun-if-changed={f}");
    }
    println!("cargo:rerun-if-env-changed=VRAMSCOPE_REQUIRE_CUDA");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
}

/// CUDA headers: the pip wheels' (`nvidia/cu13/include` beside torch, needing
/// nvidia-cuda-crt too), else a CUDA toolkit's.
fn cuda_include_dir(torch_root: &Path) -> Option<PathBuf> {
    // The torch dir may be reached through the .libtorch link; its wheel neighbours sit
    // beside the real directory.
    let real = torch_root.canonicalize().ok()?;
    let site = real.parent()?;
    let mut candidates = vec![
        site.join("nvidia/cu13/include"),
        site.join("nvidia/cuda_runtime/include"),
    ];
    if let Ok(home) = env::var("CUDA_HOME") {
        candidates.push(PathBuf::from(home).join("include"));
    }
    candidates.push(PathBuf::from("/usr/local/cuda/include"));
    candidates
        .into_iter()
        .find(|d| d.join("cuda_runtime_api.h").exists() && d.join("crt/host_config.h").exists())
}
