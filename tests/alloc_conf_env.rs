//! The allocator settings a process would run with, read from its environment the way
//! PyTorch reads them, and written into a snapshot as PyTorch writes them. (Its own test
//! binary: it changes environment variables, which no other test may read meanwhile.)

mod common;

use vramscope_core::allocator::AllocatorConfig;

#[test]
fn settings_come_from_the_environment_and_are_recorded_as_pytorch_records_them() {
    if common::skip_without_real_snapshots() {
        return;
    }
    const CUDA: &str = "PYTORCH_CUDA_ALLOC_CONF";
    const ANY: &str = "PYTORCH_ALLOC_CONF";
    std::env::remove_var(CUDA);
    std::env::remove_var(ANY);
    assert_eq!(AllocatorConfig::from_env().unwrap(), AllocatorConfig::default());

    std::env::set_var(CUDA, "expandable_segments:True");
    let cfg = AllocatorConfig::from_env().unwrap();
    assert!(cfg.expandable_segments);
    // PyTorch wrote this fixture's settings under the same variable: every key it has
    // is what the settings dict built from the config says.
    let recorded = common::load(common::CONSTRUCTOR_SUN).allocator_settings.unwrap();
    let ours = cfg.to_settings();
    for (key, value) in &recorded.entries {
        assert_eq!(ours.get(key), Some(value), "{key}");
    }
    // Newer PyTorch (MAGMA27's file) writes one more key, for its defaults.
    let recorded = common::load(common::MAGMA27).allocator_settings.unwrap();
    assert_eq!(AllocatorConfig::default().to_settings().entries, recorded.entries);

    // The CUDA-specific variable wins; the generic one is read when it is unset.
    std::env::set_var(ANY, "max_split_size_mb:128");
    assert_eq!(AllocatorConfig::from_env().unwrap().max_split_size, None);
    std::env::remove_var(CUDA);
    assert_eq!(AllocatorConfig::from_env().unwrap().max_split_size, Some(128 << 20));

    std::env::set_var(ANY, "garbage_collection_threshold:2");
    let e = AllocatorConfig::from_env().unwrap_err();
    assert_eq!(e, "PYTORCH_ALLOC_CONF: bad value `2` for garbage_collection_threshold: must be between 0.0 and 1.0");
    std::env::remove_var(ANY);
}
